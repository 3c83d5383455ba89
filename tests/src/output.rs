//! What a command printed: its JSON, its error sentence, the stream id `abissctl attach` gave.

use abiss_proto::StreamId;
use std::process::Output;

/// The stream id `abissctl attach` printed.
///
/// # Panics
/// If the attach failed (with its message) or printed no id.
#[must_use]
pub fn attached_id(output: &Output) -> StreamId {
    assert!(
        output.status.success(),
        "attach: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("abissctl attach prints the stream id")
}

/// The JSON a successful command printed (`abissctl … --json`); fails the test with the
/// command's stderr otherwise.
#[must_use]
pub fn json_of(output: &Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON")
}

/// A command's standard error as text.
#[must_use]
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts that a command failed as bad input must: exit code `code`, one sentence on
/// standard error (clap's pointer to `--help` aside) that mentions `needle`, and no panic.
///
/// # Panics
/// If it did not.
pub fn assert_fails(output: &Output, code: i32, needle: &str) {
    let message = stderr(output);
    assert_eq!(output.status.code(), Some(code), "exit code for: {message}");
    assert!(
        message.contains(needle),
        "message '{message}' should mention '{needle}'"
    );
    assert!(!message.contains("panicked"), "no panic: {message}");
    // clap follows a usage error with a blank line and a pointer to --help.
    let sentence = message
        .lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with("For more information"))
        .count();
    assert_eq!(sentence, 1, "one sentence: {message}");
}
