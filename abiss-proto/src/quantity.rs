//! Byte sizes and byte rates as people write them: `564KiB`, `1MiB/s`, `1MB/s`, `1000000`.
//!
//! Binary prefixes (`Ki`, `Mi`, `Gi`) are powers of 1024, decimal ones (`k`/`K`, `M`, `G`) powers
//! of 1000, and a bare number is bytes. Zero, negative, fractional-byte and overflowing values
//! are refused with a message that names the input.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Why a quantity did not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("'{input}' is not a valid {what}: {reason}")]
pub struct QuantityError {
    input: String,
    what: &'static str,
    reason: &'static str,
}

fn multiplier(unit: &str) -> Option<u64> {
    Some(match unit {
        "" | "B" => 1,
        "k" | "K" | "kB" | "KB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        "Ki" | "KiB" => 1 << 10,
        "Mi" | "MiB" => 1 << 20,
        "Gi" | "GiB" => 1 << 30,
        _ => return None,
    })
}

fn parse_bytes(input: &str, what: &'static str) -> Result<u64, QuantityError> {
    let error = |reason| QuantityError {
        input: input.to_owned(),
        what,
        reason,
    };
    let text = input.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if text.starts_with('-') {
        return Err(error("it must be positive"));
    }
    if number.is_empty() {
        return Err(error("it must start with a number"));
    }
    let unit = unit.trim();
    let scale =
        multiplier(unit).ok_or_else(|| error("units are B, kB, MB, GB, KiB, MiB or GiB"))?;
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if fraction.contains('.') || (whole.is_empty() && fraction.is_empty()) {
        return Err(error("it must start with a number"));
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole
            .parse()
            .map_err(|_| error("the number is too large"))?
    };
    let mut bytes = whole
        .checked_mul(scale)
        .ok_or_else(|| error("the number is too large"))?;
    if !fraction.is_empty() {
        // Exact decimal arithmetic: 1.5MB is 1 500 000 bytes, not a float's approximation.
        let digits = u32::try_from(fraction.len()).map_err(|_| error("too many decimals"))?;
        let denominator = 10u64
            .checked_pow(digits)
            .ok_or_else(|| error("too many decimals"))?;
        let numerator: u64 = fraction.parse().map_err(|_| error("too many decimals"))?;
        let part = u128::from(numerator) * u128::from(scale);
        if part % u128::from(denominator) != 0 {
            return Err(error("it must be a whole number of bytes"));
        }
        let part = u64::try_from(part / u128::from(denominator))
            .map_err(|_| error("the number is too large"))?;
        bytes = bytes
            .checked_add(part)
            .ok_or_else(|| error("the number is too large"))?;
    }
    if bytes == 0 {
        return Err(error("it must be more than zero"));
    }
    Ok(bytes)
}

/// A positive number of bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_bytes(s, "size").map(Self)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_binary(f, self.0, "")
    }
}

/// A positive byterate in bytes per second.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct ByteRate(pub u64);

impl FromStr for ByteRate {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        let amount = text.strip_suffix("/s").unwrap_or(text);
        parse_bytes(amount, "rate").map(Self).map_err(|mut error| {
            s.clone_into(&mut error.input);
            error
        })
    }
}

impl fmt::Display for ByteRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_binary(f, self.0, "/s")
    }
}

fn write_binary(f: &mut fmt::Formatter<'_>, bytes: u64, suffix: &str) -> fmt::Result {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (size, name) in UNITS {
        if bytes >= size {
            #[expect(clippy::cast_precision_loss, reason = "a rounded figure for people")]
            let value = bytes as f64 / size as f64;
            return write!(f, "{value:.2}{name}{suffix}");
        }
    }
    write!(f, "{bytes}B{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn units_mean_what_they_say() {
        assert_eq!("1MiB/s".parse::<ByteRate>(), Ok(ByteRate(1_048_576)));
        assert_eq!("1MB/s".parse::<ByteRate>(), Ok(ByteRate(1_000_000)));
        assert_eq!("1000000".parse::<ByteRate>(), Ok(ByteRate(1_000_000)));
        assert_eq!("1.5MB/s".parse::<ByteRate>(), Ok(ByteRate(1_500_000)));
        assert_eq!("564KiB".parse::<ByteSize>(), Ok(ByteSize(564 * 1024)));
        assert_eq!("64k".parse::<ByteSize>(), Ok(ByteSize(64_000)));
        assert_eq!("4096".parse::<ByteSize>(), Ok(ByteSize(4096)));
    }

    #[test]
    fn bad_quantities_are_refused_with_the_input_named() {
        for bad in [
            "0",
            "0MB/s",
            "-1MB/s",
            "abc",
            "1XB/s",
            "",
            "1.2.3MB",
            "0.5",
            "99999999999999999999",
            "20000000000GiB",
        ] {
            let error = bad.parse::<ByteRate>().unwrap_err();
            assert!(error.to_string().contains(&format!("'{bad}'")), "{error}");
        }
    }

    proptest! {
        #[test]
        fn printed_sizes_in_bytes_parse_back(bytes in 1u64..u64::MAX / 2) {
            prop_assert_eq!(bytes.to_string().parse::<ByteSize>(), Ok(ByteSize(bytes)));
            prop_assert_eq!(format!("{bytes}B/s").parse::<ByteRate>(), Ok(ByteRate(bytes)));
        }
    }
}
