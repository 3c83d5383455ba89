//! The indexes the documents keep stay whole: every module of abissd is in the module map of
//! `docs/architecture.md`, every integration test file in the index of `tests/src/lib.rs`, and
//! every benchmark of `abiss-bench` in `bench/README.md`; and the other way round, every path
//! `docs/architecture.md` and `DEVELOPING.md` name in backticks is a file or folder of the
//! workspace, and every function `DEVELOPING.md` names is in its sources (`doc_index/stale.rs`).
//! An index that silently leaves out what was added since, or keeps what was renamed, is how
//! the old README's module table came to name files that no longer existed; this test names
//! what is missing or stale instead. Needs no root and no eBPF build.

use std::fs;
use std::path::{Path, PathBuf};

// A module of this test, not a test of its own (which a file beside this one would be).
#[path = "doc_index/stale.rs"]
mod stale;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|error| panic!("read {}: {error}", path.display()))
}

/// Sorted entries of `dir` (names only).
fn entries(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut found: Vec<(String, PathBuf)> = fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("read {}: {error}", dir.display()))
        .map(|entry| {
            let path = entry.expect("directory entry").path();
            let name = path
                .file_name()
                .expect("a named entry")
                .to_string_lossy()
                .into_owned();
            (name, path)
        })
        .collect();
    found.sort();
    found
}

fn is_rust(path: &Path) -> bool {
    path.extension().is_some_and(|extension| extension == "rs")
}

/// What `index` does not name as `` `name` ``, as one message per missing name.
fn missing<'a>(index: &str, names: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    names
        .into_iter()
        .filter(|name| !index.contains(&format!("`{name}`")))
        .cloned()
        .collect()
}

fn assert_named(index_file: &str, what: &str, missing: &[String]) {
    assert!(
        missing.is_empty(),
        "{index_file} does not name {what}: {}",
        missing.join(", ")
    );
}

/// The module files of abissd as the map names them, relative to `scheduler-user/src/`:
/// `daemon.rs`, a folder module as `controller/` and each file in it as `controller/access.rs`.
/// A folder's `mod.rs` is its folder's row; `*_tests.rs` files are their module's tests;
/// `lib.rs` is the crate.
fn daemon_modules(src: &Path, prefix: &str, into: &mut Vec<String>) {
    for (name, path) in entries(src) {
        if path.is_dir() {
            into.push(format!("{prefix}{name}/"));
            daemon_modules(&path, &format!("{prefix}{name}/"), into);
        } else if is_rust(&path)
            && name != "mod.rs"
            && name != "lib.rs"
            && !name.ends_with("_tests.rs")
        {
            into.push(format!("{prefix}{name}"));
        }
    }
}

#[test]
fn every_module_of_abissd_is_in_the_module_map() {
    let root = root();
    let mut modules = Vec::new();
    daemon_modules(&root.join("scheduler-user/src"), "", &mut modules);
    assert!(modules.len() > 20, "found only {modules:?}");
    let map = read(&root.join("docs/architecture.md"));
    assert_named(
        "docs/architecture.md",
        "these files or folders of scheduler-user/src/",
        &missing(&map, &modules),
    );
}

#[test]
fn every_integration_test_file_is_in_the_test_index() {
    let root = root();
    let tests = root.join("tests");
    let mut files: Vec<String> = entries(&tests.join("tests"))
        .into_iter()
        .filter(|(_, path)| is_rust(path))
        .map(|(name, _)| format!("tests/{name}"))
        .collect();
    files.extend(
        entries(&tests.join("src/bin"))
            .into_iter()
            .filter(|(_, path)| is_rust(path))
            .map(|(name, _)| format!("src/bin/{name}")),
    );
    assert!(files.len() > 10, "found only {files:?}");
    // The index is the crate's documentation: its `//!` lines.
    let index: String = read(&tests.join("src/lib.rs"))
        .lines()
        .filter(|line| line.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    assert_named(
        "tests/src/lib.rs (its //! index)",
        "these files of tests/",
        &missing(&index, &files),
    );
}

/// The variants of `enum NAME` in `source` as kebab-case subcommands, leaving out those hidden
/// with `#[command(hide = true)]`.
fn subcommands(source: &str, enum_name: &str) -> Vec<String> {
    let start = source
        .find(&format!("enum {enum_name} {{"))
        .unwrap_or_else(|| panic!("no `enum {enum_name}`"));
    let mut found = Vec::new();
    let mut depth = 0usize;
    let mut hidden = false;
    for line in source[start..].lines() {
        let trimmed = line.trim();
        if depth == 1 {
            if trimmed.starts_with("#[") && trimmed.contains("hide = true") {
                hidden = true;
            }
            let variant: String = trimmed
                .chars()
                .take_while(char::is_ascii_alphanumeric)
                .collect();
            if variant.starts_with(|c: char| c.is_ascii_uppercase()) {
                if !hidden {
                    found.push(kebab(&variant));
                }
                hidden = false;
            }
        }
        depth += line.matches(['{', '(']).count();
        depth -= line.matches(['}', ')']).count();
        if depth == 0 && line.contains('}') {
            break;
        }
    }
    found
}

/// Whether `text` has `command` as a whole command: `bench soak` in `bench soak-worker` or
/// `bench soaks` is another benchmark.
fn names_command(text: &str, command: &str) -> bool {
    text.match_indices(command).any(|(at, _)| {
        !text[at + command.len()..]
            .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

fn kebab(camel: &str) -> String {
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('-');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

#[test]
fn every_benchmark_is_in_the_bench_readme() {
    let root = root();
    let mut benchmarks = subcommands(&read(&root.join("bench/src/main.rs")), "Command");
    benchmarks.extend(subcommands(
        &read(&root.join("xtask/src/main.rs")),
        "Benchmark",
    ));
    benchmarks.sort();
    benchmarks.dedup();
    assert!(
        benchmarks.iter().any(|b| b == "reference")
            && !benchmarks.iter().any(|b| b == "soak-worker"),
        "the enums were not read right: {benchmarks:?}"
    );
    let readme = read(&root.join("bench/README.md"));
    let commands: Vec<String> = benchmarks
        .iter()
        .map(|name| format!("cargo xtask bench {name}"))
        .collect();
    let missing: Vec<String> = commands
        .into_iter()
        .filter(|command| !names_command(&readme, command))
        .collect();
    assert_named(
        "bench/README.md",
        "these benchmarks (as the command that runs them)",
        &missing,
    );
}
