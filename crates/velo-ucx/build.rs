//! Links the UCX libraries the `ucx1-sys` bindings need but do not name.
//!
//! `ucx1-sys` 0.1.0 emits `-lucp` only; `ucs_status_string` (and every other `ucs_*` symbol)
//! lives in `libucs`, which the linker does not reach through `libucp`'s own dependencies, so
//! the link fails with "undefined symbol: ucs_status_string" without this.
//!
//! It also warns about `ucx1-sys`'s bundled-UCX fallback: its build script tries to build a
//! bundled UCX 1.12.1 with autotools and ignores every failure. On a machine with `autoreconf`
//! that build succeeds, and the bindings are then generated from the bundled 1.12 headers while
//! the loader still picks the system `libucp.so.0` at run time. `velo-ucx` refuses to start on
//! such a header/library mismatch (see `sys::check_version`); this warning says why early.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_UCX").is_none() {
        return; // the default build links no native library
    }
    println!("cargo:rustc-link-lib=ucs");
    let autotools = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| dir.join("autoreconf").is_file())
    });
    if autotools {
        println!(
            "cargo:warning=autoreconf is installed: ucx1-sys may have built its bundled UCX \
             1.12.1 instead of binding the system UCX; velo-ucx checks the versions at start-up"
        );
    }
}
