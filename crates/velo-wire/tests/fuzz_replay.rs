//! The `decode` fuzz target's checks under `cargo test`, on a stable toolchain: replays the
//! committed corpus of `fuzz/` and 20,000 seeded mutations of it through the same entry point
//! cargo-fuzz calls, [`velo_wire::fuzzing::decode_roundtrip`], which panics when a codec
//! promise breaks.
//!
//! A failure prints the seed and input number and the input in hex, and saves the input under
//! `fuzz/artifacts/decode/`; commit it to `fuzz/corpus/decode/` as a regression seed.

use velo_wire::fuzzing::decode_roundtrip;
use velo_wire::fuzzing::replay::Replay;

const REPLAY: Replay = Replay {
    target: "decode",
    min_corpus_files: 5,
    generated: 20_000,
};

#[test]
fn committed_corpus_replays_without_breaking_a_promise() {
    let files = REPLAY.corpus(|input| {
        decode_roundtrip(input);
    });
    println!("corpus: {files} files decoded and re-encoded canonically");
}

#[test]
fn seeded_mutations_of_the_corpus_never_break_a_promise() {
    let seed = REPLAY.mutations(|input| {
        decode_roundtrip(input);
    });
    println!("seed {seed:#018x}: {} inputs", REPLAY.generated);
}
