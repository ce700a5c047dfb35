//! The `handshake` fuzz target under `cargo test`, on a stable toolchain: replays the
//! committed corpus (`fuzz/corpus/handshake/`) and seeded mutations of it through the entry
//! point cargo-fuzz calls, [`velo_session::fuzzing::handshake`].
//!
//! A failure prints the seed and input number and the input in hex, and saves the input under
//! `fuzz/artifacts/handshake/`; commit it to the corpus as a regression input.

use velo_session::fuzzing::handshake;
use velo_wire::fuzzing::replay::Replay;

const REPLAY: Replay = Replay {
    target: "handshake",
    min_corpus_files: 5,
    generated: 2_000,
};

#[test]
fn committed_corpus_replays_and_every_lane_closes() {
    let total = std::cell::Cell::new(velo_session::fuzzing::Summary::default());
    let files = REPLAY.corpus(|input| {
        let s = handshake(input);
        let mut t = total.get();
        t.answered += s.answered;
        t.refused += s.refused;
        t.silent += s.silent;
        total.set(t);
    });
    let t = total.get();
    println!("corpus: {files} inputs, {t:?}");
    assert!(
        t.answered > 0 && t.refused > 0,
        "the corpus reaches answers and refusals: {t:?}"
    );
}

#[test]
fn seeded_mutations_of_the_corpus_replay_and_every_lane_closes() {
    let seed = REPLAY.mutations(|input| {
        handshake(input);
    });
    println!("seed {seed:#018x}: {} inputs", REPLAY.generated);
}
