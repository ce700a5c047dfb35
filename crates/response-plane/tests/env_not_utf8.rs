//! A variable set to bytes that are not UTF-8 is a bad value, not an unset one: startup stops
//! naming it. One test in this binary: it changes the process environment.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

#[test]
fn a_variable_that_is_not_utf8_stops_startup_instead_of_meaning_unset() {
    // SAFETY: the only test of this binary; nothing else reads the environment meanwhile.
    unsafe { std::env::set_var("DYN_RESPONSE_PLANE", OsStr::from_bytes(b"velo\xff")) };
    let read = response_plane::ResponsePlaneConfig::from_env();
    let process = response_plane::env::var("DYN_RESPONSE_PLANE");
    // SAFETY: as above.
    unsafe { std::env::remove_var("DYN_RESPONSE_PLANE") };
    let error = read.expect_err("a bad value stops startup");
    assert!(
        error.to_string().contains("DYN_RESPONSE_PLANE"),
        "the error names the variable: {error}"
    );
    assert_eq!(process.as_deref(), Some("velo\u{fffd}"));
}
