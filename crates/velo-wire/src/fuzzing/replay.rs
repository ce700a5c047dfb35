//! Replaying a fuzz target under `cargo test`, on a stable toolchain: its committed corpus
//! (`fuzz/corpus/<target>/`) and seeded mutations of it, through the same entry point
//! cargo-fuzz calls. Every crate that owns a fuzz target runs both from its
//! `tests/fuzz_replay.rs`.
//!
//! A failing input is printed in hex together with its seed and number, and written to
//! `fuzz/artifacts/<target>/replay-<seed>-<n>`, so it can be replayed with
//! `cargo fuzz run <target> -s none <file>` and committed to the corpus as a regression input.

use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// The fixed seed; `VELO_FUZZ_SEED` (decimal or `0x` hex) overrides it to explore further.
pub const DEFAULT_SEED: u64 = 0x7665_6c6f_5eed_f022;

/// One input in this many is pure random bytes rather than a mutated corpus entry.
const PURE_RANDOM_ONE_IN: usize = 8;

/// Longest pure random input, in bytes.
const MAX_RANDOM_LEN: usize = 64;

/// Most mutations stacked on one corpus entry.
const MAX_MUTATIONS: usize = 4;

/// Kinds of mutation [`mutate`] picks from.
const MUTATION_KINDS: usize = 7;

/// Values that sit on a boundary somewhere: zero, varint continuation edges, the largest
/// lengths, 32 MiB (the default frame limit), the HELLO body length (58) and the 4 KiB
/// handshake frame limit on either side.
const INTERESTING_U32: [u32; 10] = [
    0,
    1,
    0x7f,
    0x80,
    0xffff_ffff,
    0x0200_0000,
    58,
    4096,
    4097,
    64 * 1024,
];

/// How a target is replayed.
#[derive(Debug, Clone, Copy)]
pub struct Replay {
    /// The cargo-fuzz target: its corpus is `fuzz/corpus/<target>/`.
    pub target: &'static str,
    /// Fewer corpus files than this means the corpus went missing, not that it is small.
    pub min_corpus_files: usize,
    /// Mutated inputs run by [`Replay::mutations`].
    pub generated: u32,
}

impl Replay {
    /// Runs every committed corpus file through `run`, sorted by name; returns how many.
    ///
    /// # Panics
    ///
    /// When the corpus is missing or smaller than [`min_corpus_files`](Self::min_corpus_files),
    /// and when `run` panics (after printing and saving the input).
    pub fn corpus(&self, run: impl Fn(&[u8])) -> usize {
        let files = self.files();
        for (path, input) in &files {
            self.check(&format!("corpus file {}", path.display()), input, &run);
        }
        files.len()
    }

    /// Runs [`generated`](Self::generated) seeded mutations of the corpus through `run`;
    /// returns the seed used.
    ///
    /// # Panics
    ///
    /// As [`corpus`](Self::corpus).
    pub fn mutations(&self, run: impl Fn(&[u8])) -> u64 {
        let corpus: Vec<Vec<u8>> = self.files().into_iter().map(|(_, input)| input).collect();
        let seed = seed();
        let mut rng = XorShift64::new(seed);
        for i in 0..self.generated {
            let input = generate(&mut rng, &corpus);
            self.check(&format!("seed {seed:#018x}, input #{i}"), &input, &run);
        }
        seed
    }

    /// The directory of this target's committed corpus.
    pub fn corpus_dir(&self) -> PathBuf {
        fuzz_dir().join("corpus").join(self.target)
    }

    /// Runs one input, printing and saving it when `run` panics.
    fn check(&self, what: &str, input: &[u8], run: &impl Fn(&[u8])) {
        if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(|| run(input))) {
            eprintln!("fuzz target `{}` failed on {what}", self.target);
            eprintln!("input ({} bytes): {}", input.len(), hex(input));
            let dir = fuzz_dir().join("artifacts").join(self.target);
            let name = what.replace([' ', ',', '#', '/'], "-");
            let path = dir.join(format!("replay-{name}"));
            if fs::create_dir_all(&dir)
                .and_then(|()| fs::write(&path, input))
                .is_ok()
            {
                eprintln!("saved as {}", path.display());
            }
            panic::resume_unwind(payload)
        }
    }

    /// The corpus files, sorted by path so generated inputs do not depend on directory order.
    fn files(&self) -> Vec<(PathBuf, Vec<u8>)> {
        let dir = self.corpus_dir();
        let entries = fs::read_dir(&dir).unwrap_or_else(|e| {
            panic!(
                "fuzz corpus directory {} is missing ({e}): it holds the seeds of target `{}`",
                dir.display(),
                self.target
            )
        });
        let mut files = Vec::new();
        for entry in entries {
            let path = entry.expect("corpus directory entries are readable").path();
            if path.is_file() {
                let input = fs::read(&path)
                    .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
                files.push((path, input));
            }
        }
        assert!(
            files.len() >= self.min_corpus_files,
            "fuzz corpus {} has {} files, expected at least {}: is the corpus committed?",
            dir.display(),
            files.len(),
            self.min_corpus_files
        );
        files.sort();
        files
    }
}

/// The cargo-fuzz crate: `fuzz/` at the repository root.
fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
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
    if corpus.is_empty() || rng.below(PURE_RANDOM_ONE_IN) == 0 {
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
    match rng.below(MUTATION_KINDS) {
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
            // Make a frame header's length cover the rest, so a mutated body gets decoded.
            let body_len = u32::try_from(input.len() - 5).unwrap_or(u32::MAX);
            input[1..5].copy_from_slice(&body_len.to_le_bytes());
        }
        _ => overwrite_interesting(rng, input),
    }
}

/// Writes a boundary value over four bytes (half the time at offset 1, a frame's length).
fn overwrite_interesting(rng: &mut XorShift64, input: &mut Vec<u8>) {
    let value = INTERESTING_U32[rng.below(INTERESTING_U32.len())];
    let bytes = if rng.below(2) == 0 {
        value.to_le_bytes()
    } else {
        value.to_be_bytes()
    };
    if input.len() < 4 {
        input.extend_from_slice(&bytes);
        return;
    }
    let at = if input.len() >= 5 && rng.below(2) == 0 {
        1
    } else {
        rng.below(input.len() - 3)
    };
    input[at..at + 4].copy_from_slice(&bytes);
}

/// `bytes` in lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Marsaglia's xorshift64: tiny, deterministic, good enough to pick mutations.
#[derive(Debug, Clone)]
pub struct XorShift64(u64);

impl XorShift64 {
    /// A generator starting from `seed` (zero, the one state xorshift never leaves, is
    /// replaced by [`DEFAULT_SEED`]).
    pub fn new(seed: u64) -> Self {
        Self(if seed == 0 { DEFAULT_SEED } else { seed })
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number in `0..n`; `n` must not be zero.
    pub fn below(&mut self, n: usize) -> usize {
        let n = u64::try_from(n).expect("usize fits in u64");
        usize::try_from(self.next_u64() % n).expect("a value below a usize fits in usize")
    }

    /// A random byte.
    pub fn byte(&mut self) -> u8 {
        self.next_u64().to_le_bytes()[0]
    }
}
