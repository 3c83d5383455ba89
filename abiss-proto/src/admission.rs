//! Capacity planning: how many streams of a kind fit a managed device ([`AdmitRequest`],
//! [`AdmissionReport`]), and the modes admission decides by ([`AdmissionMode`]).

use serde::{Deserialize, Serialize};

use crate::{ByteRate, ByteSize};

/// A capacity-planning question for one managed device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmitRequest {
    /// The device: NAME, /dev/NAME or MAJOR:MINOR. abissd looks up no other path for a client
    /// (abissctl resolves paths to MAJOR:MINOR itself).
    pub device: String,
    /// Mean rate of each stream.
    pub rate: ByteRate,
    /// Standard deviation of each stream's rate over a service window (variable bit rate);
    /// 0 for a constant rate.
    #[serde(default)]
    pub rate_stdev: ByteRate,
    /// Playout buffer of each stream (its loads are a third of it).
    pub buffer: ByteSize,
    /// Pages per credit step of each stream ([`DEFAULT_BATCH_PAGES`](crate::DEFAULT_BATCH_PAGES) if not given): loads
    /// are whole batches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_pages: Option<u32>,
    /// Streams of this kind to evaluate next to those already admitted.
    pub count: Option<u32>,
    /// Admission mode to answer for (the daemon's own if not given).
    pub mode: Option<AdmissionMode>,
    /// Recording streams (written) instead of playback (read).
    #[serde(default)]
    pub write: bool,
}

/// How abissd decides whether streams fit a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdmissionMode {
    /// The worst-case service time of a window (longest seek, whole revolution, slowest zone)
    /// must fit: no miss is possible.
    Deterministic,
    /// The probability that a window's work overruns (TRAC) must stay at most `p_req`.
    Statistical,
    /// Everything is admitted (for measurements only).
    Off,
}

impl std::fmt::Display for AdmissionMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Deterministic => "deterministic",
            Self::Statistical => "statistical",
            Self::Off => "off",
        })
    }
}

impl std::str::FromStr for AdmissionMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "deterministic" => Ok(Self::Deterministic),
            "statistical" => Ok(Self::Statistical),
            "off" => Ok(Self::Off),
            _ => Err(format!(
                "'{s}' is not an admission mode (deterministic, statistical or off)"
            )),
        }
    }
}

/// The answer to [`AdmitRequest`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdmissionReport {
    /// The device's name.
    pub device: String,
    /// The mode answered for.
    pub mode: AdmissionMode,
    /// The miss probability admission allows per service window.
    pub p_req: f64,
    /// The service window, ms.
    pub window_ms: u64,
    /// Share of the device's time real-time streams may use, percent.
    pub realtime_share_percent: u32,
    /// Where the figures come from (a measured model, or the configured capacity).
    pub model_source: String,
    /// Streams already admitted on the device.
    pub admitted_streams: u32,
    /// Their predicted miss probability (`None` without a model).
    pub current_miss_probability: Option<f64>,
    /// How many streams of the kind asked about fit next to them (`None`: admission is off).
    pub n_max: Option<u32>,
    /// The streams asked about (`count`).
    pub count: Option<u32>,
    /// Predicted probability that a read waits with `count` more such streams: that the
    /// real-time backlog outgrows the least buffered stream's slack (`None` without a model).
    /// In deterministic mode a bound: 0 while the worst case fits, else 1.
    pub miss_probability: Option<f64>,
    /// Whether `count` more such streams would be admitted.
    pub fits: Option<bool>,
    /// TRAC's per-window overcommit probability with `count` more such streams: that a
    /// service window's work exceeds the real-time share (`None` without a model). The miss
    /// probability above also counts what the playout buffers absorb.
    #[serde(default)]
    pub window_overrun_probability: Option<f64>,
    /// The mean disk time a service window would take with `count` more such streams, ms:
    /// what the model prices them at, beside the window's real-time share (`None` without a
    /// model).
    #[serde(default)]
    pub mean_work_ms: Option<f64>,
}
