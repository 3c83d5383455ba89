//! The media the players play: an 8 Mbit/s MPEG-TS made once by ffmpeg (`testsrc2` and a
//! `sine` tone, MPEG-2 video at 640×360 and MP2 audio, padded to a constant 8 Mbit/s mux
//! rate) and cached, then copied onto the lab disk under one name per player.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;

use crate::layout::drop_cached_pages;

/// Bytes per second of the media: an 8 Mbit/s mux rate.
pub const MEDIA_BYTES_PER_S: u64 = 1_000_000;
/// Video resolution: MPEG-2 at this size decodes in about 1 % of a core.
pub const RESOLUTION: &str = "640x360";
/// Frames per second of the video (the freeze tolerance is one frame period).
pub const FRAME_RATE: u32 = 25;
/// How the media is encoded, as ffmpeg options (the recording benchmark's ffmpeg recorder
/// writes its recordings the same way): a GOP of half a second; video at 7 Mbit/s with the
/// rate held (testsrc2 is easy to code), MP2 audio; the mux rate pads the rest with null
/// packets: 1 MB/s exactly.
pub const ENCODING: [&str; 20] = [
    "-c:v",
    "mpeg2video",
    "-g",
    "12",
    "-b:v",
    "7M",
    "-minrate",
    "7M",
    "-maxrate",
    "7M",
    "-bufsize",
    "1835k",
    "-c:a",
    "mp2",
    "-b:a",
    "192k",
    "-f",
    "mpegts",
    "-muxrate",
    "8M",
];
/// ffmpeg's lavfi source of the media's sound.
pub const AUDIO_SOURCE: &str = "sine=frequency=440:sample_rate=48000";
/// Where the generated media is kept between runs.
const CACHE_DIR: &str = "/var/tmp/abiss-bench/players";

/// ffmpeg's lavfi source of the media's picture.
#[must_use]
pub fn video_source() -> String {
    format!("testsrc2=size={RESOLUTION}:rate={FRAME_RATE}")
}

/// The media as the reports describe it, `secs` long.
#[must_use]
pub fn parameters(secs: u32) -> serde_json::Value {
    serde_json::json!({
        "bytes_per_s": MEDIA_BYTES_PER_S,
        "resolution": RESOLUTION,
        "frame_rate": FRAME_RATE,
        "secs": secs,
    })
}

/// The cached media file of `secs` seconds, generated if missing.
pub fn cached_media(secs: u32) -> anyhow::Result<PathBuf> {
    let dir = Path::new(CACHE_DIR);
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {CACHE_DIR}"))?;
    let path = dir.join(format!("testsrc2-{RESOLUTION}-mpeg2-8Mbit-{secs}s.ts"));
    if path.exists() {
        return Ok(path);
    }
    eprintln!("players: generating {} (once)", path.display());
    let partial = path.with_extension("ts.part");
    let status = Command::new("ffmpeg")
        .args(["-nostdin", "-hide_banner", "-loglevel", "error", "-y"])
        .args(["-f", "lavfi", "-i"])
        .arg(video_source())
        .args(["-f", "lavfi", "-i", AUDIO_SOURCE])
        .args(["-t", &secs.to_string()])
        .args(ENCODING)
        .arg(&partial)
        .status()
        .context("cannot run ffmpeg (cargo xtask setup installs it)")?;
    anyhow::ensure!(status.success(), "ffmpeg could not generate the media");
    std::fs::rename(&partial, &path)?;
    Ok(path)
}

/// Copies `source` into `dir` as `media-0.ts` … for `count` players, synced to the disk and
/// dropped from the page cache; returns the copies.
pub fn copy_onto(source: &Path, dir: &Path, count: usize) -> anyhow::Result<Vec<PathBuf>> {
    let mut copies = Vec::new();
    for index in 0..count {
        let path = dir.join(format!("media-{index}.ts"));
        std::fs::copy(source, &path)
            .with_context(|| format!("cannot copy the media to {}", path.display()))?;
        std::fs::File::open(&path)?.sync_all()?;
        drop_cached_pages(&path)?;
        copies.push(path);
    }
    Ok(copies)
}
