//! How much a stream holds: its buffer sized from its disk (`--buffer auto`, grown as the
//! disk's real-time tail grows, within the locked-memory budgets) and its start-up preroll.

use abiss_proto::{AttachRequest, AutoBufferInfo, ByteSize, DeviceNumber, PAGE_BYTES};
use log::info;

use super::Controller;
use crate::policy::buffer_sizing::{auto_buffer_bytes, should_grow, DEFAULT_TAIL_NS};
use crate::policy::memory::locked_at_most;
use crate::policy::playout::WindowAction;
use crate::streams::{Stream, MAX_BUFFER_BYTES};

impl Controller {
    /// Sizes the buffer of `request` (`--buffer auto`, its `buffer` the application's part)
    /// from the real-time tail of `disk`.
    pub(super) fn size_buffer(
        &self,
        request: &mut AttachRequest,
        disk: DeviceNumber,
    ) -> AutoBufferInfo {
        let measured = self.tails.tail_ns(disk);
        let tail_ns = measured.unwrap_or(DEFAULT_TAIL_NS);
        let app_bytes = request.buffer.0;
        let batch = u64::from(request.batch_pages) * PAGE_BYTES;
        let bytes = auto_buffer_bytes(app_bytes, request.rate.0, tail_ns, batch);
        request.buffer = ByteSize(bytes.min(MAX_BUFFER_BYTES));
        AutoBufferInfo {
            app_bytes,
            tail_us: tail_ns / 1000,
            measured: measured.is_some(),
            capped: bytes > MAX_BUFFER_BYTES,
        }
    }

    /// Grows the automatic buffers whose disk's real-time tail grew, as far as the
    /// locked-memory budgets allow (see [`crate::policy::buffer_sizing`]).
    pub(super) fn grow_auto_buffers(&mut self, now_ns: u64) {
        let auto: Vec<u64> = self
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
            let Some(tail_ns) = self.tails.tail_ns(stream.disk) else {
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
                info.capped = !fits;
            }
            if grow && fits {
                info!(
                    "stream {id}: buffer {} → {} for a real-time tail of {} ms on its disk",
                    stream.granted.buffer,
                    ByteSize(wanted),
                    tail_ns / 1_000_000
                );
                let actions = stream.set_buffer(wanted, now_ns);
                Self::execute(&mut self.prefetch, stream, actions);
            }
        }
    }

    /// The start-up preroll of a new stream up to `end` bytes of its head: as much beyond what
    /// its window asked for as the owner's start-up allowance grants (root's: all).
    pub(super) fn preroll(
        &mut self,
        stream: &mut Stream,
        end: u64,
        now_ns: u64,
    ) -> Vec<WindowAction> {
        let asked = stream.playout.requested_end();
        let wanted = end.min(stream.file_bytes).saturating_sub(asked);
        if wanted == 0 {
            return Vec::new();
        }
        let granted = self.burst.grant(stream.owner_uid, wanted, now_ns);
        if granted < wanted {
            info!(
                "stream {}: preroll cut to {granted} of {wanted} bytes by the start-up allowance",
                stream.id
            );
        }
        stream.playout.preroll(asked + granted)
    }
}
