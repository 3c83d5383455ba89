//! The other way round from the indexes: what `docs/architecture.md` and `DEVELOPING.md` name
//! in backticks must still be there. Every path (a file ending in `.rs`, `.md`, `.toml` or
//! `.sh`, or a folder) is a file or folder of the workspace, and every function `DEVELOPING.md`
//! names (`name(…)`, `Type::method`, `name` in `file.rs`, a bare lowercase name) is in the
//! workspace's Rust sources, as a grep would find it. A renamed module or function then fails
//! here, not in a reader's hands.

use std::path::Path;

use super::{entries, is_rust, read, root};

/// Every file and folder of the workspace as a path from its root (a folder with a trailing
/// `/`), leaving out build output (`target/`) and hidden folders (`.git/`).
fn workspace_paths(dir: &Path, prefix: &str, into: &mut Vec<String>) {
    for (name, path) in entries(dir) {
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if path.is_dir() {
            let folder = format!("{prefix}{name}/");
            into.push(folder.clone());
            workspace_paths(&path, &folder, into);
        } else {
            into.push(format!("{prefix}{name}"));
        }
    }
}

/// The workspace's crates: the folders at the root with a `Cargo.toml` (the eBPF crate, a
/// workspace of its own, among them).
fn crate_folders(root: &Path) -> Vec<String> {
    entries(root)
        .into_iter()
        .filter(|(_, path)| path.join("Cargo.toml").is_file())
        .map(|(name, _)| name)
        .collect()
}

