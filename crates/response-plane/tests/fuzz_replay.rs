//! The `prologue` and `classic_reader` fuzz targets under `cargo test`, on a stable
//! toolchain: replays their committed corpora (`fuzz/corpus/<target>/`) and seeded mutations
//! of them through the entry points cargo-fuzz calls, [`response_plane::fuzzing::parsers`]
//! and [`response_plane::fuzzing::classic_stream`].
//!
//! A failure prints the seed and input number and the input in hex, and saves the input under
//! `fuzz/artifacts/<target>/`; commit it to the corpus as a regression input.

use response_plane::fuzzing::{classic_stream, parsers};
use velo_wire::fuzzing::replay::Replay;

const PROLOGUE: Replay = Replay {
    target: "prologue",
    min_corpus_files: 5,
    generated: 20_000,
};

const CLASSIC: Replay = Replay {
    target: "classic_reader",
    min_corpus_files: 5,
    generated: 20_000,
};

#[test]
fn committed_prologue_corpus_replays_without_a_panic() {
    let files = PROLOGUE.corpus(parsers);
    println!("corpus: {files} inputs");
}

#[test]
fn seeded_mutations_of_the_prologue_corpus_never_panic() {
    let seed = PROLOGUE.mutations(parsers);
    println!("seed {seed:#018x}: {} inputs", PROLOGUE.generated);
}

#[test]
fn committed_classic_corpus_replays_within_the_message_bounds() {
    let files = CLASSIC.corpus(classic_stream);
    println!("corpus: {files} connections");
}

#[test]
fn seeded_mutations_of_the_classic_corpus_stay_within_the_message_bounds() {
    let seed = CLASSIC.mutations(classic_stream);
    println!("seed {seed:#018x}: {} inputs", CLASSIC.generated);
}

/// Found by the `prologue` target: `StreamAddress::token` took a leading `+` ("+0010..."
/// read as "00010...": `u128::from_str_radix` takes a sign), a second spelling of one token.
#[test]
fn regression_a_token_with_a_plus_sign_is_refused() {
    let input = std::fs::read(PROLOGUE.corpus_dir().join("token-with-plus-sign.bin"))
        .expect("the regression input is in the prologue corpus");
    parsers(&input);
}
