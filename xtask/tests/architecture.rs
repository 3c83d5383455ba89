//! The workspace's shape, checked in every crate: no import cycle of any length between the
//! modules of a crate, and no source file over 600 lines but the few listed below with their
//! reason. (Function length is clippy's `too_many_lines`, set to 80 in `clippy.toml`.) In the
//! daemon the flow is meant to read one way: kernel events → typed events → the controller →
//! pure policy → actions; a cycle is where that breaks first.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 600;

/// Files allowed past [`MAX_FILE_LINES`], each with why. The list may only shrink (issue 34):
/// a file not named here that grows past the cap fails the test, and so does a listed file
/// that has come under it (take it off the list).
const LONG_FILES: &[(&str, &str)] = &[];

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is one level below the root")
        .to_path_buf()
}

/// The workspace's crates: its members, and the eBPF crate, which is a workspace of its own.
fn crates() -> Vec<String> {
    let manifest = fs::read_to_string(root().join("Cargo.toml")).expect("read Cargo.toml");
    let members = manifest
        .lines()
        .find(|line| line.trim_start().starts_with("members"))
        .expect("a members line");
    let mut crates: Vec<String> = members
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    crates.push("scheduler-ebpf".to_owned());
    crates
}

/// Every file under `dir` whose name ends in one of `extensions`, `target` left out.
fn files(dir: &Path, extensions: &[&str]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return found;
    };
    for entry in entries {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            if !path.ends_with("target") {
                found.extend(files(&path, extensions));
            }
        } else if path
            .extension()
            .is_some_and(|e| extensions.iter().any(|x| e == *x))
        {
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
    if parts
        .last()
        .is_some_and(|p| p == "mod" || p == "lib" || p == "main")
    {
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

/// The modules `code` (in module `here`) names through `crate::`, `super::` or `self::`
/// paths, resolved to the longest module that exists.
fn imports(code: &str, here: &[String], modules: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let mut found = BTreeSet::new();
    let words = code
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| {
            w.starts_with("crate::") || w.starts_with("super::") || w.starts_with("self::")
        });
    for word in words {
        let mut segments = word.split("::").filter(|s| !s.is_empty()).peekable();
        let mut path: Vec<String> = match segments.peek() {
            Some(&"crate") => {
                segments.next();
                Vec::new()
            }
            Some(&"self") => {
                segments.next();
                here.to_vec()
            }
            _ => {
                let mut path = here.to_vec();
                while segments.peek() == Some(&"super") {
                    segments.next();
                    path.pop();
                }
                path
            }
        };
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

/// The import graph of one crate's module tree (`src/`, its binaries in `src/bin` left out:
/// each is a crate of its own).
fn import_graph(krate: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let src = krate.join("src");
    let sources: Vec<PathBuf> = files(&src, &["rs"])
        .into_iter()
        .filter(|file| !file.starts_with(src.join("bin")))
        .collect();
    let modules: BTreeSet<Vec<String>> = sources.iter().map(|f| module_of(&src, f)).collect();
    sources
        .iter()
        .map(|file| {
            let here = module_of(&src, file);
            let code = production_code(&fs::read_to_string(file).expect("read"));
            let uses = imports(&code, &here, &modules);
            (here, uses)
        })
        .collect()
}

/// The strongly connected components of more than one module (Tarjan's algorithm): each is an
/// import cycle, of whatever length.
fn cycles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<String>> {
    struct Search<'g> {
        graph: &'g BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'g Vec<String>, usize>,
        low: BTreeMap<&'g Vec<String>, usize>,
        stack: Vec<&'g Vec<String>>,
        on_stack: BTreeSet<&'g Vec<String>>,
        found: Vec<Vec<String>>,
    }
    impl<'g> Search<'g> {
        fn visit(&mut self, module: &'g Vec<String>) {
            let next = self.index.len();
            self.index.insert(module, next);
            self.low.insert(module, next);
            self.stack.push(module);
            self.on_stack.insert(module);
            for other in self.graph.get(module).into_iter().flatten() {
                if !self.index.contains_key(other) {
                    self.visit(other);
                    let low = self.low[module].min(self.low[other]);
                    self.low.insert(module, low);
                } else if self.on_stack.contains(other) {
                    let low = self.low[module].min(self.index[other]);
                    self.low.insert(module, low);
                }
            }
            if self.low[module] == self.index[module] {
                let mut component = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    component.push(top.join("::"));
                    if top == module {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut search = Search {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for module in graph.keys() {
        if !search.index.contains_key(module) {
            search.visit(module);
        }
    }
    search.found
}

#[test]
fn the_cycle_search_finds_a_cycle_of_three() {
    let graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> =
        [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
            .into_iter()
            .map(|(from, to)| (vec![from.to_owned()], BTreeSet::from([vec![to.to_owned()]])))
            .collect();
    assert_eq!(cycles(&graph), vec![vec!["a", "b", "c"]]);
}

#[test]
fn no_crate_has_an_import_cycle() {
    let daemon = import_graph(&root().join("scheduler-user"));
    assert!(
        daemon
            .get(&vec!["controller".to_owned()])
            .is_some_and(|uses| uses.contains(&vec!["stream".to_owned()])),
        "the import scan finds nothing in the daemon: {daemon:?}"
    );
    let mut found = Vec::new();
    for krate in crates() {
        for cycle in cycles(&import_graph(&root().join(&krate))) {
            found.push(format!("{krate}: {}", cycle.join(" → ")));
        }
    }
    assert!(found.is_empty(), "import cycles: {found:#?}");
}

#[test]
fn no_source_file_is_over_600_lines_but_the_listed_ones() {
    let root = root();
    let mut long = Vec::new();
    let mut listed_but_short = Vec::new();
    for krate in crates() {
        for file in files(&root.join(&krate), &["rs", "c", "h", "sh", "py"]) {
            let lines = fs::read_to_string(&file).expect("read").lines().count();
            let name = file
                .strip_prefix(&root)
                .expect("under the root")
                .to_string_lossy()
                .into_owned();
            let listed = LONG_FILES.iter().any(|(path, _)| *path == name);
            if lines > MAX_FILE_LINES && !listed {
                long.push(format!("{name}: {lines}"));
            }
            if lines <= MAX_FILE_LINES && listed {
                listed_but_short.push(name);
            }
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_FILE_LINES} lines (split them by concept): {long:?}"
    );
    assert!(
        listed_but_short.is_empty(),
        "listed as long but no longer (take them off LONG_FILES): {listed_but_short:?}"
    );
}
