//! What a new stream must pass before it exists, each a refusal that changes nothing: the
//! stream limits, the disks' admission and the memory budgets ([`Controller::admit`]), joining
//! the streams its file already has ([`Controller::may_share`]), and its own mapping of the
//! file ([`Controller::mapping`]). [`Controller::attach`] asks them in turn.

use abiss_proto::{AttachRequest, DeviceNumber, Refusal, PAGE_BYTES};

use super::Controller;
use crate::policy::memory::{locked_at_most, AddressSpaceBudget};
use crate::policy::probe_tail::preroll_locked_bytes;
use crate::policy::shared_file::{MAX_STREAMS_PER_FILE, MAX_STREAMS_PER_USER_PER_FILE};
use crate::serve::client_file::CheckedFile;
use crate::stream::mapped_file::{mapping_bytes, reopen_without_atime};
use crate::stream::prefetch::MappedFile;
use crate::stream::{MAX_STREAMS, MAX_STREAMS_PER_USER};

impl Controller {
    /// Whether a new stream of `request` on `file` (on `disks`) fits: the stream limits, the
    /// disk's admission control (unless `check_disk` is false: already checked for a set grown
    /// for capacity) and the locked-memory budgets.
    pub(super) fn admit(
        &self,
        peer_uid: u32,
        request: &AttachRequest,
        disks: &[DeviceNumber],
        file: &CheckedFile,
        check_disk: bool,
    ) -> Result<(), Refusal> {
        if self.streams.len() >= MAX_STREAMS {
            return Err(Refusal::DaemonFull { max: MAX_STREAMS });
        }
        if peer_uid != 0 && self.streams.count_of(peer_uid) >= MAX_STREAMS_PER_USER {
            return Err(Refusal::UserFull {
                max: MAX_STREAMS_PER_USER,
            });
        }
        if check_disk {
            self.disks.admit(disks, request, &self.streams, None)?;
        }
        // A preroll is locked too, until the reader passes it (no more than the file), and
        // with it the file's tail, for the player's probe.
        let preroll = request
            .preroll
            .map_or(0, |preroll| preroll_locked_bytes(preroll.0, file.bytes));
        let wanted = locked_at_most(
            request.buffer.0.max(preroll),
            u64::from(request.batch_pages) * PAGE_BYTES,
        );
        self.memory
            .admit(
                peer_uid,
                wanted,
                self.streams.locked_at_most(None),
                self.streams.locked_at_most(Some(peer_uid)),
            )
            .map_err(|refusal| Refusal::DoesNotFit(refusal.to_string()))?;
        // A recording maps nothing.
        if !request.write {
            AddressSpaceBudget::DEFAULT
                .admit(
                    peer_uid,
                    mapping_bytes(file.bytes),
                    self.streams.mapped_bytes(None),
                    self.streams.mapped_bytes(Some(peer_uid)),
                )
                .map_err(|refusal| Refusal::DoesNotFit(refusal.to_string()))?;
        }
        Ok(())
    }

    /// Whether a stream may join the streams the file behind `file` already has, and their
    /// tag (`None`: it has none): viewers of one file each have their own stream, up to
    /// [`MAX_STREAMS_PER_FILE`], of which [`MAX_STREAMS_PER_USER_PER_FILE`] of one user's
    /// (root exempt); a file has one recording at most, whose id only its owner and root are
    /// told.
    pub(super) fn may_share(
        &self,
        peer_uid: u32,
        file: &CheckedFile,
        write: bool,
    ) -> Result<Option<u64>, Refusal> {
        let Some(tag) = self.streams.tag_of(&file.key) else {
            return Ok(None);
        };
        self.streams
            .check_key_unshared(&file.key, file.file_device, &file.path)?;
        if write {
            if let Some(recording) = self.streams.of_file(tag).find(|s| s.kind.is_recording()) {
                let theirs = peer_uid == 0 || recording.owner_uid == peer_uid;
                return Err(Refusal::AlreadyRecording {
                    path: file.path.clone(),
                    stream: theirs.then_some(recording.id),
                });
            }
        }
        if self.streams.of_file(tag).count() >= MAX_STREAMS_PER_FILE {
            return Err(Refusal::FileFull {
                path: file.path.clone(),
                max: MAX_STREAMS_PER_FILE,
            });
        }
        let users = self
            .streams
            .of_file(tag)
            .filter(|s| s.owner_uid == peer_uid)
            .count();
        if peer_uid != 0 && users >= MAX_STREAMS_PER_USER_PER_FILE {
            return Err(Refusal::FileFullForUser {
                path: file.path.clone(),
                max: MAX_STREAMS_PER_USER_PER_FILE,
            });
        }
        Ok(Some(tag))
    }

    /// The stream's own mapping of its file (none for a recording: nothing is locked).
    pub(super) fn mapping(file: &CheckedFile, write: bool) -> Result<MappedFile, Refusal> {
        let internal = |error: &dyn std::fmt::Display| Refusal::Internal(error.to_string());
        if write {
            let fd = file.fd.try_clone().map_err(|e| internal(&e))?;
            return Ok(MappedFile::unmapped(fd));
        }
        let fd = match reopen_without_atime(&file.fd) {
            Ok(fd) => fd,
            Err(error) => {
                log::debug!("{}: mapped with its access time kept: {error}", file.path);
                file.fd.try_clone().map_err(|e| internal(&e))?
            }
        };
        MappedFile::new(fd, file.bytes)
            .map_err(|error| internal(&format!("cannot map {}: {error}", file.path)))
    }
}
