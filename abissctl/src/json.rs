//! `--json` output: every command that has it prints one pretty-printed document.

use std::io::Write;

use serde::Serialize;

/// Writes `value` to `out` as pretty JSON and a newline; a closed pipe is not an error.
pub(crate) fn print(out: &mut impl Write, value: &impl Serialize) {
    let _ = writeln!(
        out,
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}
