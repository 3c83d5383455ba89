//! How much a stream holds: its buffer sized from its disk (`--buffer auto`, grown as the
//! disk's latency tail in its class grows, and grown for the disk's capacity, within the locked-memory
//! budgets) and its start-up preroll.

use abiss_proto::{
    AttachRequest, AutoBufferInfo, ByteSize, DeviceNumber, IoClass, Refusal, StreamId, PAGE_BYTES,
};
use log::{info, warn};
use scheduler_common::{AbissLevel, MonotonicNs};

use super::access::fill_from_allowance;
use super::Controller;
use crate::policy::buffer_sizing::{
    auto_buffer_bytes, should_grow, smallest_fitting_buffer, DEFAULT_TAIL_NS,
};
use crate::policy::memory::locked_at_most;
use crate::policy::page_ceil;
use crate::policy::playout::WindowAction;
use crate::policy::probe_tail::preroll_locked_bytes;
use crate::stream::{demand_of, Stream, MAX_BUFFER_BYTES};

impl Controller {
    /// The longest tail of the requests in `class` measured on any of `disks`: a stream over
    /// several waits for the slowest of them.
    fn tail_ns(&self, disks: &[DeviceNumber], class: IoClass) -> Option<u64> {
        disks
            .iter()
            .filter_map(|&disk| self.tails.tail_ns(disk, class))
            .max()
    }

    /// Sizes the buffer of `request` (`--buffer auto`, its `buffer` the application's part)
    /// from the tail of the requests of `disks` in the class of the stream's `level`.
    fn size_buffer(
        &self,
        request: &mut AttachRequest,
        level: AbissLevel,
        disks: &[DeviceNumber],
    ) -> AutoBufferInfo {
        let measured = self.tail_ns(disks, level_class(level));
        // An estimate only raises the default: a disk that served only short best-effort
        // requests says little of how long a real-time one waits behind a long one.
        let estimated = measured
            .is_none()
            .then(|| {
                disks
                    .iter()
                    .filter_map(|&disk| self.tails.estimate_ns(disk))
                    .max()
            })
            .flatten()
            .filter(|&ns| ns > DEFAULT_TAIL_NS);
        let tail_ns = measured.or(estimated).unwrap_or(DEFAULT_TAIL_NS);
        let app_bytes = request.buffer.0;
        let batch = u64::from(request.batch_pages) * PAGE_BYTES;
        let bytes = auto_buffer_bytes(app_bytes, request.rate.0, tail_ns, batch);
        request.buffer = ByteSize(bytes.min(MAX_BUFFER_BYTES));
        AutoBufferInfo {
            app_bytes,
            tail_us: tail_ns / 1000,
            measured: measured.is_some(),
            estimated: estimated.is_some(),
            capped: bytes > MAX_BUFFER_BYTES,
            for_capacity_bytes: None,
        }
    }

    /// Takes in the disks' latency histograms, if it is time to (once a second); whether it
    /// did.
    pub(super) fn refresh_tails(&mut self, now: MonotonicNs) -> bool {
        if !self.tails.due(now) {
            return false;
        }
        match self.tracer.latency() {
            Ok(groups) => self.tails.update(&groups, now),
            Err(error) => warn!("cannot read the latency histograms: {error}"),
        }
        true
    }

