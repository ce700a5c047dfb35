//! Project automation for the velo workspace, in the cargo-xtask style: plain Rust, run with
//! `cargo xtask <command>`, no tools to install first. See `STYLE.md` section 7.
//!
//! Every command echoes the command lines it runs and exits non-zero with a message saying
//! what failed.

mod bench;
mod ci;
mod cmd;
mod faults;
mod flags;
mod flaky;
mod fuzz;
mod fuzz_smoke;
mod layers;
mod metadata;
mod profile;
mod serve_bench;
mod soak;
mod test_matrix;
mod ucx;

use std::process::ExitCode;

/// `hostile`: velo-bench's `hostile` binary, in release mode, at full scale; arguments pick
/// attacks by a part of their name.
fn hostile(rest: &[String]) -> Result {
    cmd::Cmd::cargo()
        .args([
            "run",
            "--release",
            "-p",
            "velo-bench",
            "--bin",
            "hostile",
            "--",
        ])
        .args(rest)
        .run()
}

/// Errors are reported once, by `main`; a boxed error is fine in a tool (STYLE.md section 6).
pub(crate) type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const HELP: &str = "\
cargo xtask <command>

Commands:
  ci                       fmt --check, clippy, doc, check-layers, test-matrix,
                           peers-smoke (velo-bench's smoke test with the peer arms), fuzz-smoke
  test-matrix              cargo test -p <crate> over each crate's feature sets
  check-layers             fail on dependency edges against the crate layering
  flaky [--runs N]         the test matrix N times (3) while one busy thread per core
                           competes with it: finds tests that depend on timing
  fuzz-smoke [--secs N]    replay every fuzz target's corpus under cargo test, then fuzz
                           each target N s (60, CI's budget) and print its exec count
  fuzz [--secs N | --runs N] [--target T]
                           a long local campaign: each target (or T) in turn for N s (600)
                           or N inputs; new inputs go to fuzz/target/campaign-corpus/
  bench [--save NAME | --baseline NAME]
                           criterion benches of velo-wire and velo-mux
  soak [--duration 10m] [--plane velo|tcp] [--concurrency N] [--summary PATH] [--faults]
                           random stream fates for a long time, RSS sampling, an oracle;
                           --faults also injects resets, cuts, stalls and proxy restarts
  faults [--planes velo,tcp] [--scenarios all|a,b] [--idle-ms 2000] [--slack-ms 1000]
         [--grace-ms 4000] [--logs DIR]
                           fault scenarios against both planes (kills, blackhole, zero
                           window, slow consumer, OPEN flood, 2% loss in namespaces, restart,
                           go-away): one table; fails on a hang or a bound exceeded
  serve-bench [--planes velo,tcp] [--concurrency N] [--rate R] [--duration S]
              [--workers N] [--isl N] [--osl N] [--speedup X]
                           velo-serve over HTTP per plane: a closed loop of N users and
                           an open Poisson loop at R req/s; TTFT, chunk gaps, ITL, tok/s,
                           errors, frontend CPU per token (HTTP vs plane)
  hostile [ATTACK...]      the hostile-peer suite: attacks on a TLS + secret frontend
                           over loopback beside a legitimate worker; one table (outcome,
                           peak connections and memory, the worker's success and ITL p99);
                           each ATTACK picks the attacks whose name contains it
  profile [--arm A] [--secs N]
                           where the frontend's CPU goes per token at plane saturation:
                           perf records arm A's frontend (velo-tcp-5ms) for N s (4); one
                           table of layers, share of samples and ns per token (needs perf)
  help                     print this help

Environment:
  VELO_REQUIRE_UCX=1       fail instead of skipping the UCX rows when UCX is not found
  VELO_REQUIRE_FUZZ=1      fail instead of only replaying when cargo-fuzz is not installed
  VELO_REQUIRE_NETNS=1     fail instead of skipping the netns topology tests when network
                           namespaces cannot be made (not root, no iproute2)
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<ExitCode> {
    let Some((command, rest)) = args.split_first() else {
        print!("{HELP}");
        return Ok(ExitCode::SUCCESS);
    };
    match command.as_str() {
        "help" | "--help" | "-h" => print!("{HELP}"),
        "ci" => {
            flags::parse(rest, &[])?;
            ci::run()?;
        }
        "test-matrix" => {
            flags::parse(rest, &[])?;
            test_matrix::run()?;
        }
        "check-layers" => {
            flags::parse(rest, &[])?;
            layers::run()?;
        }
        "flaky" => flaky::run(flaky::Options::parse(rest)?)?,
        "fuzz-smoke" => fuzz_smoke::run(fuzz_smoke::Options::parse(rest)?)?,
        "fuzz" => fuzz::campaign(&fuzz::Options::parse(rest)?)?,
        "bench" => bench::run(&bench::Options::parse(rest)?)?,
        "soak" => soak::run(&soak::Options::parse(rest)?)?,
        "serve-bench" => serve_bench::run(&serve_bench::Options::parse(rest)?)?,
        "faults" => faults::run(&faults::Options::parse(rest)?)?,
        "hostile" => hostile(rest)?,
        "profile" => profile::run(&profile::Options::parse(rest)?)?,
        other => {
            eprint!("{HELP}");
            return Err(format!("unknown command `{other}`").into());
        }
    }
    Ok(ExitCode::SUCCESS)
}
