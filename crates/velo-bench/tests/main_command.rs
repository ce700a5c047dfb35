//! The README's main-job command, `cargo run --release -p velo-bench`, names no binary: it
//! must keep resolving to the bench while the package has other binaries (`hostile`).

use std::process::Command;

#[test]
fn cargo_run_of_the_package_without_a_binary_name_runs_the_bench() {
    // The debug profile: `cargo test` has built it already, so this only resolves and runs.
    let out = Command::new(env!("CARGO"))
        .args(["run", "-q", "-p", "velo-bench", "--", "--help"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Compare response planes"), "{stdout}");
}
