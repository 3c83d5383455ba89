//! `cargo xtask man`: the man pages and shell completions generated from the binaries' clap
//! definitions render with the real `man`, and the bash completion completes in a real bash.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use abiss_tests::Scratch;

/// Runs `cargo xtask man --out DIR` as a user would, from the workspace root.
fn generate(out: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["xtask", "man", "--out"])
        .arg(out)
        .output()
        .expect("run cargo xtask man");
    assert!(
        output.status.success(),
        "cargo xtask man failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `man -l PAGE`, rendered to plain text 100 columns wide.
fn render(page: &Path) -> Output {
    Command::new("man")
        .args(["-P", "cat", "-l"])
        .arg(page)
        .env("MANWIDTH", "100")
        // Plain text: man-db keeps bold and underline (as overstrikes) only when asked.
        .env_remove("MAN_KEEP_FORMATTING")
        .output()
        .expect("run man (cargo xtask setup installs man-db)")
}

/// Runs `script` in a bash that knows nothing but the completion file sourced first.
fn bash_with(completion: &Path, script: &str) -> String {
    let output = Command::new("bash")
        .args(["--norc", "--noprofile", "-c"])
        .arg(format!("source '{}'\n{script}", completion.display()))
        .output()
        .expect("run bash");
    assert!(
        output.status.success(),
        "bash failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// What the completion function of `program` offers for the words of `line`, the last one
/// being completed, as bash calls it on Tab.
fn complete(completion: &Path, program: &str, line: &[&str]) -> Vec<String> {
    let words = line
        .iter()
        .map(|w| format!("'{w}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let text = line.join(" ");
    let current = line.last().expect("a word");
    let previous = line.get(line.len().saturating_sub(2)).expect("a word");
    let script = format!(
        "COMP_WORDS=({words}); COMP_CWORD={}; COMP_LINE='{text}'; COMP_POINT={}\n\
         _{} '{program}' '{current}' '{previous}'\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        line.len() - 1,
        text.len(),
        program.replace('-', "__")
    );
    bash_with(completion, &script)
        .lines()
        .map(|l| l.trim().to_owned())
        .collect()
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("entry").path())
        .collect();
    files.sort();
    files
}

#[test]
fn man_pages_render_and_bash_completes_subcommands() {
    let out = Scratch::new_in("/tmp", "man-pages");
    generate(out.path());
    let man = out.path().join("man");

    // One page per program and per subcommand; every page renders without a warning.
    for expected in [
        "man1/abissctl.1",
        "man1/abissctl-top.1",
        "man1/abissctl-trace.1",
        "man1/abiss-lab.1",
        "man1/abiss-lab-up.1",
        "man8/abissd.8",
    ] {
        assert!(man.join(expected).is_file(), "{expected} is generated");
    }
    assert!(
        !man.join("man1/abiss-lab-serve.1").exists(),
        "the hidden `serve` has no page"
    );
    let pages: Vec<PathBuf> = files_in(&man.join("man1"))
        .into_iter()
        .chain(files_in(&man.join("man8")))
        .collect();
    for page in &pages {
        let output = render(page);
        let text = String::from_utf8_lossy(&output.stdout);
        let warnings = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{}: {warnings}", page.display());
        assert!(warnings.trim().is_empty(), "{}: {warnings}", page.display());
        assert!(
            text.contains("NAME") && text.contains("SYNOPSIS") && text.contains("OPTIONS"),
            "{}:\n{text}",
            page.display()
        );
    }
    let abissd = String::from_utf8_lossy(&render(&man.join("man8/abissd.8")).stdout).into_owned();
    assert!(abissd.starts_with("abissd(8)"), "{abissd}");
    assert!(
        abissd.contains("--device") && abissd.contains("--realtime-share"),
        "{abissd}"
    );
    let top =
        String::from_utf8_lossy(&render(&man.join("man1/abissctl-top.1")).stdout).into_owned();
    assert!(
        top.contains("--interval") && top.contains("--no-color"),
        "{top}"
    );

    // bash: the completion registers itself, and completes subcommands and options.
    let completions = out.path().join("completions");
    let abissctl = completions.join("bash/abissctl");
    let registered = bash_with(&abissctl, "complete -p abissctl");
    assert!(registered.contains("-F _abissctl abissctl"), "{registered}");
    assert_eq!(
        complete(&abissctl, "abissctl", &["abissctl", "tr"]),
        ["trace"]
    );
    assert!(complete(&abissctl, "abissctl", &["abissctl", "t"]).contains(&"top".to_owned()));
    assert!(
        complete(&abissctl, "abissctl", &["abissctl", "trace", "--dev"])
            .contains(&"--device".to_owned())
    );
    let abissd = completions.join("bash/abissd");
    assert!(complete(&abissd, "abissd", &["abissd", "--disa"]).contains(&"--disable".to_owned()));
    let lab = completions.join("bash/abiss-lab");
    assert_eq!(
        complete(&lab, "abiss-lab", &["abiss-lab", "val"]),
        ["validate"]
    );

    // zsh and fish files are there, named as their completion directories expect.
    for program in ["abissctl", "abissd", "abiss-lab"] {
        let zsh = std::fs::read_to_string(completions.join(format!("zsh/_{program}")))
            .expect("zsh completion");
        assert!(zsh.starts_with(&format!("#compdef {program}")), "{zsh}");
        let fish = std::fs::read_to_string(completions.join(format!("fish/{program}.fish")))
            .expect("fish completion");
        assert!(fish.contains(&format!("complete -c {program}")), "{fish}");
    }
}
