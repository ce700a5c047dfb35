//! `profile`: where a frontend's CPU goes per token at plane saturation, by layer.
//!
//! Runs velo-bench's saturation table for one arm (the frontend pinned to one core, a fleet
//! that is not the limit), records the frontend process with `perf` for a few seconds in the
//! middle of the window, and sorts every sample into a layer by its deepest frame that names
//! one (the first matching rule of [`LAYERS`] from the leaf up). Each layer's share of the
//! samples times the run's frontend CPU per token gives its nanoseconds per token.
//!
//! Needs `perf` (linux-perf) and permission to record another process (root, or
//! `kernel.perf_event_paranoid` <= 1). Not part of `ci`: it measures, it checks nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cmd::Cmd;
use crate::{Result, flags};

/// Layers, matched against one frame at a time from the leaf towards the root; the first
/// rule (in this order) that a frame contains names the sample's layer.
const LAYERS: &[(&str, &str)] = &[
    (
        "Codec::decode",
        "typed decode (MessagePack, the item's allocations)",
    ),
    // Inlined into the client when `Codec::decode` is: its own frames still name it.
    (
        "response_plane::msgpack",
        "typed decode (MessagePack, the item's allocations)",
    ),
    (
        "rmp_serde",
        "typed decode (MessagePack, the item's allocations)",
    ),
    (
        "serde_core::de",
        "typed decode (MessagePack, the item's allocations)",
    ),
    (
        "drop_in_place<velo_bench::item::EngineOutput",
        "bench client: dropping items",
    ),
    (
        "drop_in_place<core::option::Option<core::result::Result<velo_bench::item::EngineOutput",
        "bench client: dropping items",
    ),
    ("hdrhistogram", "bench client: records and histograms"),
    (
        "velo_bench::frontend::Shared::record",
        "bench client: records and histograms",
    ),
    ("Registry::", "per request: register, send, accept"),
    (
        "FrontendPlane::register",
        "per request: register, send, accept",
    ),
    ("reqplane", "per request: register, send, accept"),
    ("serde_json", "per request: register, send, accept"),
    ("PendingResponse", "per request: register, send, accept"),
    ("RegistryAcceptor", "per request: register, send, accept"),
    ("Peer::deliver", "per request: register, send, accept"),
    (
        "RecvStream as core::ops::drop::Drop",
        "per request: stream release",
    ),
    (
        "drop_in_place<response_plane::stream::ResponseStream",
        "per request: stream release",
    ),
    (
        "ResponseStream<T> as core::ops::drop",
        "per request: stream release",
    ),
    (
        "RecvStream::poll_recv",
        "session: RecvStream (lock, take items, credit)",
    ),
    ("recv_all", "session: RecvStream (lock, take items, credit)"),
    ("ResponseStream", "response-plane: ResponseStream (other)"),
    ("handle_input", "mux input (frames, records, item copies)"),
    ("poll_transmit", "lane writer (grants, transmit)"),
    ("run_writer", "lane writer (grants, transmit)"),
    ("run_reader", "lane reader (socket reads)"),
    ("PeerState::dispatch", "session: dispatch and wakes"),
    ("wake_list", "session: dispatch and wakes"),
    ("Peer::with", "session: Peer::with (other)"),
    (
        "velo_bench::frontend",
        "bench client: per item (clock, bookkeeping)",
    ),
    (
        "velo_bench::adapter",
        "bench client: per item (clock, bookkeeping)",
    ),
    ("tokio::runtime::time", "tokio: timers"),
    ("tokio::runtime::io", "tokio: I/O driver (epoll)"),
    ("mio::", "tokio: I/O driver (epoll)"),
    ("wake_by", "tokio: wakers"),
    ("tokio::runtime", "tokio: scheduler"),
];

/// How long to wait for the bench's frontend process to appear.
const FIND_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Options {
    arm: String,
    secs: u64,
}

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Self> {
        let flags = flags::parse(args, &["arm", "secs"])?;
        let secs = match flags.get("secs") {
            None => 4,
            Some(v) => match v.parse() {
                Ok(s) if (1..=60).contains(&s) => s,
                _ => return Err(format!("--secs wants 1 to 60 seconds, not `{v}`").into()),
            },
        };
        Ok(Self {
            arm: flags
                .get("arm")
                .copied()
                .unwrap_or("velo-tcp-5ms")
                .to_owned(),
            secs,
        })
    }
}

