//! What a peer or a request hands response-plane to parse, picked by the first byte: a stream's
//! prologue, a typed item (MessagePack with field names, JSON), a stream address, the plane's
//! environment settings.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    response_plane::fuzzing::parsers(data);
});
