//! One classic-plane connection's bytes as the frontend reads them (handshake, prologue, items,
//! sentinel), or the frontend's control messages as the worker reads them, in reads of any size.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    response_plane::fuzzing::classic_stream(data);
});
