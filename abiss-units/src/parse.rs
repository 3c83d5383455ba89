//! From text to whole bytes: the number, the unit, and exact decimal arithmetic that rounds up.

use crate::QuantityError;

/// Whether a size or a rate is being read: they accept different units and say so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Size,
    Rate,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Size => "size",
            Self::Rate => "rate",
        }
    }

    /// What to write instead: the accepted units, in one clause.
    fn accepted(self) -> &'static str {
        match self {
            Self::Size => {
                "write a number, with a fraction if you like, and a unit: B or none for bytes, \
                 k, M, G, T or KiB, MiB, GiB, TiB for powers of 1024 (64k = 65536, as in fio and dd), \
                 kB, MB, GB, TB for powers of 1000"
            }
            Self::Rate => {
                "write a size per second such as 1MiB/s, 1.5MB/s or 64k/s (k, M, G, T and KiB, MiB, \
                 GiB, TiB are powers of 1024, kB, MB, GB, TB powers of 1000, a bare number is \
                 bytes per second) or a bit rate in bit/s, kbit/s, Mbit/s or Gbit/s"
            }
        }
    }
}

/// Why a text is not a quantity (the error adds the input and the accepted units).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Problem {
    Empty,
    Negative,
    NoNumber,
    TwoDecimalPoints,
    UnknownUnit(String),
    Zero,
    TooManyDecimals,
    TooLarge,
}

impl Problem {
    fn describe(&self, kind: Kind) -> String {
        match self {
            Self::Empty => "it is empty".to_owned(),
            Self::Negative => "it is negative".to_owned(),
            Self::NoNumber => "it does not start with a number".to_owned(),
            Self::TwoDecimalPoints => "its number has more than one decimal point".to_owned(),
            Self::UnknownUnit(unit) => format!("'{unit}' is not a unit"),
            Self::Zero => "it is zero".to_owned(),
            Self::TooManyDecimals => format!("it has more than {MAX_DECIMALS} decimals"),
            Self::TooLarge => match kind {
                Kind::Size => format!("it is more than {} bytes", u64::MAX),
                Kind::Rate => format!("it is more than {} bytes per second", u64::MAX),
            },
        }
    }
}

/// Decimals kept exactly; more are refused rather than silently cut.
const MAX_DECIMALS: usize = 19;

/// A whole number of bytes, and whether the text's exact value had to be rounded up to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bytes {
    pub(crate) bytes: u64,
    pub(crate) rounded_up: bool,
}

/// `whole.fraction` in decimal: the number as written, exactly.
#[derive(Clone, Copy, Debug)]
struct Decimal {
    whole: u128,
    fraction: u128,
    decimals: u32,
}

/// Bytes per unit as a fraction: `numerator / denominator` (the denominator is 8 for bits).
#[derive(Clone, Copy, Debug)]
struct Scale {
    numerator: u128,
    denominator: u128,
}

impl Scale {
    const fn bytes(numerator: u128) -> Self {
        Self {
            numerator,
            denominator: 1,
        }
    }

    const fn bits(numerator: u128) -> Self {
        Self {
            numerator,
            denominator: 8,
        }
    }
}

/// Reads `input` as a size or a rate, in whole bytes (per second), rounded up.
pub(crate) fn parse(input: &str, kind: Kind) -> Result<Bytes, QuantityError> {
    parse_problem(input.trim(), kind).map_err(|problem| QuantityError {
        input: input.to_owned(),
        what: kind.name(),
        problem: problem.describe(kind),
        accepted: kind.accepted(),
    })
}

fn parse_problem(text: &str, kind: Kind) -> Result<Bytes, Problem> {
    if text.is_empty() {
        return Err(Problem::Empty);
    }
    if text.starts_with('-') {
        return Err(Problem::Negative);
    }
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(end);
    let unit = unit.trim_start();
    let scale = match kind {
        Kind::Size => size_unit(unit),
        Kind::Rate => rate_unit(unit),
    };
    let number = decimal(number)?;
    let scale = scale.ok_or_else(|| Problem::UnknownUnit(unit.to_owned()))?;
    if number.whole == 0 && number.fraction == 0 {
        return Err(Problem::Zero);
    }
    let bytes = apply(number, scale)?;
    Ok(bytes)
}

