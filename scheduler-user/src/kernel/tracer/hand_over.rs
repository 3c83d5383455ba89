//! The hand-over of maps: the maps that other parts of abissd own from the start on are taken
//! out of the loaded object here, by their names in `scheduler_common::names`, and handed over
//! typed, so that no other module names a map or knows its key and value types.

use aya::maps::{HashMap, Map, MapData, PerCpuArray, RingBuf};
use scheduler_common::names::map;
use scheduler_common::{RaiseCounts, RaisedThread};

use super::reader_sweep::{ReaderMaps, ReaderSweep};
use super::{BlockTracer, TracerError};

/// The maps of the reader raises (`crate::raise`), typed.
pub(crate) struct RaiseMaps {
    /// The ring of tasks raised threads make.
    pub(crate) forks: RingBuf<MapData>,
    /// Raised threads and the tasks they made, by thread id.
    pub(crate) raised: HashMap<MapData, u32, RaisedThread>,
    /// What the programs counted of each raise, by the raised thread's id.
    pub(crate) counts: HashMap<MapData, u32, RaiseCounts>,
    /// I/O contexts of raised threads, to the thread.
    pub(crate) contexts: HashMap<MapData, u64, u32>,
    /// Tasks of raised threads the fork ring had no room for, per CPU.
    pub(crate) lost: PerCpuArray<MapData, u64>,
}

impl BlockTracer {
    /// Takes map `name` out of the object (once), for its own owner.
    fn take_map(&mut self, name: &'static str) -> Result<aya::maps::Map, TracerError> {
        self.ebpf
            .take_map(name)
            .ok_or(TracerError::MissingMap { name })
    }

    /// Takes ring buffer `name` (once).
    fn take_ring(&mut self, name: &'static str) -> Result<RingBuf<MapData>, TracerError> {
        RingBuf::try_from(self.take_map(name)?).map_err(|source| TracerError::Map { name, source })
    }

    /// Takes the ring buffer that carries per-request events (once).
    pub(crate) fn take_event_ring(&mut self) -> Result<RingBuf<MapData>, TracerError> {
        self.take_ring(map::EVENTS)
    }

    /// Takes the ring buffer that carries reads of attached files (once).
    pub(crate) fn take_playout_ring(&mut self) -> Result<RingBuf<MapData>, TracerError> {
        self.take_ring(map::PLAYOUT)
    }

    /// Takes the maps of the reader raises (once).
    pub(crate) fn take_raise_maps(&mut self) -> Result<RaiseMaps, TracerError> {
        let typed = |name: &'static str| move |source| TracerError::Map { name, source };
        Ok(RaiseMaps {
            forks: self.take_ring(map::FORKS)?,
            raised: HashMap::try_from(self.take_map(map::RAISED)?).map_err(typed(map::RAISED))?,
            counts: HashMap::try_from(self.take_map(map::RAISE_COUNTS)?)
                .map_err(typed(map::RAISE_COUNTS))?,
            contexts: HashMap::try_from(self.take_map(map::RAISED_CONTEXTS)?)
                .map_err(typed(map::RAISED_CONTEXTS))?,
            lost: PerCpuArray::try_from(self.take_map(map::FORK_LOST)?)
                .map_err(typed(map::FORK_LOST))?,
        })
    }
}

/// Starts the thread that sweeps out followed readers that are gone, with handles of its own to
/// their maps in `ebpf`.
pub(super) fn start_reader_sweep(ebpf: &aya::Ebpf) -> Result<ReaderSweep, TracerError> {
    let maps = ReaderMaps {
        readers: second_hash(ebpf, map::FILE_READERS)?,
        added: second_hash(ebpf, map::READER_USERS)?,
        given: second_hash(ebpf, map::READER_GIVEN)?,
    };
    ReaderSweep::start(maps).map_err(|source| TracerError::Thread { source })
}

/// A second handle to hash map `name` of `ebpf`, opened by its id, for a thread of its own.
fn second_hash<K: aya::Pod, V: aya::Pod>(
    ebpf: &aya::Ebpf,
    name: &'static str,
) -> Result<HashMap<MapData, K, V>, TracerError> {
    let typed = |source| TracerError::Map { name, source };
    let Some(Map::HashMap(data)) = ebpf.map(name) else {
        return Err(TracerError::MissingMap { name });
    };
    let id = data.info().map_err(typed)?.id();
    HashMap::try_from(Map::HashMap(MapData::from_id(id).map_err(typed)?)).map_err(typed)
}