    /// Grows the automatic buffers whose disk's tail in their class grew, as far as the
    /// locked-memory budgets allow (see [`crate::policy::buffer_sizing`]).
    pub(super) fn grow_auto_buffers(&mut self, now: MonotonicNs) {
        let auto: Vec<StreamId> = self
            .streams
            .iter()
            .filter(|s| s.auto_buffer.is_some())
            .map(|s| s.id)
            .collect();
        for id in auto {
            let locked_total = self.streams.locked_at_most(None);
            let Some(stream) = self.streams.get(id) else {
                continue;
            };
            let class = level_class(stream.level);
            let Some(tail_ns) = self.tail_ns(&stream.disks, class) else {
                continue;
            };
            let locked_by_user = self.streams.locked_at_most(Some(stream.owner_uid));
            let granted = &stream.granted;
            let batch = u64::from(granted.batch_pages) * PAGE_BYTES;
            let app_bytes = stream.auto_buffer.as_ref().map_or(0, |a| a.app_bytes);
            let wanted = auto_buffer_bytes(app_bytes, granted.rate.0, tail_ns, batch);
            let grow = should_grow(granted.buffer.0, wanted);
            let fits = !grow
                || wanted <= MAX_BUFFER_BYTES
                    && self
                        .memory
                        .admit(
                            stream.owner_uid,
                            locked_at_most(wanted, batch)
                                .saturating_sub(locked_at_most(granted.buffer.0, batch)),
                            locked_total,
                            locked_by_user,
                        )
                        .is_ok();
            let Some(stream) = self.streams.get_mut(id) else {
                continue;
            };
            if let Some(info) = &mut stream.auto_buffer {
                info.tail_us = tail_ns / 1000;
                info.measured = true;
                info.estimated = false;
                info.capped = !fits;
            }
            if grow && fits {
                info!(
                    "stream {id}: buffer {} → {} for a {class} tail of {} ms on its disk",
                    stream.granted.buffer,
                    ByteSize(wanted),
                    tail_ns / 1_000_000
                );
                let mut actions = stream.set_buffer(wanted, now);
                actions.extend(fill_from_allowance(&mut self.burst, stream, now));
                Self::execute(&mut self.prefetch, stream, actions);
            }
        }
    }

    /// Sizes an automatic buffer (`--buffer auto`; nothing for others): from the disk's
    /// latency tail, and larger where the disk's admission needs it (then the size the
    /// owner's other automatic streams on the disk must grow to, too). `level` is the
    /// request's, checked.
    pub(super) fn size_auto(
        &self,
        peer_uid: u32,
        (request, level): (&mut AttachRequest, AbissLevel),
        disks: &[DeviceNumber],
    ) -> (Option<AutoBufferInfo>, CapacitySizing) {
        if !request.buffer_auto {
            return (None, CapacitySizing::AsIs);
        }
        let mut info = self.size_buffer(request, level, disks);
        let sizing = self.buffer_for_capacity(peer_uid, request, disks);
        if let CapacitySizing::Grow(bytes) = sizing {
            request.buffer = ByteSize(bytes);
            info.for_capacity_bytes = Some(bytes);
        }
        (Some(info), sizing)
    }

