//! The daemon's shape, checked: no two of its modules import each other, and no production
//! file grows past 600 lines. (Function length is clippy's `too_many_lines`, set to 80 in
//! `clippy.toml`.) The flow is meant to read one way: kernel events → typed events → the
//! controller → pure policy → actions; a cycle between two modules is where that breaks first.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 600;

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            found.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
    found
}

/// The module a file defines, as a path from the crate root (`policy::admission`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let relative = file
        .strip_prefix(src)
        .expect("under src")
        .with_extension("");
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The code of a file without comments and without its `#[cfg(test)]` module, which may use
/// anything.
fn production_code(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or(text);
    code.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules `code` (in module `here`) names through `crate::` or `super::` paths, resolved
/// to the longest module that exists.
fn imports(code: &str, here: &[String], modules: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let mut found = BTreeSet::new();
    let words: Vec<&str> = code
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("crate::") || w.starts_with("super::"))
        .collect();
    for word in words {
        let mut path: Vec<String> = Vec::new();
        let mut segments = word.split("::").filter(|s| !s.is_empty()).peekable();
        if segments.peek() == Some(&"crate") {
            segments.next();
        } else {
            path = here.to_vec();
            while segments.peek() == Some(&"super") {
                segments.next();
                path.pop();
            }
        }
        path.extend(segments.map(str::to_owned));
        while !path.is_empty() && !modules.contains(&path) {
            path.pop();
        }
        if !path.is_empty() && path != here {
            found.insert(path);
        }
    }
    found
}

#[test]
fn no_two_daemon_modules_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = sources(&src);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(&src, f)).collect();
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for file in &files {
        let here = module_of(&src, file);
        let code = production_code(&fs::read_to_string(file).expect("read"));
        graph.insert(here.clone(), imports(&code, &here, &modules));
    }
    assert!(
        graph
            .get(&vec!["controller".to_owned()])
            .is_some_and(|i| i.contains(&vec!["streams".to_owned()])),
        "the import scan finds nothing: {graph:?}"
    );
    let mut cycles = Vec::new();
    for (module, uses) in &graph {
        for other in uses {
            if module < other && graph.get(other).is_some_and(|back| back.contains(module)) {
                cycles.push(format!("{} <-> {}", module.join("::"), other.join("::")));
            }
        }
    }
    assert!(
        cycles.is_empty(),
        "modules importing each other: {cycles:?}"
    );
}

#[test]
fn no_daemon_file_is_over_600_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let long: Vec<String> = sources(&src)
        .into_iter()
        .filter_map(|file| {
            let lines = fs::read_to_string(&file).expect("read").lines().count();
            (lines > MAX_FILE_LINES).then(|| format!("{}: {lines}", file.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_FILE_LINES} lines: {long:?}"
    );
}
