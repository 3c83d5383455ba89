//! Loads, attaches and reads the block-layer tracing programs.

mod hand_over;
mod histograms;
#[cfg(test)]
mod names_tests;
mod reader_sweep;
mod uring;

use std::collections::BTreeMap;
use std::path::Path;

use abiss_proto::{Capability, DeviceNumber};
use aya::{
    maps::{Array, HashMap, MapData, MapError},
    programs::{tp_btf::BtfTracePointLinkId, BtfTracePoint, ProgramError},
    Btf, Ebpf, EbpfError, EbpfLoader,
};
use scheduler_common::{
    disk_flags, AttachedFile, Control, FileKey, HistogramKey, InflightRequest, KernelLayout,
    LatencyCounters, RequestOrigin,
};

use crate::kernel::capabilities::Feature;
use reader_sweep::ReaderSweep;
use scheduler_common::names::{map, program};

/// The most keys one emptying of a map walks: twice the largest map it empties.
const FORGET_STEPS: usize = 2 * scheduler_common::MAX_RAISED as usize;

/// The compiled eBPF object, built by build.rs from `scheduler-ebpf`.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/abiss.bpf.o"));

/// The required programs, the block layer's, and the kernel tracepoints they attach to. The
/// optional ones are listed by `Feature::programs`.
const BLOCK_PROGRAMS: [(&str, &str); 5] = [
    (program::INSERT, "block_rq_insert"),
    (program::ISSUE, "block_rq_issue"),
    (program::COMPLETE, "block_rq_complete"),
    (program::MERGE, "block_rq_merge"),
    (program::REQUEUE, "block_rq_requeue"),
];

/// The program that follows the new tasks of raised threads (`crate::raise`), required
/// too: a daemon that raises threads must see what they make.
const FORK_PROGRAM: (&str, &str) = (program::FORK, "sched_process_fork");

/// Failures to load, attach or read the programs.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TracerError {
    /// The kernel BTF could not be read by the loader.
    #[error("cannot read the kernel BTF: {source}")]
    Btf {
        /// Loader error.
        #[source]
        source: aya::BtfError,
    },
    /// The object could not be loaded (verifier, missing kernel support).
    #[error("the kernel refused the eBPF object: {source}")]
    Load {
        /// Loader error.
        #[source]
        source: EbpfError,
    },
    /// A program could not be loaded or attached.
    #[error("cannot attach {program} to {tracepoint}: {source}")]
    Attach {
        /// Program name.
        program: &'static str,
        /// Tracepoint name.
        tracepoint: &'static str,
        /// Kernel error.
        #[source]
        source: ProgramError,
    },
    /// A program could not be detached.
    #[error("cannot detach {program}: {source}")]
    Detach {
        /// Program name.
        program: &'static str,
        /// Kernel error.
        #[source]
        source: ProgramError,
    },
    /// A map is missing from the object or has another type.
    #[error("eBPF map {name} is missing or malformed")]
    MissingMap {
        /// Map name.
        name: &'static str,
    },
    /// A map operation failed.
    #[error("eBPF map {name}: {source}")]
    Map {
        /// Map name.
        name: &'static str,
        /// Kernel error.
        #[source]
        source: MapError,
    },
    /// A thread of the tracer could not start.
    #[error("cannot start a thread of the tracer: {source}")]
    Thread {
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A loaded program, and its link while it is attached. Each program is attached only while
/// it has something to do, so an idle abissd costs the kernel's tracepoints nothing (a
/// tracepoint without a program is a patched-out branch): the block programs while some disk
/// is followed (managed, or traced for a client), the fork program while some thread is
/// raised, the others while some file is attached.
#[derive(Debug)]
struct Hook {
    program: &'static str,
    tracepoint: &'static str,
    work: Work,
    link: Option<BtfTracePointLinkId>,
}

/// What a program waits for before it is attached: a followed disk (the block programs), an
/// attached file (page cache), a process seen reading an attached file (`io_uring`: until
/// then its programs would only cost every `io_uring` request on the machine a lookup), a
/// raised thread (the fork program).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    Disks,
    Files,
    Readers,
    Raised,
}

