//! Raw bytes into the frame decoder: it must never panic, and every frame that decodes must
//! re-encode to exactly the bytes it came from.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    velo_wire::fuzzing::decode_roundtrip(data);
});