fn decimal(number: &str) -> Result<Decimal, Problem> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if fraction.contains('.') {
        return Err(Problem::TwoDecimalPoints);
    }
    if whole.is_empty() && fraction.is_empty() {
        return Err(Problem::NoNumber);
    }
    // Trailing zeros carry no value: 1.50000000000000000000 is 1.5, not too many decimals.
    let fraction = fraction.trim_end_matches('0');
    if fraction.len() > MAX_DECIMALS {
        return Err(Problem::TooManyDecimals);
    }
    let whole = whole.trim_start_matches('0');
    let whole: u128 = if whole.is_empty() {
        0
    } else if whole.len() > 20 {
        return Err(Problem::TooLarge);
    } else {
        whole.parse().map_err(|_| Problem::TooLarge)?
    };
    if whole > u128::from(u64::MAX) {
        return Err(Problem::TooLarge);
    }
    Ok(Decimal {
        whole,
        fraction: if fraction.is_empty() {
            0
        } else {
            fraction.parse().map_err(|_| Problem::TooManyDecimals)?
        },
        decimals: u32::try_from(fraction.len()).map_err(|_| Problem::TooManyDecimals)?,
    })
}

/// Bytes in one of a size's units.
fn size_unit(unit: &str) -> Option<Scale> {
    let bytes = match unit {
        "" | "B" => 1,
        // Alone, the letters are binary, as fio, dd and the kernel's memparse read them.
        "k" | "K" | "Ki" | "KiB" => 1 << 10,
        "m" | "M" | "Mi" | "MiB" => 1 << 20,
        "g" | "G" | "Gi" | "GiB" => 1 << 30,
        "t" | "T" | "Ti" | "TiB" => 1 << 40,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => return None,
    };
    Some(Scale::bytes(bytes))
}

/// Bytes per second in one of a rate's units: a size per second, or bits per second.
fn rate_unit(unit: &str) -> Option<Scale> {
    // A size without `/s` is per second too: `1000000` has always meant 1 000 000 B/s.
    let per_second = unit.strip_suffix("/s").unwrap_or(unit);
    let bits = match per_second {
        "bit" => Some(1),
        "kbit" | "Kbit" => Some(1_000),
        "Mbit" => Some(1_000_000),
        "Gbit" => Some(1_000_000_000),
        "Tbit" => Some(1_000_000_000_000),
        _ => None,
    };
    // `5/s` (no unit before the `/s`) is bytes per second, as `5` and `5B/s` are.
    bits.map_or_else(|| size_unit(per_second), |bits| Some(Scale::bits(bits)))
}

/// `number × scale`, rounded up to whole bytes, without ever going through a float.
fn apply(number: Decimal, scale: Scale) -> Result<Bytes, Problem> {
    // The whole part and the fraction are scaled apart so no product can overflow u128:
    // whole < 2^64 and numerator <= 2^40; fraction < 10^19 and so is the decimals' power.
    let whole = number.whole * scale.numerator;
    let (whole_bytes, whole_rest) = (whole / scale.denominator, whole % scale.denominator);
    let power = 10u128.pow(number.decimals);
    let denominator = power * scale.denominator;
    let rest = whole_rest * power + number.fraction * scale.numerator;
    let (rest_bytes, remainder) = (rest / denominator, rest % denominator);
    let bytes = whole_bytes + rest_bytes + u128::from(remainder != 0);
    Ok(Bytes {
        bytes: u64::try_from(bytes).map_err(|_| Problem::TooLarge)?,
        rounded_up: remainder != 0,
    })
}