pub(crate) fn run(opts: &Options) -> Result {
    Cmd::new("perf")
        .arg("--version")
        .read()
        .map_err(|e| format!("profile needs perf (apt install linux-perf): {e}"))?;
    let mut build = Cmd::cargo().args(["build", "--release", "-p", "velo-bench"]);
    if is_peer_arm(&opts.arm) {
        // The orchestrator builds the peer's own binary before its first run.
        build = build.args(["--features", "peers"]);
    }
    build.run()?;
    let release = crate::soak::target_dir().join("release");
    let data = release.join(format!("profile-{}.data", opts.arm));
    // Warm-up (2 s) and the wait below, then the recording, then a margin.
    let window = opts.secs + 8;
    let mut bench = Command::new(release.join("velo-bench"))
        .args([
            "--arms",
            &opts.arm,
            "--tables",
            "saturation",
            "--repeats",
            "1",
        ])
        .args(["--sat-duration", &window.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start velo-bench: {e}"))?;
    let recorded = record(&opts.arm, opts.secs, &data);
    let output = finish(&mut bench)?;
    recorded?;
    let us_per_token = fe_cpu_per_token(&output, &opts.arm)
        .ok_or("no `FE CPU us/tok` for the arm in velo-bench's saturation table")?;
    let script = Cmd::new("perf")
        .args(["script", "-F", "ip,sym,dso", "--no-inline", "-i"])
        .arg(data.display().to_string())
        .read()?;
    print!("{}", table(&opts.arm, us_per_token, &script));
    Ok(())
}

/// Whether `arm` runs a peer's binary (built with velo-bench's `peers` feature): its
/// frontend's samples use the same bench client, so the two tables compare layer by layer.
fn is_peer_arm(arm: &str) -> bool {
    arm.starts_with("velo-0.") || arm.starts_with("dynamo-")
}

/// Waits for the arm's frontend, lets the window start, and records it for `secs`.
fn record(arm: &str, secs: u64, data: &Path) -> Result {
    let started = Instant::now();
    let pid = loop {
        if let Some(pid) = frontend_pid(arm) {
            break pid;
        }
        if started.elapsed() > FIND_TIMEOUT {
            return Err(format!("no `velo-bench frontend --arm {arm}` process appeared").into());
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // Start-up and the 2 s warm-up, so the recording falls inside the measured window.
    std::thread::sleep(Duration::from_secs(4));
    Cmd::new("perf")
        .args([
            "record",
            "-e",
            "cpu-clock",
            "-F",
            "999",
            "-g",
            "--call-graph",
            "dwarf,16384",
        ])
        .args(["-p", &pid.to_string(), "-o", &data.display().to_string()])
        .args(["--", "sleep", &secs.to_string()])
        .run()
}

/// The pid of a process whose command line is `... velo-bench frontend --arm <arm> ...`.
fn frontend_pid(arm: &str) -> Option<u32> {
    let want = format!("frontend\0--arm\0{arm}\0");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline =
            std::fs::read(PathBuf::from("/proc").join(pid.to_string()).join("cmdline")).ok()?;
        String::from_utf8_lossy(&cmdline)
            .contains(want.as_str())
            .then_some(pid)
    })
}

fn finish(bench: &mut Child) -> Result<String> {
    let mut out = String::new();
    if let Some(mut stdout) = bench.stdout.take() {
        std::io::Read::read_to_string(&mut stdout, &mut out)?;
    }
    let status = bench.wait()?;
    if !status.success() {
        return Err(format!("velo-bench failed ({status})").into());
    }
    Ok(out)
}

/// The `FE CPU us/tok` of `arm`'s row in a Markdown table of `report`.
fn fe_cpu_per_token(report: &str, arm: &str) -> Option<f64> {
    let cells = |line: &str| -> Vec<String> {
        line.trim()
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_owned())
            .collect()
    };
    let header = report.lines().find(|l| l.contains("FE CPU us/tok"))?;
    let column = cells(header).iter().position(|c| c == "FE CPU us/tok")?;
    let row = report
        .lines()
        .find(|l| cells(l).first().is_some_and(|c| c == arm))?;
    cells(row).get(column)?.parse().ok()
}

/// The layer of one sample, from its frames (leaf first).
fn layer(frames: &[&str]) -> String {
    for f in frames {
        if let Some((_, name)) = LAYERS.iter().find(|(pattern, _)| f.contains(pattern)) {
            return (*name).to_owned();
        }
    }
    match frames.first() {
        Some(leaf) if leaf.contains("[kernel") => "kernel (other)".to_owned(),
        Some(leaf) => format!("other: {}", symbol(leaf)),
        None => "other: no frames".to_owned(),
    }
}

/// The symbol of a `perf script -F ip,sym,dso` frame line (`addr symbol (dso)`).
fn symbol(frame: &str) -> &str {
    let s = frame.split_once(' ').map_or(frame, |(_, rest)| rest);
    s.rsplit_once(" (").map_or(s, |(sym, _)| sym)
}

/// The per-layer table of a `perf script` dump.
fn table(arm: &str, us_per_token: f64, script: &str) -> String {
    let mut layers: BTreeMap<String, u64> = BTreeMap::new();
    let mut samples = 0u64;
    for sample in script.split("\n\n") {
        let frames: Vec<&str> = sample
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        if frames.is_empty() {
            continue;
        }
        samples += 1;
        *layers.entry(layer(&frames)).or_default() += 1;
    }
    let mut rows: Vec<_> = layers.into_iter().collect();
    rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut out = format!(
        "{arm} at saturation: {us_per_token:.3} us of frontend CPU per token, {samples} samples\n\n\
         | layer | share | ns/token |\n|---|---:|---:|\n"
    );
    #[allow(clippy::cast_precision_loss)]
    for (name, n) in rows {
        let share = n as f64 / samples.max(1) as f64;
        out.push_str(&format!(
            "| {name} | {:.1}% | {:.0} |\n",
            share * 100.0,
            share * us_per_token * 1000.0
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_goes_to_the_deepest_frame_that_names_a_layer() {
        let frames = [
            "97d6c _int_malloc (/usr/lib/libc.so.6)",
            "1234 bytes::bytes::Bytes::copy_from_slice (/x/velo-bench)",
            "5678 velo_mux::input::<impl velo_mux::mux::Mux>::handle_input (/x/velo-bench)",
            "9abc velo_session::peer::Peer::with (/x/velo-bench)",
        ];
        assert_eq!(layer(&frames), "mux input (frames, records, item copies)");
        let inlined_decode = [
            "1 core::str::converts::from_utf8 (/x)",
            "2 rmp_serde::decode::Deserializer<R,C>::any_inner (/x)",
            "3 velo_bench::frontend::request::serve::{{closure}} (/x)",
        ];
        assert_eq!(
            layer(&inlined_decode),
            "typed decode (MessagePack, the item's allocations)"
        );
        assert_eq!(
            layer(&["ffff do_syscall_64 ([kernel.kallsyms])"]),
            "kernel (other)"
        );
        assert_eq!(layer(&["12 memcpy (/usr/lib/libc.so.6)"]), "other: memcpy");
    }

    #[test]
    fn the_arms_frontend_cpu_per_token_is_read_from_its_row() {
        let report =
            "| arm | req/s | FE CPU us/tok |\n|---|---:|---:|\n| velo-tcp-5ms | 5 | 0.46 |\n";
        assert_eq!(fe_cpu_per_token(report, "velo-tcp-5ms"), Some(0.46));
        assert_eq!(fe_cpu_per_token(report, "tcp"), None);
    }

    #[test]
    fn shares_and_nanoseconds_per_token_add_up() {
        let script =
            "1 a::Codec::decode (/b)\n\n2 tokio::runtime::park (/b)\n\n3 x::Codec::decode (/b)\n\n";
        let t = table("arm", 0.3, script);
        assert!(
            t.contains("| typed decode (MessagePack, the item's allocations) | 66.7% | 200 |"),
            "{t}"
        );
        assert!(t.contains("| tokio: scheduler | 33.3% | 100 |"), "{t}");
    }
}
