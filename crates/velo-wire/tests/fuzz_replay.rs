//! The fuzz target's checks under `cargo test`, on a stable toolchain: replays the committed
//! corpus of `fuzz/` and 20,000 seeded mutations of it through the same entry point cargo-fuzz
//! calls, [`velo_wire::fuzzing::decode_roundtrip`], which panics when a codec promise breaks.
//!
//! A failure prints the seed and input number and the input in hex; turn the input into a
//! file in `fuzz/corpus/decode/` to keep it as a regression seed.

use std::fs;
use std::panic;
use std::path::{Path, PathBuf};

use velo_wire::HELLO_BODY_LEN;
use velo_wire::fuzzing::{FUZZ_MAX_FRAME_LEN, decode_roundtrip};

/// Fewer files than this means the corpus went missing, not that it is small by design.
const MIN_CORPUS_FILES: usize = 5;

/// Inputs generated per run.
const GENERATED_INPUTS: u32 = 20_000;

/// The fixed seed; `VELO_FUZZ_SEED` (decimal or `0x` hex) overrides it to explore further.
const DEFAULT_SEED: u64 = 0x7665_6c6f_5eed_f022;

/// One input in this many is pure random bytes rather than a mutated corpus entry.
const PURE_RANDOM_ONE_IN: usize = 8;

/// Longest pure random input, in bytes.
const MAX_RANDOM_LEN: usize = 64;

/// Most mutations stacked on one corpus entry.
const MAX_MUTATIONS: usize = 4;

/// Values that sit on a boundary somewhere in the codec: zero, varint continuation edges,
/// the largest lengths, a length of 32 MiB (the default frame limit), the HELLO body length
/// and the fuzz decoder's frame limit on either side.
const INTERESTING_U32: [u32; 9] = [
    0,
    1,
    0x7f,
    0x80,
    0xffff_ffff,
    0x0200_0000,
    HELLO_BODY_LEN,
    FUZZ_MAX_FRAME_LEN,
    FUZZ_MAX_FRAME_LEN + 1,
];

#[test]
fn committed_corpus_replays_without_breaking_a_promise() {
    let mut frames = 0;
    for (path, input) in corpus() {
        frames += check(&format!("corpus file {}", path.display()), &input);
    }
    println!("corpus: {frames} frames decoded and re-encoded canonically");
}

#[test]
fn seeded_mutations_of_the_corpus_never_break_a_promise() {
    let corpus: Vec<Vec<u8>> = corpus().into_iter().map(|(_, input)| input).collect();
    let seed = seed();
    let mut rng = XorShift64::new(seed);
    let (mut decoded, mut frames) = (0, 0);
    for i in 0..GENERATED_INPUTS {
        let input = generate(&mut rng, &corpus);
        let n = check(&format!("seed {seed:#018x}, input #{i}"), &input);
        decoded += usize::from(n > 0);
        frames += n;
    }
    println!(
        "seed {seed:#018x}: {GENERATED_INPUTS} inputs, {decoded} decoded at least one frame, \
         {frames} frames in all"
    );
}

/// Runs one input, printing what it was when the entry point panics; returns its frame count.
fn check(what: &str, input: &[u8]) -> usize {
    match panic::catch_unwind(|| decode_roundtrip(input)) {
        Ok(frames) => frames,
        Err(payload) => {
            eprintln!("decode_roundtrip panicked on {what}");
            eprintln!("input ({} bytes): {}", input.len(), hex(input));
            panic::resume_unwind(payload)
        }
    }
}

/// The corpus files, sorted by path so that generated inputs do not depend on directory order.
fn corpus() -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/decode");
    let entries = fs::read_dir(&dir).unwrap_or_else(|e| {
        panic!(
            "fuzz corpus directory {} is missing ({e}): it holds the seeds of the decode target",
            dir.display()
        )
    });
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.expect("corpus directory entries are readable").path();
        if path.is_file() {
            let input =
                fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            files.push((path, input));
        }
    }
    assert!(
        files.len() >= MIN_CORPUS_FILES,
        "fuzz corpus {} has {} files, expected at least {MIN_CORPUS_FILES}: is the corpus committed?",
        dir.display(),
        files.len()
    );
    files.sort();
    files
}

fn seed() -> u64 {
    let Ok(text) = std::env::var("VELO_FUZZ_SEED") else {
        return DEFAULT_SEED;
    };
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.unwrap_or_else(|e| panic!("VELO_FUZZ_SEED={text} is not a u64: {e}"))
}

/// A corpus entry with a few mutations, or now and then pure random bytes.
fn generate(rng: &mut XorShift64, corpus: &[Vec<u8>]) -> Vec<u8> {
    if rng.below(PURE_RANDOM_ONE_IN) == 0 {
        let len = rng.below(MAX_RANDOM_LEN + 1);
        return (0..len).map(|_| rng.byte()).collect();
    }
    let mut input = corpus[rng.below(corpus.len())].clone();
    for _ in 0..=rng.below(MAX_MUTATIONS) {
        mutate(rng, &mut input, corpus);
    }
    input
}

fn mutate(rng: &mut XorShift64, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    match rng.below(7) {
        0 if !input.is_empty() => {
            let i = rng.below(input.len());
            input[i] ^= 1 << rng.below(8);
        }
        1 => {
            let at = rng.below(input.len() + 1);
            input.insert(at, rng.byte());
        }
        2 if !input.is_empty() => {
            input.remove(rng.below(input.len()));
        }
        3 => input.truncate(rng.below(input.len() + 1)),
        4 => {
            // Splice: a prefix of this input, then a suffix (half the time all) of another.
            let other = &corpus[rng.below(corpus.len())];
            input.truncate(rng.below(input.len() + 1));
            let from = if rng.below(2) == 0 {
                0
            } else {
                rng.below(other.len() + 1)
            };
            input.extend_from_slice(&other[from..]);
        }
        5 if input.len() >= 5 => {
            // Make the first frame's length cover the rest, so a mutated body gets decoded.
            let body_len = u32::try_from(input.len() - 5).unwrap_or(u32::MAX);
            input[1..5].copy_from_slice(&body_len.to_le_bytes());
        }
        _ => {
            let value = INTERESTING_U32[rng.below(INTERESTING_U32.len())];
            let bytes = if rng.below(2) == 0 {
                value.to_le_bytes()
            } else {
                value.to_be_bytes()
            };
            if input.len() < 4 {
                input.extend_from_slice(&bytes);
            } else {
                // Half the time the frame header's length field, which matters most.
                let at = if input.len() >= 5 && rng.below(2) == 0 {
                    1
                } else {
                    rng.below(input.len() - 3)
                };
                input[at..at + 4].copy_from_slice(&bytes);
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Marsaglia's xorshift64: tiny, deterministic, good enough to pick mutations.
struct XorShift64(u64);

impl XorShift64 {
    fn new(seed: u64) -> Self {
        // Zero is the one state xorshift never leaves.
        Self(if seed == 0 { DEFAULT_SEED } else { seed })
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number in `0..n`; `n` must not be zero.
    fn below(&mut self, n: usize) -> usize {
        let n = u64::try_from(n).expect("usize fits in u64");
        usize::try_from(self.next() % n).expect("a value below a usize fits in usize")
    }

    fn byte(&mut self) -> u8 {
        self.next().to_le_bytes()[0]
    }
}