    /// Memory buys disk time: when the model of one of `disks` would refuse the automatic stream of
    /// `request` at its latency-sized buffer, the smallest common buffer for it and its
    /// owner's other automatic streams on the disk at which the disk admits them all and the
    /// locked-memory budgets hold the growth (see [`crate::policy::buffer_sizing`]). Only the
    /// owner's own streams grow, so no user's attach spends another's budget.
    /// [`CapacitySizing::AsIs`] when the buffer is not what stops the stream: no model,
    /// admission off, it fits as it is, or no buffer would do.
    pub(super) fn buffer_for_capacity(
        &self,
        peer_uid: u32,
        request: &AttachRequest,
        disks: &[DeviceNumber],
    ) -> CapacitySizing {
        let grows =
            |stream: &Stream, buffer: u64| grows_for_capacity(stream, peer_uid, disks, buffer);
        let with_buffer = |granted: &AttachRequest, buffer: u64| AttachRequest {
            buffer: ByteSize(buffer.max(granted.buffer.0)),
            ..granted.clone()
        };
        let admits_at = |buffer: u64| {
            let existing_on = |disk: DeviceNumber| {
                self.streams
                    .iter()
                    .filter(|s| s.is_on(disk))
                    .map(|s| {
                        if grows(s, buffer) {
                            demand_of(&with_buffer(&s.granted, buffer))
                        } else {
                            s.demand()
                        }
                    })
                    .collect()
            };
            self.disks.model_admits(
                disks,
                existing_on,
                &demand_of(&with_buffer(request, buffer)),
            )
        };
        if admits_at(request.buffer.0).unwrap_or(true) {
            return CapacitySizing::AsIs;
        }
        let batch = u64::from(request.batch_pages) * PAGE_BYTES;
        let preroll = request
            .preroll
            .map_or(0, |preroll| preroll_locked_bytes(preroll.0, u64::MAX));
        let locked_for = |buffer: u64| {
            let growth: u64 = self
                .streams
                .iter()
                .filter(|s| grows(s, buffer))
                .map(|s| {
                    let batch = u64::from(s.granted.batch_pages) * PAGE_BYTES;
                    locked_at_most(buffer, batch) - locked_at_most(s.granted.buffer.0, batch)
                })
                .sum();
            growth.saturating_add(locked_at_most(
                buffer.max(request.buffer.0).max(preroll),
                batch,
            ))
        };
        let (locked_total, locked_by_user) = (
            self.streams.locked_at_most(None),
            self.streams.locked_at_most(Some(peer_uid)),
        );
        let fits_memory = |buffer: u64| {
            self.memory
                .admit(peer_uid, locked_for(buffer), locked_total, locked_by_user)
                .is_ok()
        };
        if let Some(bytes) = smallest_fitting_buffer(request.buffer.0, MAX_BUFFER_BYTES, |b| {
            admits_at(b) == Some(true) && fits_memory(b)
        }) {
            return CapacitySizing::Grow(bytes);
        }
        // Nothing fits both: if the disk alone would take a larger buffer, memory is what
        // stops the stream, and the refusal should say so.
        smallest_fitting_buffer(request.buffer.0, MAX_BUFFER_BYTES, |b| {
            admits_at(b) == Some(true)
        })
        .map_or(CapacitySizing::AsIs, |buffer_bytes| {
            CapacitySizing::HeldByMemory {
                buffer_bytes,
                locked_bytes: locked_for(buffer_bytes),
            }
        })
    }

    /// Grows `owner`'s automatic streams on `disks` to `buffer_bytes`, as
    /// [`Self::buffer_for_capacity`] found they must be for one more stream.
    pub(super) fn grow_for_capacity(
        &mut self,
        owner: u32,
        disks: &[DeviceNumber],
        buffer_bytes: u64,
        now: MonotonicNs,
    ) {
        for stream in self.streams.iter_mut() {
            if !grows_for_capacity(stream, owner, disks, buffer_bytes) {
                continue;
            }
            let Some(info) = &mut stream.auto_buffer else {
                continue;
            };
            info.for_capacity_bytes = Some(buffer_bytes);
            info!(
                "stream {}: buffer {} → {} so that its disk admits one more stream",
                stream.id,
                stream.granted.buffer,
                ByteSize(buffer_bytes)
            );
            let mut actions = stream.set_buffer(buffer_bytes, now);
            actions.extend(fill_from_allowance(&mut self.burst, stream, now));
            Self::execute(&mut self.prefetch, stream, actions);
        }
    }

    /// The start-up preroll of a new stream up to `end` bytes of its head: as much beyond what
    /// its window asked for as the owner's start-up allowance grants (root's: all).
    pub(super) fn preroll(
        &mut self,
        stream: &mut Stream,
        end: u64,
        now: MonotonicNs,
    ) -> Vec<WindowAction> {
        let asked = stream.playout.requested_end();
        let head = end.min(stream.file_bytes).saturating_sub(asked);
        if head == 0 {
            return Vec::new();
        }
        // The file's tail comes with the head (the player's probe), out of the same allowance.
        let wanted = preroll_locked_bytes(end, stream.file_bytes)
            .saturating_sub(page_ceil(asked.min(end)))
            .max(head);
        let granted = self.burst.grant(stream.owner_uid, wanted, now);
        if granted < wanted {
            info!(
                "stream {}: preroll cut to {granted} of {wanted} bytes by the start-up allowance",
                stream.id
            );
        }
        // Cut short, the preroll keeps its head: the tail only comes whole.
        let others_starting = stream
            .disks
            .iter()
            .any(|&disk| self.streams.starting_on(disk));
        stream.playout.preroll(
            asked + granted.min(head),
            granted >= wanted,
            others_starting,
        )
    }
}

