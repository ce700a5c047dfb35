//! The `mux` fuzz target under `cargo test`, on a stable toolchain: replays the committed
//! corpus (`fuzz/corpus/mux/`) and seeded mutations of it through the entry point cargo-fuzz
//! calls, [`velo_mux::fuzzing::mux_ops`], which panics when an invariant or bound breaks.
//!
//! A failure prints the seed and input number and the input in hex, and saves the input under
//! `fuzz/artifacts/mux/`; commit it to `fuzz/corpus/mux/` as a regression input.

use velo_mux::fuzzing::mux_ops;
use velo_wire::fuzzing::replay::Replay;

const REPLAY: Replay = Replay {
    target: "mux",
    min_corpus_files: 5,
    generated: 2_000,
};

#[test]
fn committed_corpus_replays_without_breaking_an_invariant() {
    let files = REPLAY.corpus(mux_ops);
    println!("corpus: {files} operation sequences");
}

#[test]
fn seeded_mutations_of_the_corpus_never_break_an_invariant() {
    let seed = REPLAY.mutations(mux_ops);
    println!("seed {seed:#018x}: {} inputs", REPLAY.generated);
}
