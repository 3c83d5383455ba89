use super::*;
use proptest::prelude::*;

fn size(text: &str) -> u64 {
    text.parse::<ByteSize>().unwrap_or_else(|e| panic!("{e}")).0
}

fn rate(text: &str) -> u64 {
    text.parse::<ByteRate>().unwrap_or_else(|e| panic!("{e}")).0
}

#[test]
fn letters_alone_are_binary_as_in_fio_and_dd() {
    assert_eq!(size("64k"), 65_536);
    assert_eq!(size("64K"), 65_536);
    assert_eq!(size("512M"), 512 << 20);
    assert_eq!(size("512m"), 512 << 20);
    assert_eq!(size("4G"), 4 << 30);
    assert_eq!(size("1T"), 1 << 40);
    assert_eq!(rate("1m"), 1 << 20, "fio --rate=1m");
}

#[test]
fn iec_and_si_units_mean_what_they_say() {
    assert_eq!(size("564KiB"), 564 * 1024);
    assert_eq!(size("4Ki"), 4096);
    assert_eq!(size("1kB"), 1_000);
    assert_eq!(size("1KB"), 1_000);
    assert_eq!(size("1MB"), 1_000_000);
    assert_eq!(size("1GB"), 1_000_000_000);
    assert_eq!(size("2TB"), 2_000_000_000_000);
    assert_eq!(size("4096"), 4096);
    assert_eq!(size("4096B"), 4096);
    assert_eq!(size(" 16 MiB "), 16 << 20);
    assert_eq!(rate("1MiB/s"), 1_048_576);
    assert_eq!(rate("1MB/s"), 1_000_000);
    assert_eq!(rate("1000000"), 1_000_000);
    assert_eq!(rate("1000000/s"), 1_000_000);
    assert_eq!(rate("1MB"), 1_000_000, "a size without /s is per second");
}

#[test]
fn bit_rates_are_powers_of_1000_bits_over_eight() {
    assert_eq!(rate("8Mbit/s"), 1_000_000);
    assert_eq!(rate("1Gbit/s"), 125_000_000);
    assert_eq!(rate("100kbit/s"), 12_500);
    assert_eq!(rate("8bit/s"), 1);
    let one_bit = ByteRate::parse_written("1bit/s").unwrap();
    assert_eq!((one_bit.value(), one_bit.rounded_up()), (ByteRate(1), true));
    assert!(
        "8Mbit/s".parse::<ByteSize>().is_err(),
        "bits are rates only"
    );
}

#[test]
fn fractions_round_up_to_whole_bytes_and_say_so() {
    let written = "1.1MiB/s".parse::<Written<ByteRate>>().unwrap();
    assert_eq!(
        written.value(),
        ByteRate(1_153_434),
        "1.1 × 1048576 = 1153433.6"
    );
    assert_eq!(
        written.rounding_note().as_deref(),
        Some("rate 1.1MiB/s rounded up to 1153434 bytes/s")
    );
    let exact = "0.5G".parse::<Written<ByteSize>>().unwrap();
    assert_eq!(
        (exact.value(), exact.rounding_note()),
        (ByteSize(1 << 29), None)
    );
    assert_eq!(size("1.5MB"), 1_500_000);
    assert_eq!(size("0.5"), 1, "half a byte is a byte");
    assert_eq!(
        size("1.50000000000000000000000000k"),
        1536,
        "trailing zeros cost nothing"
    );
    assert_eq!(size(".5k"), 512);
}

#[test]
fn bad_quantities_are_refused_naming_the_input_and_the_units() {
    for bad in [
        "0",
        "0MB/s",
        "0.000",
        "-1MB/s",
        "abc",
        "1XB/s",
        "1mb/s",
        "1 GiB/h",
        "",
        ".",
        "1.2.3MB",
        "99999999999999999999",
        "20000000000GiB",
        "16777216TiB",
        "1.00000000000000000001k",
    ] {
        let error = bad.parse::<ByteRate>().unwrap_err();
        let message = error.to_string();
        assert!(
            message.starts_with(&format!("'{bad}' is not a valid rate (")),
            "{message}"
        );
        assert!(
            message.contains("Mbit/s") && message.contains("KiB"),
            "{message}"
        );
        assert_eq!(error.input(), bad);
    }
    let message = "1Q".parse::<ByteSize>().unwrap_err().to_string();
    assert!(message.contains("'Q' is not a unit"), "{message}");
    assert!(message.contains("64k = 65536"), "{message}");
    let message = "-4k".parse::<ByteSize>().unwrap_err().to_string();
    assert!(message.contains("negative"), "{message}");
    let message = "0k".parse::<ByteSize>().unwrap_err().to_string();
    assert!(message.contains("zero"), "{message}");
    let message = "17179869184G".parse::<ByteSize>().unwrap_err().to_string();
    assert!(
        message.contains("more than 18446744073709551615 bytes"),
        "{message}"
    );
}

