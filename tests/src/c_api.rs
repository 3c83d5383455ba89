//! The C API: `libabiss.so` built, and its examples compiled against it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::workspace;

/// Builds `abiss-c` and returns the directory holding `libabiss.so`, with the `libabiss.so.0`
/// link that programs look for at run time (the library's SONAME; cargo makes only
/// `libabiss.so`, and ldconfig would make the link in an installed tree). `cargo xtask test`
/// builds only binaries, so the library is built here (quick when it is fresh); cargo's own
/// report says where it went.
#[must_use]
pub fn abiss_c_library() -> PathBuf {
    let output = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "-p", "abiss-c", "--message-format=json"])
        .arg("--manifest-path")
        .arg(workspace().join("Cargo.toml"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run cargo build -p abiss-c");
    assert!(output.status.success(), "cargo build -p abiss-c failed");
    let library = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .filter_map(|message| message["filenames"].as_array().cloned())
        .flatten()
        .filter_map(|name| name.as_str().map(PathBuf::from))
        .find(|name| name.file_name().is_some_and(|n| n == "libabiss.so"))
        .expect("cargo reported no libabiss.so");
    let dir = library.parent().expect("library dir").to_path_buf();
    let soname = dir.join("libabiss.so.0");
    if std::fs::symlink_metadata(&soname).is_err() {
        std::os::unix::fs::symlink("libabiss.so", &soname).expect("link libabiss.so.0");
    }
    dir
}

/// Compiles `abiss-c/examples/NAME.c` as strict C99 against the header and the library in
/// `library` (from [`abiss_c_library`]) into `dir`; returns the program's path.
#[must_use]
pub fn compile_c_example(name: &str, library: &Path, dir: &Path) -> PathBuf {
    let crate_dir = workspace().join("abiss-c");
    let program = dir.join(name);
    let output = Command::new("cc")
        .args([
            "-std=c99",
            "-Wall",
            "-Wextra",
            "-Wpedantic",
            "-Werror",
            "-O2",
        ])
        .arg("-I")
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("examples").join(format!("{name}.c")))
        .arg("-o")
        .arg(&program)
        .arg("-L")
        .arg(library)
        .arg("-labiss")
        .arg(format!("-Wl,-rpath,{}", library.display()))
        .output()
        .expect("run cc");
    assert!(
        output.status.success(),
        "cc {name}.c failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    program
}
