//! A worker and a frontend mux with lanes up, driven by an operation sequence decoded from
//! the input (application calls, transmits and deliveries, timers, lane failures, injected
//! peer bytes), with every invariant and bound checked after every operation.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    velo_mux::fuzzing::mux_ops(data);
});
