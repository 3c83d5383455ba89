//! Byte sizes and byte rates as people write them: `564KiB`, `64k`, `1MB/s`, `1.1MiB/s`,
//! `8Mbit/s`, `1000000`. One parser for `abissctl`, `abissd`, the libraries and `abiss-lab`, so
//! a figure means the same wherever it is typed.
//!
//! | written | means |
//! | --- | --- |
//! | `4096`, `4096B` | bytes |
//! | `k` `K`, `m` `M`, `g` `G`, `t` `T` alone | powers of 1024, as in fio and dd: `64k` = 65 536, `512M` = 512 MiB |
//! | `KiB`, `MiB`, `GiB`, `TiB` (or `Ki`, `Mi`, `Gi`, `Ti`) | powers of 1024 |
//! | `kB` `KB`, `MB`, `GB`, `TB` | powers of 1000: `1MB` = 1 000 000 |
//! | a size then `/s`: `1MiB/s`, `1MB/s`, `64k/s` | a rate in bytes per second (a size without `/s` is per second too) |
//! | `bit/s`, `kbit/s`, `Mbit/s`, `Gbit/s`, `Tbit/s` | a rate in powers of 1000 bits per second, over 8: `8Mbit/s` = 1 000 000 B/s |
//!
//! A number may have a fraction (`0.5G`, `1.1MiB/s`): the arithmetic is exact decimal and the
//! result is rounded **up** to whole bytes, never down, so a rate is never less than asked.
//! [`Written`] keeps whether that happened, for a command line to say so once. Zero, negative
//! numbers, more than `u64::MAX` bytes, more than 19 decimals and unknown units are refused by a
//! [`QuantityError`] that names the input and the accepted units. Case matters only where it
//! must: `MB` and `Mbit` are units, `mB` and `mb` are not.
//!
//! [`Display`](fmt::Display) writes the shortest text that parses back to exactly the same
//! value, in explicit units only (`1MB`, `564KiB`, `1.1MiB`, `12345B`; rates add `/s`). Zero is
//! the one exception: it is shown (`0B`, as an empty budget or a stream that read nothing), and
//! refused when typed, because no setting takes a zero size or rate and a typed zero is a slip.
//! `readable()` is what people are shown: that text when it has at most three significant
//! digits, else three in KiB, MiB, GiB or TiB, rounded down (`6170948KiB` reads `5.88GiB`).
//!
//! Beside the units, the one sample [`quantile`] (nearest rank) the product crates and the lab
//! share: it lives in this small crate of figures so that the client library and abissctl
//! need not depend on the lab for it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

mod parse;
mod quantile;

use parse::Kind;
pub use quantile::quantile;

/// Why a size or a rate did not parse: one sentence with the input, the problem and the units
/// that would have been accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("'{input}' is not a valid {what} ({problem}); {accepted}")]
pub struct QuantityError {
    input: String,
    what: &'static str,
    problem: String,
    accepted: &'static str,
}

impl QuantityError {
    /// The text that did not parse.
    #[must_use]
    pub fn input(&self) -> &str {
        &self.input
    }
}

/// A number of bytes (positive when parsed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ByteSize(pub u64);

/// A byterate in bytes per second (positive when parsed).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct ByteRate(pub u64);

/// A size or a rate: what [`Written`] can hold.
pub trait Quantity: Copy + fmt::Display + private::Sealed {
    /// What it is called in messages: `size`, `rate`.
    const NAME: &'static str;
    /// The unit of [`bytes`](Quantity::bytes) in messages: `bytes`, `bytes/s`.
    const UNIT: &'static str;

    /// Parses `text`, keeping the text and whether the value was rounded up.
    fn parse_written(text: &str) -> Result<Written<Self>, QuantityError>;

    /// The whole bytes (per second).
    fn bytes(self) -> u64;
}

