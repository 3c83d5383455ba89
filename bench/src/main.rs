//! `abiss-bench`: benchmarks on the lab's emulated disks (run through `cargo xtask bench`).
fn main() {
    eprintln!("abiss-bench: not written yet");
    std::process::exit(1);
}