/// Whether a backticked word is a path of the workspace: a relative path of the characters
/// paths here use that ends in `.rs`, `.md`, `.toml` or `.sh`, or in `/` (a folder). `NAME.rs`
/// (capitals: no Rust file is named so) is a placeholder, not a path.
fn is_workspace_path(word: &str) -> bool {
    let file_like = [".rs", ".md", ".toml", ".sh"]
        .iter()
        .any(|extension| word.ends_with(extension));
    let placeholder = word
        .rsplit('/')
        .next()
        .and_then(|name| name.strip_suffix(".rs"))
        .is_some_and(|stem| stem.chars().all(|c| c.is_ascii_uppercase() || c == '_'));
    (file_like || word.ends_with('/'))
        && !placeholder
        && !word.starts_with('/')
        && word.contains(|c: char| c.is_ascii_alphanumeric())
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./*".contains(c))
}

/// Whether `name` matches `pattern`, in which one `*` stands for any run of characters but `/`.
fn glob_matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            name.len() >= head.len() + tail.len()
                && name.starts_with(head)
                && name.ends_with(tail)
                && !name[head.len()..name.len() - tail.len()].contains('/')
        }
    }
}

/// Whether `word` names something in `paths`: a bare name (`mod.rs`, `block.rs`) any file or
/// folder of that name; a path (`policy/raise.rs`, `kernel/`) that path from the root, from a
/// crate's folder or from a crate's `src/` (the documents name abissd's modules from
/// `scheduler-user/src/`, as its module map does).
fn names_a_workspace_path(word: &str, paths: &[String], crates: &[String]) -> bool {
    let bare = !word.trim_end_matches('/').contains('/');
    if bare {
        return paths.iter().any(|path| {
            let name = path
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or(path);
            let name = if path.ends_with('/') {
                format!("{name}/")
            } else {
                name.to_owned()
            };
            glob_matches(word, &name)
        });
    }
    let mut bases = vec![String::new()];
    for krate in crates {
        bases.push(format!("{krate}/"));
        bases.push(format!("{krate}/src/"));
    }
    bases.iter().any(|base| {
        let pattern = format!("{base}{word}");
        paths.iter().any(|path| glob_matches(&pattern, path))
    })
}

/// The words of `text` in backticks, outside fenced blocks (whose fences are left out, so that
/// each of their lines is plain text).
fn backticked(text: &str) -> Vec<String> {
    let prose: String = text
        .lines()
        .filter(|line| !line.trim_start().starts_with("```"))
        .collect::<Vec<_>>()
        .join("\n");
    prose
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_path_the_documents_name_exists() {
    let root = root();
    let mut paths = Vec::new();
    workspace_paths(&root, "", &mut paths);
    assert!(
        paths
            .iter()
            .any(|path| path == "scheduler-user/src/daemon.rs"),
        "the workspace was not read right: {} paths",
        paths.len()
    );
    let crates = crate_folders(&root);
    assert!(
        crates.iter().any(|name| name == "scheduler-ebpf"),
        "found only the crates {crates:?}"
    );
    let mut stale = Vec::new();
    for document in ["docs/architecture.md", "DEVELOPING.md"] {
        let text = read(&root.join(document));
        let mut named: Vec<String> = backticked(&text)
            .into_iter()
            .filter(|word| is_workspace_path(word))
            .collect();
        assert!(named.len() > 10, "{document}: found only {named:?}");
        named.sort_unstable();
        named.dedup();
        stale.extend(
            named
                .into_iter()
                .filter(|word| !names_a_workspace_path(word, &paths, &crates))
                .map(|word| format!("{document}: `{word}`")),
        );
    }
    assert!(
        stale.is_empty(),
        "these paths the documents name are not in the workspace (renamed or removed?):\n{}",
        stale.join("\n")
    );
}

#[test]
fn the_path_check_knows_a_path_from_a_word() {
    assert!(is_workspace_path("policy/raise.rs"));
    assert!(is_workspace_path("disk/device/"));
    assert!(is_workspace_path("tests/tests/security*.rs"));
    assert!(is_workspace_path("bench/README.md"));
    assert!(!is_workspace_path("tests/tests/NAME.rs"));
    assert!(!is_workspace_path("/etc/abiss/abissd.toml"));
    assert!(!is_workspace_path("--rows"));
    assert!(!is_workspace_path("Controller::attach"));
    let paths: Vec<String> = [
        "scheduler-user/",
        "scheduler-user/src/",
        "scheduler-user/src/disk/",
        "scheduler-user/src/disk/managed.rs",
        "tests/tests/security_raises.rs",
    ]
    .map(str::to_owned)
    .to_vec();
    let crates = ["scheduler-user".to_owned(), "tests".to_owned()];
    for named in [
        "disk/managed.rs",
        "disk/",
        "managed.rs",
        "scheduler-user/src/disk/managed.rs",
        "tests/tests/security*.rs",
        "tests/security*.rs",
    ] {
        assert!(names_a_workspace_path(named, &paths, &crates), "{named}");
    }
    for stale in [
        "disks.rs",
        "disk/disks.rs",
        "kernel_events.rs",
        "disk/device/",
    ] {
        assert!(!names_a_workspace_path(stale, &paths, &crates), "{stale}");
    }
}

/// Whether `c` may be part of a Rust identifier.
fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Whether `text` has `word` with no identifier character right before or after it.
fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(at, _)| {
        !text[..at].ends_with(is_ident_char) && !text[at + word.len()..].starts_with(is_ident_char)
    })
}

/// Whether `source` defines the function (or macro) `name`.
fn defines_fn(source: &str, name: &str) -> bool {
    has_word(source, &format!("fn {name}")) || has_word(source, &format!("macro_rules! {name}"))
}

/// Whether `source` has an `impl` block for `type_name` (inherent or of a trait).
fn implements(source: &str, type_name: &str) -> bool {
    has_word(source, &format!("impl {type_name}")) || has_word(source, &format!("for {type_name}"))
}

/// A function a document names, and how sure the name is of being one.
#[derive(Debug, PartialEq)]
enum Named {
    /// `Type::method` or `Type::method(…)`: a method of that type.
    Method { type_name: String, name: String },
    /// `name(…)`, `path::name(…)`, `.name()`, `name!(…)`: a function of the workspace, or one
    /// of a dependency's that the workspace calls.
    Call(String),
    /// `name` in `` `file.rs` ``: a function defined in that file.
    In { name: String, file: String },
    /// A bare lowercase name (`answer`, `peer_uid`) or a module path ending in one
    /// (`abiss_os::sysfs::write_attr`): at least a word of the Rust sources.
    Word(String),
}

/// The functions `text` names in backticks: calls (`name(…)`), `Type::method`s, `name` followed
/// by `` in `file.rs` ``, and bare lowercase identifiers and paths. Attributes (`#[…]`),
/// tuples, placeholders in capitals and words with spaces before their `(` are left out.
fn named_functions(text: &str) -> Vec<Named> {
    let prose: String = text
        .lines()
        .filter(|line| !line.trim_start().starts_with("```"))
        .collect::<Vec<_>>()
        .join("\n");
    let pieces: Vec<&str> = prose.split('`').collect();
    let mut named = Vec::new();
    for (at, word) in pieces.iter().enumerate().skip(1).step_by(2) {
        let (path, call) = match word.split_once('(') {
            Some((path, _)) => (path.trim_end_matches('!'), true),
            None => (*word, false),
        };
        let path = path.trim_start_matches('.');
        if path.is_empty()
            || word.starts_with("#[")
            || !path.chars().all(|c| is_ident_char(c) || c == ':')
        {
            continue;
        }
        let mut segments = path.rsplit("::");
        let name = segments.next().unwrap_or(path).to_owned();
        let owner = segments.next();
        let lowercase = name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !lowercase {
            continue;
        }
        // `name` in `file.rs`: the text says where it is.
        let file = pieces
            .get(at + 1)
            .filter(|between| between.trim() == "in")
            .and_then(|_| pieces.get(at + 2))
            .filter(|file| is_rust(Path::new(file)));
        named.push(match (owner, file) {
            (Some(owner), _) if owner.starts_with(|c: char| c.is_ascii_uppercase()) => {
                Named::Method {
                    type_name: owner.to_owned(),
                    name,
                }
            }
            (None, Some(file)) if !call => Named::In {
                name,
                file: (*file).to_owned(),
            },
            _ if call => Named::Call(name),
            _ => Named::Word(name),
        });
    }
    named
}

/// Whether `named` is in `sources` (path and text of every Rust file of the workspace).
fn function_exists(named: &Named, sources: &[(String, String)]) -> bool {
    match named {
        Named::Method { type_name, name } => sources
            .iter()
            .any(|(_, text)| defines_fn(text, name) && implements(text, type_name)),
        Named::Call(name) => sources.iter().any(|(_, text)| {
            defines_fn(text, name)
                || text.contains(&format!(".{name}("))
                || text.contains(&format!("::{name}("))
        }),
        Named::In { name, file } => sources
            .iter()
            .any(|(path, text)| path.ends_with(file.as_str()) && defines_fn(text, name)),
        Named::Word(name) => sources.iter().any(|(_, text)| has_word(text, name)),
    }
}

#[test]
fn every_function_developing_md_names_exists() {
    let root = root();
    let mut paths = Vec::new();
    workspace_paths(&root, "", &mut paths);
    let sources: Vec<(String, String)> = paths
        .into_iter()
        .filter(|path| is_rust(Path::new(path)))
        .map(|path| {
            let text = read(&root.join(&path));
            (path, text)
        })
        .collect();
    let named = named_functions(&read(&root.join("DEVELOPING.md")));
    assert!(
        named.iter().filter(|n| matches!(n, Named::Call(_))).count() > 5
            && named.iter().any(|n| matches!(n, Named::Method { .. }))
            && named.iter().any(|n| matches!(n, Named::In { .. })),
        "DEVELOPING.md was not read right: {named:?}"
    );
    let stale: Vec<String> = named
        .iter()
        .filter(|named| !function_exists(named, &sources))
        .map(|named| format!("{named:?}"))
        .collect();
    assert!(
        stale.is_empty(),
        "DEVELOPING.md names functions the workspace's sources do not have (renamed?):\n{}",
        stale.join("\n")
    );
}

#[test]
fn the_function_check_reads_names_as_meant() {
    let text = "a `Configuration::new(name, x)` in `abiss_row(name,\n  b)` and `.on_request()`; \
                `abiss_tests::require_root!();`, `the_test` in `a/b_tests.rs`, `Client::set_rate`, \
                `abiss_os::sysfs::write_attr`, `answer`, `#[repr(C)]`, `(u64, u8)`, `KERNEL_LAYOUT`, \
                `program::NAME`, `cargo xtask bench` (`--rows`)";
    let method = |type_name: &str, name: &str| Named::Method {
        type_name: type_name.to_owned(),
        name: name.to_owned(),
    };
    assert_eq!(
        named_functions(text),
        [
            method("Configuration", "new"),
            Named::Call("abiss_row".to_owned()),
            Named::Call("on_request".to_owned()),
            Named::Call("require_root".to_owned()),
            Named::In {
                name: "the_test".to_owned(),
                file: "a/b_tests.rs".to_owned()
            },
            method("Client", "set_rate"),
            Named::Word("write_attr".to_owned()),
            Named::Word("answer".to_owned()),
        ]
    );
    let sources = [(
        "x/src/a/b_tests.rs".to_owned(),
        "impl Client {\n    pub fn set_rate(&self) {}\n}\nfn the_test() {}\nlet y = x.answer(1);"
            .to_owned(),
    )];
    assert!(function_exists(&method("Client", "set_rate"), &sources));
    assert!(!function_exists(&method("Daemon", "set_rate"), &sources));
    assert!(function_exists(
        &Named::In {
            name: "the_test".to_owned(),
            file: "a/b_tests.rs".to_owned()
        },
        &sources
    ));
    assert!(function_exists(&Named::Call("answer".to_owned()), &sources));
    assert!(!function_exists(
        &Named::Call("set_rat".to_owned()),
        &sources
    ));
    assert!(!function_exists(
        &Named::Word("the_tes".to_owned()),
        &sources
    ));
}