#[test]
fn the_largest_value_parses_and_one_more_does_not() {
    assert_eq!(size(&u64::MAX.to_string()), u64::MAX);
    assert!(format!("{}", u128::from(u64::MAX) + 1)
        .parse::<ByteSize>()
        .is_err());
    // 2^64 - 10.995… bytes, rounded up.
    assert_eq!(size("16777215.99999999999T"), u64::MAX - 9);
}

#[test]
fn display_picks_the_shortest_exact_text() {
    assert_eq!(ByteRate(1_000_000).to_string(), "1MB/s");
    assert_eq!(ByteRate(1_048_576).to_string(), "1MiB/s");
    assert_eq!(ByteRate(1_153_434).to_string(), "1.1MiB/s");
    assert_eq!(ByteSize(564 * 1024).to_string(), "564KiB");
    assert_eq!(ByteSize(4096).to_string(), "4KiB");
    assert_eq!(ByteSize(512).to_string(), "512B");
    assert_eq!(ByteSize(123_457).to_string(), "123457B");
    assert_eq!(ByteSize(0).to_string(), "0B");
    // Shown, not taken: see the crate's documentation.
    assert!("0B"
        .parse::<ByteSize>()
        .unwrap_err()
        .to_string()
        .contains("it is zero"));
    assert_eq!(format!("{:>8}|", ByteSize(1 << 20)), "    1MiB|");
    assert_eq!(Written::from(ByteSize(564 * 1024)).to_string(), "564KiB");
}

/// (unit text, bytes per unit as numerator / denominator) for the property tests.
const UNITS: [(&str, u128, u128); 14] = [
    ("", 1, 1),
    ("k", 1 << 10, 1),
    ("M", 1 << 20, 1),
    ("G", 1 << 30, 1),
    ("KiB", 1 << 10, 1),
    ("MiB", 1 << 20, 1),
    ("GiB", 1 << 30, 1),
    ("kB", 1_000, 1),
    ("MB", 1_000_000, 1),
    ("GB", 1_000_000_000, 1),
    ("bit/s", 1, 8),
    ("kbit/s", 1_000, 8),
    ("Mbit/s", 1_000_000, 8),
    ("Gbit/s", 1_000_000_000, 8),
];

#[test]
fn readable_is_exact_when_short_and_three_digits_rounded_down_otherwise() {
    assert_eq!(
        ByteSize(6_170_948 * 1024).readable(),
        "5.88GiB",
        "the status line of issue 38"
    );
    assert_eq!(ByteSize(564 * 1024).readable(), "564KiB");
    assert_eq!(ByteSize(1_000_000).readable(), "1MB");
    assert_eq!(ByteSize(1_153_434).readable(), "1.1MiB");
    assert_eq!(ByteSize(512).readable(), "512B");
    assert_eq!(ByteSize(1000).readable(), "1kB");
    assert_eq!(
        ByteSize(1023).readable(),
        "1023B",
        "below a KiB nothing rounds"
    );
    assert_eq!(ByteSize(0).readable(), "0B");
    assert_eq!(ByteSize(1_543_503_872).readable(), "1.43GiB");
    assert_eq!(
        ByteSize((1 << 30) + 1).readable(),
        "1GiB",
        "trailing zeros go"
    );
    assert_eq!(ByteSize(1023 * 1024 + 1000).readable(), "1023KiB");
    assert_eq!(ByteRate(87_654_321).readable(), "83.5MiB/s");
    assert_eq!(ByteRate(1_000_000).readable(), "1MB/s");
}