/// The program `name` of `ebpf`, as the BTF tracepoint program it is.
fn tracepoint_program<'a>(
    ebpf: &'a mut Ebpf,
    program: &'static str,
    tracepoint: &'static str,
) -> Result<&'a mut BtfTracePoint, TracerError> {
    ebpf.program_mut(program)
        .ok_or(TracerError::MissingMap { name: program })?
        .try_into()
        .map_err(|source| TracerError::Attach {
            program,
            tracepoint,
            source,
        })
}

/// Loads `program` and attaches it to `tracepoint` (so a kernel that refuses it is known at
/// start); its name and kernel id, and the hook with its link.
fn attach(
    ebpf: &mut Ebpf,
    btf: &Btf,
    (program, tracepoint): (&'static str, &'static str),
    work: Work,
) -> Result<((String, u32), Hook), TracerError> {
    let attach_error = |source| TracerError::Attach {
        program,
        tracepoint,
        source,
    };
    let prog = tracepoint_program(ebpf, program, tracepoint)?;
    prog.load(tracepoint, btf).map_err(attach_error)?;
    let link = prog.attach().map_err(attach_error)?;
    let id = prog.info().map_err(attach_error)?.id();
    let hook = Hook {
        program,
        tracepoint,
        work,
        link: Some(link),
    };
    Ok(((program.to_owned(), id), hook))
}

/// The object and the lists an optional part's programs are attached into.
struct Part<'a> {
    ebpf: &'a mut Ebpf,
    btf: &'a Btf,
    program_ids: &'a mut Vec<(String, u32)>,
    hooks: &'a mut Vec<Hook>,
}

impl Part<'_> {
    /// Attaches `programs`, all or none: on the first refusal, what did attach goes again
    /// and the kernel's reason is returned.
    fn attach(
        &mut self,
        programs: &[(&'static str, &'static str)],
        work: Work,
    ) -> Result<(), String> {
        for &pair in programs {
            match attach(self.ebpf, self.btf, pair, work) {
                Ok((id, hook)) => {
                    self.program_ids.push(id);
                    self.hooks.push(hook);
                }
                Err(error) => {
                    for (program, _) in programs {
                        self.program_ids.retain(|(name, _)| name != program);
                        self.hooks.retain(|hook| hook.program != *program);
                        if let Some(prog) = self.ebpf.program_mut(program) {
                            let _ = <&mut BtfTracePoint>::try_from(prog).map(BtfTracePoint::unload);
                        }
                    }
                    return Err(error.to_string());
                }
            }
        }
        Ok(())
    }
}

/// The loaded tracer. Dropping it detaches and unloads everything.
/// The kernel's BTF at a path, parsed for the loader on a thread of its own: the layout's
/// parse of the same 6 MB ([`crate::kernel::layout::resolve`]) and the disks taken meanwhile
/// need not wait for it (it was a tenth of abissd's start in the tests' debug build).
pub(crate) struct LoaderBtf(std::thread::JoinHandle<Result<Btf, aya::BtfError>>);

impl LoaderBtf {
    pub(crate) fn parse_aside(path: &Path) -> Self {
        let path = path.to_path_buf();
        Self(std::thread::spawn(move || {
            Btf::parse_file(&path, aya::Endianness::default())
        }))
    }
}

#[derive(Debug)]
pub(crate) struct BlockTracer {
    ebpf: Ebpf,
    program_ids: Vec<(String, u32)>,
    hooks: Vec<Hook>,
    control: Control,
    /// Whether some process was seen reading an attached file since files were attached (its
    /// `io_uring` requests are then followed).
    readers_seen: bool,
    capabilities: Vec<Capability>,
    /// The histograms of ended streams, folded into their stream-less keys: taken out of the
    /// kernel's `LATENCY` map, which holds `MAX_HISTOGRAM_KEYS` keys and would otherwise
    /// fill up with streams long gone (new streams' requests then went uncounted).
    retired: BTreeMap<HistogramKey, LatencyCounters>,
    /// The thread that sweeps out followed readers that are gone.
    reader_sweep: ReaderSweep,
}

