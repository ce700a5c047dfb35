//! Whether the UCX library is installed, and what to do when it is not.

use std::path::Path;

use crate::Result;
use crate::cmd::Cmd;

/// Set to `1` (CI does) to fail instead of skipping UCX work when UCX is not found.
const REQUIRE_VAR: &str = "VELO_REQUIRE_UCX";

/// What to install to get UCX on Debian.
pub(crate) const INSTALL_HINT: &str = "apt-get install libucx-dev libclang-dev";

/// The UCX header the bindings are generated from.
const HEADER: &str = "/usr/include/ucp/api/ucp.h";

/// Whether to run UCX work: `Ok(true)` when UCX is found; otherwise prints `skip_note` and
/// returns `Ok(false)`, or fails when `VELO_REQUIRE_UCX=1`.
pub(crate) fn gate(skip_note: &str) -> Result<bool> {
    if found() {
        return Ok(true);
    }
    if std::env::var(REQUIRE_VAR).is_ok_and(|v| v == "1") {
        return Err(format!("UCX not found but {REQUIRE_VAR}=1 ({INSTALL_HINT})").into());
    }
    println!("{skip_note}");
    Ok(false)
}

/// `pkg-config --exists ucx`, or the header in its Debian location.
fn found() -> bool {
    Cmd::new("pkg-config").args(["--exists", "ucx"]).succeeds() || Path::new(HEADER).exists()
}
