//! A peer's active messages as the UCX driver sees them (AM headers, eager payloads,
//! rendezvous announcements and completions in any order), through the header parser and
//! the receive FIFO, checked against a model of send order; and the sender's message split.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    velo_ucx::fuzzing::ucx_messages(data);
});