mod private {
    pub trait Sealed {}
    impl Sealed for super::ByteSize {}
    impl Sealed for super::ByteRate {}
}

impl Quantity for ByteSize {
    const NAME: &'static str = "size";
    const UNIT: &'static str = "bytes";

    fn parse_written(text: &str) -> Result<Written<Self>, QuantityError> {
        let parsed = parse::parse(text, Kind::Size)?;
        Ok(Written::parsed(text, Self(parsed.bytes), parsed.rounded_up))
    }

    fn bytes(self) -> u64 {
        self.0
    }
}

impl Quantity for ByteRate {
    const NAME: &'static str = "rate";
    const UNIT: &'static str = "bytes/s";

    fn parse_written(text: &str) -> Result<Written<Self>, QuantityError> {
        let parsed = parse::parse(text, Kind::Rate)?;
        Ok(Written::parsed(text, Self(parsed.bytes), parsed.rounded_up))
    }

    fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for ByteSize {
    type Err = QuantityError;

    /// Parses a size, rounding a fraction of a byte up (see the crate documentation).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_written(s).map(|written| written.value)
    }
}

impl FromStr for ByteRate {
    type Err = QuantityError;

    /// Parses a rate, rounding a fraction of a byte per second up (see the crate documentation).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_written(s).map(|written| written.value)
    }
}

impl ByteSize {
    /// As people read it: the exact [`Display`](fmt::Display) when that has at most three
    /// significant digits (`564KiB`, `1MB`), else three significant digits in KiB, MiB, GiB or
    /// TiB, rounded down (`5.88GiB`). It parses back to at most the value, less than 1% under.
    #[must_use]
    pub fn readable(self) -> String {
        parse::readable(self.0)
    }
}

impl ByteRate {
    /// As people read it: [`ByteSize::readable`] per second (`1MB/s`, `87.6MiB/s`), never more
    /// than the rate, so a free rate read from it is there to take.
    #[must_use]
    pub fn readable(self) -> String {
        format!("{}/s", parse::readable(self.0))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&parse::shortest(self.0))
    }
}

impl fmt::Display for ByteRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&format!("{}/s", parse::shortest(self.0)))
    }
}

/// A size or a rate as someone wrote it: the value, the text, and whether the text's exact
/// value was rounded up to whole bytes, so a command line can say so
/// ([`rounding_note`](Written::rounding_note)). Parses with [`FromStr`], as clap needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written<T> {
    text: String,
    value: T,
    rounded_up: bool,
}

impl<T: Quantity> Written<T> {
    fn parsed(text: &str, value: T, rounded_up: bool) -> Self {
        Self {
            text: text.trim().to_owned(),
            value,
            rounded_up,
        }
    }

    /// The value in whole bytes (per second).
    #[must_use]
    pub fn value(&self) -> T {
        self.value
    }

    /// The text as written (trimmed).
    #[must_use]
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether the written value had a fraction of a byte that was rounded up.
    #[must_use]
    pub fn rounded_up(&self) -> bool {
        self.rounded_up
    }

    /// `rate 1.1MiB/s rounded up to 1153434 bytes/s` when the value was rounded, else `None`.
    #[must_use]
    pub fn rounding_note(&self) -> Option<String> {
        self.rounded_up.then(|| {
            format!(
                "{} {} rounded up to {} {}",
                T::NAME,
                self.text,
                self.value.bytes(),
                T::UNIT
            )
        })
    }
}

/// A value nobody wrote (a default): its text is its [`Display`](fmt::Display), never rounded.
impl<T: Quantity> From<T> for Written<T> {
    fn from(value: T) -> Self {
        Self {
            text: value.to_string(),
            value,
            rounded_up: false,
        }
    }
}

impl<T: Quantity> FromStr for Written<T> {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        T::parse_written(s)
    }
}

/// The text as written.
impl<T> fmt::Display for Written<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.text)
    }
}

#[cfg(test)]
mod tests;
