//! The `ucx_message` fuzz target under `cargo test`, on a stable toolchain and without UCX:
//! replays the committed corpus (`fuzz/corpus/ucx_message/`) and seeded mutations of it
//! through the entry point cargo-fuzz calls, [`velo_ucx::fuzzing::ucx_messages`].
//!
//! A failure prints the seed and input number and the input in hex, and saves the input under
//! `fuzz/artifacts/ucx_message/`; commit it to the corpus as a regression input.

use velo_ucx::fuzzing::ucx_messages;
use velo_wire::fuzzing::replay::Replay;

const REPLAY: Replay = Replay {
    target: "ucx_message",
    min_corpus_files: 5,
    generated: 20_000,
};

#[test]
fn committed_corpus_replays_without_breaking_the_receive_order() {
    let files = REPLAY.corpus(ucx_messages);
    println!("corpus: {files} message sequences");
}

#[test]
fn seeded_mutations_of_the_corpus_never_break_the_receive_order() {
    let seed = REPLAY.mutations(ucx_messages);
    println!("seed {seed:#018x}: {} inputs", REPLAY.generated);
}
