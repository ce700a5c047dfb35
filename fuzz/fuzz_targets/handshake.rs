//! Arbitrary bytes to a listening frontend until it closes: up to six connections through the
//! real accept loop (handshake reader, answer, attach, lane pumps and mux) on a paused clock,
//! checking that every lane closes and that all the frontend wrote is what a worker accepts.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    velo_session::fuzzing::handshake(data);
});