/// The class the requests of a stream at ABISS `level` are queued in.
fn level_class(level: AbissLevel) -> IoClass {
    IoClass::from_kernel(level.to_kernel().0)
}

/// What the disk's capacity asks of a new automatic stream's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CapacitySizing {
    /// Nothing: the buffer is not what decides (no model, admission off, it fits, or no buffer
    /// would do).
    AsIs,
    /// The stream and its owner's other automatic streams on the disk take this common buffer.
    Grow(u64),
    /// The disk would take the stream with automatic buffers of `buffer_bytes`, but growing
    /// them would lock `locked_bytes` more than the locked-memory budgets have free.
    HeldByMemory {
        /// The common buffer the disk would take.
        buffer_bytes: u64,
        /// What the stream and the growth would lock.
        locked_bytes: u64,
    },
}

impl CapacitySizing {
    /// The buffer to grow to, if any.
    pub(super) fn grown(self) -> Option<u64> {
        match self {
            Self::Grow(bytes) => Some(bytes),
            Self::AsIs | Self::HeldByMemory { .. } => None,
        }
    }

    /// The disk's refusal of the stream, with what memory would have bought where memory is
    /// what stopped it.
    pub(super) fn explain(self, refusal: Refusal) -> Refusal {
        match (self, refusal) {
            (
                Self::HeldByMemory {
                    buffer_bytes,
                    locked_bytes,
                },
                Refusal::DoesNotFit(disk),
            ) => Refusal::DoesNotFit(format!(
                "{disk}; automatic buffers of {} would make room on the disk, but the stream and the growth of yours there would lock {}, more than the locked-memory budgets have free: ask the administrator for a larger --locked-memory or --user-locked-memory, or detach a stream",
                ByteSize(buffer_bytes),
                ByteSize(locked_bytes)
            )),
            (_, refusal) => refusal,
        }
    }
}

/// Whether `stream` grows when `owner`'s automatic streams on `disks` take a common buffer of
/// `buffer_bytes` for their capacity: only the owner's own automatic streams that share one of
/// the disks, and only upwards.
fn grows_for_capacity(
    stream: &Stream,
    owner: u32,
    disks: &[DeviceNumber],
    buffer_bytes: u64,
) -> bool {
    disks.iter().any(|&disk| stream.is_on(disk))
        && stream.owner_uid == owner
        && stream.auto_buffer.is_some()
        && stream.granted.buffer.0 < buffer_bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_says_when_memory_is_what_stopped_the_stream() {
        let disk = || Refusal::DoesNotFit("the disk would need 820 ms of every 1000 ms".into());
        let held = CapacitySizing::HeldByMemory {
            buffer_bytes: 2 << 20,
            locked_bytes: 40 << 20,
        };
        let Refusal::DoesNotFit(message) = held.explain(disk()) else {
            panic!("still the disk's refusal");
        };
        assert!(
            message.starts_with("the disk would need 820 ms"),
            "{message}"
        );
        assert!(message.contains("automatic buffers of 2MiB"), "{message}");
        assert!(message.contains("would lock 40MiB"), "{message}");
        assert!(message.contains("--locked-memory"), "{message}");
        // Where memory is not the reason, the refusal is as it was.
        assert_eq!(CapacitySizing::AsIs.explain(disk()), disk());
        assert_eq!(CapacitySizing::Grow(1 << 20).explain(disk()), disk());
        assert_eq!(
            held.explain(Refusal::DaemonFull { max: 256 }),
            Refusal::DaemonFull { max: 256 }
        );
        assert_eq!(held.grown(), None);
        assert_eq!(CapacitySizing::Grow(4096).grown(), Some(4096));
    }
}