proptest! {
    #[test]
    fn readable_parses_back_to_at_most_the_value_and_within_one_percent(bytes in 1u64..=u64::MAX / 2) {
        let text = ByteSize(bytes).readable();
        let back = size(&text);
        prop_assert!(back <= bytes, "{text} is {back}, over {bytes}");
        prop_assert!(u128::from(back) * 100 >= u128::from(bytes) * 99, "{text} is {back}, 1% under {bytes}");
        let rate_text = ByteRate(bytes).readable();
        prop_assert_eq!(rate(&rate_text), back, "{}", rate_text);
    }
}

proptest! {
    #[test]
    fn display_parses_back_to_the_same_value(bytes in 1u64..=u64::MAX) {
        prop_assert_eq!(ByteSize(bytes).to_string().parse::<ByteSize>(), Ok(ByteSize(bytes)));
        prop_assert_eq!(ByteRate(bytes).to_string().parse::<ByteRate>(), Ok(ByteRate(bytes)));
    }

    #[test]
    fn small_values_display_parse_back_too(bytes in 1u64..5_000_000) {
        let shown = ByteSize(bytes).to_string();
        prop_assert_eq!(shown.parse::<ByteSize>(), Ok(ByteSize(bytes)));
        prop_assert!(shown.len() <= format!("{bytes}B").len(), "{} is longer than bytes", shown);
    }

    #[test]
    fn a_letter_is_1024_of_its_unit(n in 1u64..(1 << 20)) {
        prop_assert_eq!(size(&format!("{n}k")), n * 1024);
        prop_assert_eq!(size(&format!("{n}K")), size(&format!("{n}KiB")));
        prop_assert_eq!(size(&format!("{n}M")), n * 1024 * 1024);
        prop_assert_eq!(size(&format!("{n}m")), size(&format!("{n}MiB")));
        prop_assert_eq!(size(&format!("{n}G")), size(&format!("{n}k")) << 20);
        prop_assert_eq!(size(&format!("{n}kB")), n * 1000);
        prop_assert_eq!(size(&format!("{n}MB")), n * 1000 * 1000);
        prop_assert_eq!(rate(&format!("{n}k/s")), n * 1024);
        prop_assert_eq!(rate(&format!("{n}Mbit/s")), n * 125_000);
    }

    #[test]
    fn rounding_never_goes_down_nor_up_by_a_whole_byte(
        whole in 0u64..1_000_000,
        fraction in proptest::collection::vec(0u8..10, 0..8),
        unit in 0..UNITS.len(),
    ) {
        let (name, numerator, denominator) = UNITS[unit];
        let digits: String = fraction.iter().map(|d| char::from(b'0' + d)).collect();
        let text = if digits.is_empty() { format!("{whole}{name}") } else { format!("{whole}.{digits}{name}") };
        // The exact value is (whole.digits × numerator / denominator) bytes.
        let power = 10u128.pow(u32::try_from(digits.len()).unwrap());
        let decimal = u128::from(whole) * power + digits.parse::<u128>().unwrap_or(0);
        let exact_numerator = decimal * numerator;
        let exact_denominator = power * denominator;
        match text.parse::<Written<ByteRate>>() {
            Ok(written) => {
                let bytes = u128::from(written.value().0);
                prop_assert!(bytes * exact_denominator >= exact_numerator, "{} went down to {}", text, bytes);
                prop_assert!((bytes - 1) * exact_denominator < exact_numerator, "{} went up a byte to {}", text, bytes);
                prop_assert_eq!(written.rounded_up(), exact_numerator % exact_denominator != 0);
                prop_assert_eq!(written.rounding_note().is_some(), written.rounded_up());
            }
            Err(error) => {
                prop_assert_eq!(decimal, 0, "{} refused: {}", text, error);
                prop_assert!(error.to_string().contains("zero"));
            }
        }
    }

    #[test]
    fn any_text_is_a_value_or_a_sentence_naming_it(text in "\\PC{0,12}") {
        match text.parse::<ByteRate>() {
            Ok(rate) => prop_assert!(rate.0 > 0),
            Err(error) => {
                let named = format!("'{text}'");
                prop_assert!(error.to_string().contains(&named), "{}", error);
            }
        }
        if let Ok(size) = text.parse::<ByteSize>() {
            prop_assert!(size.0 > 0);
        }
    }
}
