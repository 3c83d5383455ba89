//! Sizes and rates as people read them, through the one parser's `readable()` forms
//! (`abiss-units`): what every command prints, so `status`, `list`, `top` and `doctor` agree.

use abiss_proto::ByteSize;

/// A signed byte count (a stream's credit): `-4KiB`, `1.1MiB`.
pub(crate) fn signed_size(bytes: i64) -> String {
    let magnitude = ByteSize(bytes.unsigned_abs()).readable();
    if bytes < 0 {
        format!("-{magnitude}")
    } else {
        magnitude
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_debt_keeps_its_sign() {
        assert_eq!(signed_size(-4096), "-4KiB");
        assert_eq!(signed_size(-(12 << 20)), "-12MiB");
        assert_eq!(signed_size(1_153_434), "1.1MiB");
        assert_eq!(signed_size(0), "0B");
    }
}
