//! The table of streams: lookups by id and by file, and the sums admission and the memory
//! budget need.

use std::collections::BTreeMap;

use abiss_proto::{DeviceNumber, Refusal, StreamId};
use scheduler_common::{AttachedFile, FileKey};

use crate::policy::shared_file::{kernel_entry, FileStream};
use crate::stream::writeback::{AheadByUser, Recording};
use crate::stream::Stream;

/// All streams, by id.
#[derive(Debug, Default)]
pub(crate) struct StreamTable {
    streams: BTreeMap<StreamId, Stream>,
    next_id: u64,
}

impl StreamTable {
    /// A fresh id.
    pub(crate) fn next_id(&mut self) -> StreamId {
        self.next_id += 1;
        StreamId(self.next_id)
    }

    /// Adds a stream.
    pub(crate) fn insert(&mut self, stream: Stream) {
        self.streams.insert(stream.id, stream);
    }

    /// Removes a stream.
    pub(crate) fn remove(&mut self, id: StreamId) -> Option<Stream> {
        self.streams.remove(&id)
    }

    /// A stream by id.
    pub(crate) fn get_mut(&mut self, id: StreamId) -> Option<&mut Stream> {
        self.streams.get_mut(&id)
    }

    /// A stream by id.
    #[must_use]
    pub(crate) fn get(&self, id: StreamId) -> Option<&Stream> {
        self.streams.get(&id)
    }

    /// The tag of a file's streams, if it has any ([`AttachedFile::stream`]).
    #[must_use]
    pub(crate) fn tag_of(&self, key: &FileKey) -> Option<u64> {
        self.streams
            .values()
            .find(|s| s.key == *key)
            .map(|s| s.file_tag)
    }

    /// Refuses a file `path` (reporting `file_device`) whose `key` is that of an attached file
    /// which reports another device: btrfs numbers inodes per subvolume, while the kernel's
    /// structures (so the programs, and the key) know one device for all its subvolumes.
    pub(crate) fn check_key_unshared(
        &self,
        key: &FileKey,
        file_device: DeviceNumber,
        path: &str,
    ) -> Result<(), Refusal> {
        if self
            .streams
            .values()
            .any(|s| s.key == *key && s.file_device != file_device)
        {
            return Err(Refusal::BadRequest(format!(
                "{path} has the inode number of an attached file in another subvolume of its btrfs, and abissd's programs tell files apart by file system and inode number; attach one of them at a time"
            )));
        }
        Ok(())
    }

    /// The streams of the file tagged `tag`.
    pub(crate) fn of_file(&self, tag: u64) -> impl Iterator<Item = &Stream> {
        self.streams.values().filter(move |s| s.file_tag == tag)
    }

    /// The streams of the file tagged `tag` as routing sees them, for an access by process
    /// `tgid`.
    #[must_use]
    pub(crate) fn sharing(&self, tag: u64, tgid: u32) -> Vec<FileStream> {
        self.of_file(tag).map(|s| s.as_shared(tgid)).collect()
    }

    /// What the kernel should know of the file tagged `tag`; `None` once it has no stream.
    #[must_use]
    pub(crate) fn kernel_entry(&self, tag: u64) -> Option<AttachedFile> {
        let streams = self.sharing(tag, 0);
        (!streams.is_empty()).then(|| kernel_entry(tag, &streams))
    }

    /// What each user's recordings hold allocated ahead of their writers.
    #[must_use]
    pub(crate) fn allocated_ahead(&self) -> AheadByUser {
        AheadByUser::of(
            self.iter()
                .filter_map(|stream| Some((stream.owner_uid, stream.kind.recording()?))),
        )
    }

    /// All streams.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Stream> {
        self.streams.values()
    }

    /// All streams, mutable.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut Stream> {
        self.streams.values_mut()
    }

    /// Number of streams.
    #[must_use]
    pub(crate) fn len(&self) -> usize {
        self.streams.len()
    }

    /// Sum of the granted rates on `disk`, but for stream `except` (one whose rate is being
    /// changed).
    #[must_use]
    pub(crate) fn reserved_on(&self, disk: DeviceNumber, except: Option<StreamId>) -> u64 {
        self.streams
            .values()
            .filter(|s| s.is_on(disk) && Some(s.id) != except)
            .map(|s| s.granted.rate.0)
            .sum()
    }

    /// Whether a stream on `disk` is still loading its first window.
    #[must_use]
    pub(crate) fn starting_on(&self, disk: DeviceNumber) -> bool {
        self.streams
            .values()
            .any(|s| s.is_on(disk) && s.playout.is_starting())
    }

    /// Sum of the granted rates of the write streams on `disk`.
    #[must_use]
    pub(crate) fn reserved_write_on(&self, disk: DeviceNumber) -> u64 {
        self.streams
            .values()
            .filter(|s| s.is_on(disk) && s.granted.write)
            .map(|s| s.granted.rate.0)
            .sum()
    }

    /// The address space the mappings of all streams (or those of `uid`) take.
    #[must_use]
    pub(crate) fn mapped_bytes(&self, uid: Option<u32>) -> u64 {
        self.streams
            .values()
            .filter(|s| uid.is_none_or(|uid| s.owner_uid == uid))
            .map(|s| s.file.reach_bytes())
            .sum()
    }

    /// The most all streams (or those of `uid`) may lock: buffer plus a batch each.
    #[must_use]
    pub(crate) fn locked_at_most(&self, uid: Option<u32>) -> u64 {
        self.streams
            .values()
            .filter(|s| uid.is_none_or(|uid| s.owner_uid == uid))
            // A preroll holds more until its reader passes it.
            .map(|s| s.admitted_locked_bytes().max(s.playout.locked_bytes()))
            .sum()
    }

    /// What all streams (or those of `uid`) have locked now.
    #[must_use]
    pub(crate) fn locked_now(&self, uid: Option<u32>) -> u64 {
        self.streams
            .values()
            .filter(|s| uid.is_none_or(|uid| s.owner_uid == uid))
            .map(|s| {
                s.playout.locked_bytes()
                    + s.kind.recording().map_or(0, Recording::ring_locked_bytes)
            })
            .sum()
    }

    /// Streams held by `uid`.
    #[must_use]
    pub(crate) fn count_of(&self, uid: u32) -> usize {
        self.streams.values().filter(|s| s.owner_uid == uid).count()
    }
}
