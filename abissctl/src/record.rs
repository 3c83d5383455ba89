//! `record`: standard input written to a file past the page cache at a guaranteed rate
//! (`abiss_client::DirectRecording`), so that any recorder that writes to a pipe records under
//! a guarantee: `ffmpeg … -f mpegts - | abissctl record rec.ts --rate 8Mbit/s`.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;

use abiss_client::{DirectRecording, RecordingSummary, StreamOptions};
use abiss_proto::{ByteRate, ByteSize, StreamId};

use crate::error::CliError;

/// Bytes read from standard input at once.
const READ_BYTES: usize = 64 * 1024;

/// What a pipe or FIFO on standard input is grown to. The kernel's default of 64 KiB is less
/// than one write of some recorders (`filesink` in `gst-launch-1.0` writes 77 KB at once),
/// which then waits for this process to read twice; 1 MiB is also the kernel's default
/// ceiling for users (`/proc/sys/fs/pipe-max-size`).
const PIPE_BYTES: usize = 1 << 20;

/// The ring's seconds of the rate when `--buffer` is not given: a direct write on the lab's
/// busy disk waited up to 1.3 s for ext4's metadata (issue 36), and the ring must hold the
/// input meanwhile.
const RING_SECS: u64 = 2;

/// The smallest ring by default: 2 s of a broadcast recording's 8 Mbit/s, and eight of the
/// largest pieces the writer makes at once.
const MIN_RING_BYTES: u64 = 2 << 20;

/// The ring for `rate` when none is asked for: [`RING_SECS`] of it, at least
/// [`MIN_RING_BYTES`], in whole MiB.
pub(crate) fn default_ring(rate: ByteRate) -> ByteSize {
    let mib = rate
        .0
        .saturating_mul(RING_SECS)
        .max(MIN_RING_BYTES)
        .div_ceil(1 << 20);
    ByteSize(mib.min(u64::MAX >> 20) << 20)
}

/// Records standard input into `file` at `rate` with a ring of `buffer`, at ABISS level
/// `priority`, allocated ahead by abissd with `preallocate`; prints what it did (`json`: as
/// JSON on standard output).
pub(crate) fn record(
    socket: &Path,
    file: &Path,
    (rate, buffer, priority): (ByteRate, ByteSize, u8),
    (preallocate, json): (bool, bool),
) -> Result<(), CliError> {
    // Grown first, so that the recorder writes freely while abissd admits the stream.
    let mut input = std::io::stdin().lock();
    grow_pipe(&input);
    let options = StreamOptions {
        priority,
        preallocate,
        ..StreamOptions::new(rate, buffer)
    };
    let mut recording = DirectRecording::start_at(socket, file, &options)?;
    if !recording.raised() {
        eprintln!(
            "abissctl: abissd did not raise the writer; it records at best effort (see `abissctl status`)"
        );
    }
    let stream = recording.stream().id;
    let mut chunk = vec![0_u8; READ_BYTES];
    loop {
        let read = match input.read(&mut chunk) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => {
                return Err(CliError::BadFile(format!(
                    "cannot read standard input: {error}"
                )))
            }
        };
        if let Err(error) = recording.write_all(&chunk[..read]) {
            // The writer's own error, with the sentence `finish` makes of it.
            return Err(match recording.finish() {
                Err(finished) => finished.into(),
                Ok(_) => CliError::Record(abiss_client::RecordError::Write(error.to_string())),
            });
        }
    }
    let summary = recording.finish()?;
    report(file, (stream, buffer), &summary, json);
    Ok(())
}

/// Grows standard input to [`PIPE_BYTES`] (or the system's ceiling, if lower) when it is a
/// pipe or FIFO. Where the kernel refuses (the user's pipes already hold their share), the
/// pipe stays as it was: the recording is right either way, only the recorder's writes wait
/// longer.
fn grow_pipe(input: &impl AsRawFd) {
    use nix::fcntl::{fcntl, FcntlArg};
    use nix::sys::stat::{fstat, SFlag};
    let fd = input.as_raw_fd();
    let is_pipe = fstat(fd).is_ok_and(|stat| {
        SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFIFO
    });
    if !is_pipe {
        return;
    }
    let ceiling = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
        .ok()
        .and_then(|text| text.trim().parse::<usize>().ok())
        .unwrap_or(PIPE_BYTES);
    let bytes = i32::try_from(PIPE_BYTES.min(ceiling)).unwrap_or(i32::MAX);
    if fcntl(fd, FcntlArg::F_GETPIPE_SZ).is_ok_and(|current| current < bytes) {
        let _ = fcntl(fd, FcntlArg::F_SETPIPE_SZ(bytes));
    }
}

/// One line on standard error, and the figures as JSON on standard output with `json`.
fn report(
    file: &Path,
    (stream, ring): (StreamId, ByteSize),
    summary: &RecordingSummary,
    json: bool,
) {
    let direct = &summary.direct;
    eprintln!(
        "abissctl: recorded {} bytes into {} (stream {stream}): {} overflows, {} direct writes \
         (p99.9 {:.2} ms, slowest {:.2} ms){}{}",
        direct.bytes,
        file.display(),
        direct.overflows,
        direct.pieces,
        direct.piece_p999_ms,
        direct.piece_max_ms,
        match (&summary.ring_refusal, direct.locked) {
            (None, _) => String::new(),
            (Some(why), true) => format!("; abissd did not lock the ring ({why}), abissctl did"),
            (Some(why), false) => format!(
                "; the ring was not locked in memory: abissd did not lock it ({why}), and \
                 RLIMIT_MEMLOCK is too small for abissctl to"
            ),
        },
        if summary.daemon_lost {
            "; abissd went away during it, and it went on at best effort"
        } else {
            ""
        },
    );
    if json {
        let mut value = serde_json::to_value(summary).unwrap_or_default();
        if let Some(fields) = value.as_object_mut() {
            fields.insert("file".into(), serde_json::json!(file));
            fields.insert("stream".into(), serde_json::json!(stream));
            fields.insert("ring_bytes".into(), serde_json::json!(ring.0));
        }
        crate::json::print(&mut std::io::stdout().lock(), &value);
        let _ = std::io::stdout().flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_ring_holds_two_seconds_of_the_rate_and_at_least_two_mib() {
        assert_eq!(default_ring(ByteRate(1_000_000)), ByteSize(2 << 20));
        assert_eq!(default_ring(ByteRate(0)), ByteSize(2 << 20));
        // 20 MB/s: 40 MB, which is 38.1 MiB, up to whole MiB.
        assert_eq!(default_ring(ByteRate(20_000_000)), ByteSize(39 << 20));
        assert_eq!(default_ring(ByteRate(u64::MAX)).0 % (1 << 20), 0);
    }
}