impl BlockTracer {
    /// Loads the programs with `layout` written into their read-only data, and attaches the
    /// block programs and those of every optional part not in `off`. An optional part whose
    /// programs the kernel refuses is switched off too, with the kernel's reason; a block
    /// program that cannot attach is an error. Then each is detached until it has work.
    pub(crate) fn load(
        layout: &KernelLayout,
        btf: LoaderBtf,
        off: &[(Feature, String)],
    ) -> Result<Self, TracerError> {
        let btf = (btf.0.join())
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            .map_err(|source| TracerError::Btf { source })?;
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&btf))
            .override_global("KERNEL_LAYOUT", layout, true)
            .load(EBPF_OBJECT)
            .map_err(|source| TracerError::Load { source })?;
        let (mut program_ids, mut hooks) = (Vec::new(), Vec::new());
        let required = BLOCK_PROGRAMS.map(|pair| (pair, Work::Disks));
        for (pair, work) in required.into_iter().chain([(FORK_PROGRAM, Work::Raised)]) {
            let (id, hook) = attach(&mut ebpf, &btf, pair, work)?;
            program_ids.push(id);
            hooks.push(hook);
        }
        let mut capabilities = Vec::new();
        for feature in Feature::ALL {
            let work = if feature == Feature::UringReports {
                Work::Readers
            } else {
                Work::Files
            };
            let mut part = Part {
                ebpf: &mut ebpf,
                btf: &btf,
                program_ids: &mut program_ids,
                hooks: &mut hooks,
            };
            let why = match off.iter().find(|(f, _)| *f == feature) {
                Some((_, why)) => Some(why.clone()),
                None => part.attach(feature.programs(), work).err(),
            };
            let capability = match (why, feature.stand_in()) {
                (None, _) => feature.report(None),
                (Some(why), Some((programs, _))) if part.attach(programs, work).is_ok() => {
                    log::warn!("{feature} stands in: {why}");
                    feature.report_standing_in(&why)
                }
                (Some(why), _) => feature.report(Some(&why)),
            };
            if let Some(off) = &capability.off_because {
                log::warn!("{feature} is off: {off}; it needs {}", capability.needs);
            }
            capabilities.push(capability);
        }
        let control = Control {
            daemon_tgid: std::process::id(),
            ..Control::default()
        };
        let reader_sweep = hand_over::start_reader_sweep(&ebpf)?;
        let mut tracer = Self {
            ebpf,
            program_ids,
            hooks,
            control,
            readers_seen: false,
            capabilities,
            retired: BTreeMap::new(),
            reader_sweep,
        };
        tracer.set_control(control)?;
        Ok(tracer)
    }

    /// What this daemon can do on this kernel.
    #[must_use]
    pub(crate) fn capabilities(&self) -> &[Capability] {
        &self.capabilities
    }

    /// The map `name` as a typed map, for reading.
    fn typed_map<'a, M>(&'a self, name: &'static str) -> Result<M, TracerError>
    where
        M: TryFrom<&'a aya::maps::Map, Error = MapError>,
    {
        let map = self
            .ebpf
            .map(name)
            .ok_or(TracerError::MissingMap { name })?;
        M::try_from(map).map_err(|source| TracerError::Map { name, source })
    }

    /// The map `name` as a typed map, for writing.
    fn typed_map_mut<'a, M>(&'a mut self, name: &'static str) -> Result<M, TracerError>
    where
        M: TryFrom<&'a mut aya::maps::Map, Error = MapError>,
    {
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(TracerError::MissingMap { name })?;
        M::try_from(map).map_err(|source| TracerError::Map { name, source })
    }

    /// Names and kernel ids of the attached programs.
    #[must_use]
    pub(crate) fn program_ids(&self) -> &[(String, u32)] {
        &self.program_ids
    }

    /// Writes the switches, then attaches the programs that now have work and detaches those
    /// that have none (so a program never runs with switches older than its attachment).
    fn set_control(&mut self, control: Control) -> Result<(), TracerError> {
        let name = map::CONTROL;
        let mut array: Array<&mut MapData, Control> = self.typed_map_mut(name)?;
        array
            .set(0, control, 0)
            .map_err(|source| TracerError::Map { name, source })?;
        self.control = control;
        self.sync_hooks()
    }

    /// Attaches the programs that have work under the current switches, detaches the others.
    fn sync_hooks(&mut self) -> Result<(), TracerError> {
        let block = self.control.listed_disks != 0 || self.control.trace_all != 0;
        let started = std::time::Instant::now();
        for hook in &mut self.hooks {
            let wanted = match hook.work {
                Work::Disks => block,
                Work::Files => self.control.attached_files != 0,
                Work::Readers => self.control.attached_files != 0 && self.readers_seen,
                Work::Raised => self.control.raised_threads != 0,
            };
            if wanted == hook.link.is_some() {
                continue;
            }
            let prog = tracepoint_program(&mut self.ebpf, hook.program, hook.tracepoint)?;
            hook.link = match hook.link.take() {
                None => Some(prog.attach().map_err(|source| TracerError::Attach {
                    program: hook.program,
                    tracepoint: hook.tracepoint,
                    source,
                })?),
                Some(link) => {
                    prog.detach(link).map_err(|source| TracerError::Detach {
                        program: hook.program,
                        source,
                    })?;
                    None
                }
            };
            log::debug!(
                "{} {} after {:?}",
                hook.program,
                if wanted { "attached" } else { "detached" },
                started.elapsed()
            );
        }
        Ok(())
    }

    /// Switches per-request events on or off.
    pub(crate) fn set_emit_events(&mut self, emit: bool) -> Result<(), TracerError> {
        self.set_control(Control {
            emit_events: u32::from(emit),
            ..self.control
        })
    }

    /// Lists the managed disks in `DISKS`: their requests are always followed, traced and
    /// tagged with their streams; every other disk costs the programs one lookup per event.
    pub(crate) fn set_managed_disks(&mut self, disks: &[DeviceNumber]) -> Result<(), TracerError> {
        let name = map::DISKS;
        let mut listed: HashMap<&mut MapData, u32, u32> = self.typed_map_mut(name)?;
        for disk in disks {
            listed
                .insert(
                    disk.to_kernel(),
                    disk_flags::MANAGED | disk_flags::TRACED,
                    0,
                )
                .map_err(|source| TracerError::Map { name, source })?;
        }
        let count = u32::try_from(listed.keys().count()).unwrap_or(u32::MAX);
        self.set_control(Control {
            listed_disks: count,
            ..self.control
        })
    }

    /// Starts or stops tracing every disk (while some client traces). While on, the programs
    /// follow every disk's requests into the histograms; when it stops, the records of
    /// requests still in flight on disks no longer traced are dropped (their completions go
    /// unseen).
    pub(crate) fn set_trace_all(&mut self, on: bool) -> Result<(), TracerError> {
        self.set_control(Control {
            trace_all: u32::from(on),
            ..self.control
        })?;
        if !on {
            self.forget_untraced()?;
        }
        Ok(())
    }

    /// Drops the request records (and origins) of disks the programs do not trace now: left
    /// by requests in flight when tracing stopped. Returns how many were dropped.
    fn forget_untraced(&mut self) -> Result<usize, TracerError> {
        if self.control.trace_all != 0 {
            return Ok(0);
        }
        let name = map::DISKS;
        let listed: HashMap<&MapData, u32, u32> = self.typed_map(name)?;
        let traced: Vec<u32> = listed
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, flags)| flags & disk_flags::TRACED != 0)
            .map(|(dev, _)| dev)
            .collect();
        self.forget_records(|record| !traced.contains(&record.dev))
    }

    /// Drops the request records that `stale` picks, and their origins; how many.
    fn forget_records(
        &mut self,
        stale: impl Fn(&InflightRequest) -> bool,
    ) -> Result<usize, TracerError> {
        let name = map::INFLIGHT;
        let mut records: HashMap<&mut MapData, u64, InflightRequest> = self.typed_map_mut(name)?;
        // Cut at one pass's worth of steps: a walk whose key is deleted meanwhile starts over.
        let mut dropped: Vec<u64> = records
            .iter()
            .take(scheduler_common::MAX_INFLIGHT as usize)
            .filter_map(Result::ok)
            .filter(|(_, record)| stale(record))
            .map(|(rq, _)| rq)
            .collect();
        dropped.sort_unstable();
        dropped.dedup();
        for rq in &dropped {
            let _ = records.remove(rq);
        }
        let name = map::ORIGINS;
        let mut origins: HashMap<&mut MapData, u64, RequestOrigin> = self.typed_map_mut(name)?;
        for rq in &dropped {
            let _ = origins.remove(rq);
        }
        Ok(dropped.len())
    }

    /// A process was seen reading an attached file: from now on (until no file is attached)
    /// the `io_uring` programs follow the requests of such processes.
    pub(crate) fn note_reader(&mut self) -> Result<(), TracerError> {
        if self.readers_seen {
            return Ok(());
        }
        self.readers_seen = true;
        self.sync_hooks()
    }

    /// Attaches the fork program while some thread is raised, detaches it once none is.
    pub(crate) fn set_raised(&mut self, raised: bool) -> Result<(), TracerError> {
        if (self.control.raised_threads != 0) == raised {
            return Ok(());
        }
        self.set_control(Control {
            raised_threads: u32::from(raised),
            ..self.control
        })
    }

    /// Tells the programs that `key` is streamed as `file`.
    pub(crate) fn attach_file(
        &mut self,
        key: FileKey,
        file: AttachedFile,
    ) -> Result<(), TracerError> {
        let name = map::ATTACHED;
        let mut attached: HashMap<&mut MapData, FileKey, AttachedFile> =
            self.typed_map_mut(name)?;
        attached
            .insert(key, file, 0)
            .map_err(|source| TracerError::Map { name, source })?;
        let count = u32::try_from(attached.keys().count()).unwrap_or(u32::MAX);
        self.set_control(Control {
            attached_files: count,
            ..self.control
        })
    }

    /// Tells the programs that `key` is no longer streamed.
    pub(crate) fn detach_file(&mut self, key: FileKey) -> Result<(), TracerError> {
        let name = map::ATTACHED;
        let mut attached: HashMap<&mut MapData, FileKey, AttachedFile> =
            self.typed_map_mut(name)?;
        match attached.remove(&key) {
            Ok(()) | Err(MapError::KeyNotFound) => {}
            Err(source) => return Err(TracerError::Map { name, source }),
        }
        let count = u32::try_from(attached.keys().count()).unwrap_or(u32::MAX);
        if count == 0 {
            // The readers are forgotten below: the io_uring programs wait for the next one.
            self.readers_seen = false;
        }
        self.set_control(Control {
            attached_files: count,
            ..self.control
        })?;
        self.retire_ended_streams()?;
        if count == 0 {
            // The completion program stops looking once no file is attached: what is still
            // remembered would never be taken out.
            self.forget_uring()?;
            // Each file's and reader's report pacing: a bucket forgotten comes back full.
            self.forget_all::<[u64; 2], u64>(map::READ_REPORT_DUE)?;
        }
        Ok(())
    }

    /// Empties hash map `name` (as far as [`FORGET_STEPS`] keys reach).
    fn forget_all<K: aya::Pod, V: aya::Pod>(
        &mut self,
        name: &'static str,
    ) -> Result<(), TracerError> {
        // One typed map serves both plain and LRU hash maps.
        let mut map: HashMap<&mut MapData, K, V> = self.typed_map_mut(name)?;
        // Cut at a bound: a walk whose key is deleted meanwhile starts over (the programs
        // delete while abissd walks), and the largest of these maps holds 20 480 entries.
        let keys: Vec<K> = map
            .keys()
            .take(FORGET_STEPS)
            .filter_map(Result::ok)
            .collect();
        for key in &keys {
            let _ = map.remove(key);
        }
        Ok(())
    }
}
