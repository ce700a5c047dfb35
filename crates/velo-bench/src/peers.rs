//! The peer arms' binaries: each is built in its own cargo workspace under `peers/` (see
//! `peers/README.md`), so the orchestrator builds the ones it needs before the first run.
//!
//! `cargo build` decides whether a binary is missing or stale; on a fresh tree it takes a
//! second. The child's environment is cleaned first:
//!
//! - `RUSTFLAGS` (and its other forms) goes, so each workspace's own `.cargo/config.toml`
//!   applies: Dynamo's needs `--cfg tokio_unstable`, which a `RUSTFLAGS` would replace.
//! - The variables cargo sets for the binary it runs (`CARGO_PKG_NAME`, `CARGO_MANIFEST_DIR`,
//!   `OUT_DIR`, ...) go too: build scripts in the Dynamo tree (ring, aws-lc-sys) watch some of
//!   them with `rerun-if-env-changed`, so inheriting velo-bench's values would rebuild the
//!   tree every time it alternates with a build from a shell.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::arms::PeerBin;

/// Environment variables removed from the child `cargo build`: the first three would replace
/// the workspace's rustflags, the next two would move its binaries, the rest are what cargo
/// sets for a binary it runs (see [`scrubbed`] for the prefixes).
const SCRUBBED_ENV: [&str; 10] = [
    "RUSTFLAGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_BUILD_RUSTFLAGS",
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET_DIR",
    "CARGO_CRATE_NAME",
    "CARGO_BIN_NAME",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "OUT_DIR",
];

/// Prefixes of the variables cargo sets for a binary it runs.
const SCRUBBED_PREFIXES: [&str; 2] = ["CARGO_PKG_", "CARGO_MANIFEST_"];

/// Whether the child `cargo build` must not inherit variable `name`.
fn scrubbed(name: &str) -> bool {
    SCRUBBED_ENV.contains(&name) || SCRUBBED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The `peers/` directory of this source tree.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../peers")
}

/// Where `bin` lands when built with cargo profile `profile`.
pub fn binary_path(bin: PeerBin, profile: &str) -> PathBuf {
    let dir = match profile {
        "dev" | "test" => "debug",
        "bench" => "release",
        other => other,
    };
    root()
        .join(bin.workspace)
        .join("target")
        .join(dir)
        .join(bin.binary)
}

/// Builds `bin` with `profile` if it is missing or stale, printing that it does so on
/// stderr (with cargo's own output), and returns its path.
///
/// # Errors
///
/// Cargo could not run or failed; the message names the command to rerun by hand.
pub fn ensure_built(bin: PeerBin, profile: &str) -> Result<PathBuf, String> {
    let dir = root().join(bin.workspace);
    let shown = format!(
        "(cd peers/{} && cargo build --locked --profile {profile} --bin {})",
        bin.workspace, bin.binary
    );
    eprintln!(
        "velo-bench: building the {} peer binary if missing or stale: {shown}",
        bin.workspace
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&dir)
        .args([
            "build",
            "--locked",
            "--profile",
            profile,
            "--bin",
            bin.binary,
        ])
        .arg("--target-dir")
        .arg(dir.join("target"))
        .stdin(Stdio::null())
        // Cargo reports on stderr; stdout stays the report's.
        .stdout(Stdio::from(std::io::stderr()));
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(scrubbed) {
            cmd.env_remove(name);
        }
    }
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run cargo for {shown}: {e}"))?;
    if !status.success() {
        return Err(format!("building the peer arms failed ({status}): {shown}"));
    }
    let path = binary_path(bin, profile);
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "{shown} succeeded but {} is missing",
            path.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arms::DYNAMO;

    #[test]
    fn profiles_map_to_cargo_target_directories() {
        let ends = |profile: &str, dir: &str| {
            binary_path(DYNAMO, profile).ends_with(format!("dynamo/target/{dir}/velo-bench-dynamo"))
        };
        assert!(ends("release", "release"));
        assert!(ends("dev", "debug"));
        assert!(ends("smoke", "smoke"));
    }

    #[test]
    fn rustflags_and_cargo_run_variables_are_scrubbed() {
        for name in [
            "RUSTFLAGS",
            "CARGO_PKG_NAME",
            "CARGO_MANIFEST_DIR",
            "OUT_DIR",
        ] {
            assert!(scrubbed(name), "{name}");
        }
        for name in ["CARGO", "CARGO_HOME", "PATH", "RUSTUP_TOOLCHAIN"] {
            assert!(!scrubbed(name), "{name}");
        }
    }
}