/// Units `Display` may write: explicit ones only, so what is printed reads the same to people
/// who take `k` for 1000.
const DISPLAY_UNITS: [(u64, &str); 8] = [
    (1 << 10, "KiB"),
    (1 << 20, "MiB"),
    (1 << 30, "GiB"),
    (1 << 40, "TiB"),
    (1_000, "kB"),
    (1_000_000, "MB"),
    (1_000_000_000, "GB"),
    (1_000_000_000_000, "TB"),
];

/// The shortest text that parses back to exactly `bytes`: `1MB`, `564KiB`, `1.1MiB` (which
/// rounds up to 1 153 434), else the plain number of bytes.
pub(crate) fn shortest(bytes: u64) -> String {
    let mut best = format!("{bytes}B");
    for (unit, name) in DISPLAY_UNITS {
        if let Some(text) = in_unit(bytes, unit, name) {
            if text.len() < best.len() {
                best = text;
            }
        }
    }
    best
}

/// The decimal with the fewest digits `d` such that `d × unit` rounds up to `bytes`, i.e.
/// `(bytes - 1) / unit < d <= bytes / unit`.
fn in_unit(bytes: u64, unit: u64, name: &str) -> Option<String> {
    let (bytes, unit) = (u128::from(bytes), u128::from(unit));
    if bytes == 0 {
        return None;
    }
    // 13 decimals resolve a byte in TiB (2^40 < 10^13), the largest unit.
    for decimals in 0..=13 {
        let power = 10u128.pow(decimals);
        let digits = bytes * power / unit;
        if digits * unit > (bytes - 1) * power {
            let (whole, fraction) = (digits / power, digits % power);
            let width = usize::try_from(decimals).unwrap_or(0);
            return Some(if decimals == 0 {
                format!("{whole}{name}")
            } else {
                format!("{whole}.{fraction:0width$}{name}")
            });
        }
    }
    None
}

/// Significant digits a person reads at a glance; more are rounded off (down) by [`readable`].
const READABLE_DIGITS: usize = 3;

/// Powers of 1024 [`readable`] rounds into, as `top` and `free -h` do.
const READABLE_UNITS: [(u64, &str); 4] = [
    (1 << 40, "TiB"),
    (1 << 30, "GiB"),
    (1 << 20, "MiB"),
    (1 << 10, "KiB"),
];

/// `bytes` for people: [`shortest`] when it has at most three significant digits (`564KiB`,
/// `1MB`, `1.1MiB`), else three significant digits (all of the whole part) in the largest power
/// of 1024 it reaches, rounded down: `6319050752` is `5.88GiB`. It parses back to at most
/// `bytes` and less than 1% under it, so a free rate read from it is never more than is free.
pub(crate) fn readable(bytes: u64) -> String {
    let exact = shortest(bytes);
    if significant_digits(&exact) <= READABLE_DIGITS {
        return exact;
    }
    let Some((unit, name)) = READABLE_UNITS.into_iter().find(|(unit, _)| bytes >= *unit) else {
        return exact;
    };
    let whole = bytes / unit;
    let whole_digits = whole.to_string().len();
    let decimals = READABLE_DIGITS.saturating_sub(whole_digits);
    let power = 10u128.pow(u32::try_from(decimals).unwrap_or(0));
    // Rounded down: whole units and the fraction's first `decimals` digits, no float.
    let fraction = u128::from(bytes % unit) * power / u128::from(unit);
    let digits = format!("{fraction:0decimals$}");
    let digits = digits.trim_end_matches('0');
    if digits.is_empty() {
        format!("{whole}{name}")
    } else {
        format!("{whole}.{digits}{name}")
    }
}

/// The digits of a number's text from the first non-zero one (`1.1MiB`: 2, `12345B`: 5).
fn significant_digits(text: &str) -> usize {
    text.chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .filter(char::is_ascii_digit)
        .skip_while(|c| *c == '0')
        .count()
}
