//! The README's main-job command, `cargo run --release -p velo-bench`, names no binary: it
//! must keep resolving to the bench while the package has other binaries (`hostile`).
//!
//! Checked in the package's metadata rather than by running `cargo run`: building the
//! binary again here would replace, in the shared target directory, the one another test
//! binary of this package was built with (with other features).

use std::process::Command;

#[test]
fn cargo_run_of_the_package_without_a_binary_name_runs_the_bench() {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--manifest-path",
        ])
        .arg(manifest)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let package = doc["packages"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "velo-bench"))
        .expect("the velo-bench package");
    let bins: Vec<&str> = package["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .filter(|t| {
            t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "bin"))
        })
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(bins.contains(&"velo-bench"), "{bins:?}");
    if bins.len() > 1 {
        assert_eq!(
            package["default_run"], "velo-bench",
            "`cargo run -p velo-bench` cannot choose among {bins:?}"
        );
    }
}
