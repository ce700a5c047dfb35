//! Runs arms: fresh frontend and worker processes per run ([`crate::roles`]), sampled by the
//! kernel's counters and the engines' own at the frontends' window lines
//! ([`crate::protocol`]).

mod window;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write as _};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use crate::arms::{Arm, PeerBin, Runner};
use crate::engine_stats::EngineStats;
use crate::frontend::{FrontendReport, Load};
use crate::netns::Netns;
use crate::protocol::{FrontendCommand, FrontendLine, WorkerCommand, WorkerLine};
use crate::roles::{FrontendArgs, Role, WorkerArgs};
use window::{Fleet, Tracker};

/// How every arm is run.
#[derive(Debug, Clone)]
pub struct RunOpts {
    /// How requests arrive (split evenly over the frontends).
    pub load: Load,
    /// Each measurement window.
    pub duration: Duration,
    /// Warm-up before the first window.
    pub warmup: Duration,
    /// Time a window's requests get to end before it is reported (an open loop's next rate
    /// runs meanwhile).
    pub settle: Duration,
    /// Mock engines in all, spread over the worker processes.
    pub workers: u32,
    /// Worker processes.
    pub worker_processes: u32,
    /// Frontend processes.
    pub frontends: u32,
    /// Prompt length.
    pub isl: u32,
    /// Output length.
    pub osl: u32,
    /// The mocker's speedup ratio.
    pub speedup: f64,
    /// Frontend runtime threads (1: a current-thread runtime).
    pub frontend_threads: u32,
    /// Pin the frontends to CPU 0 and the workers to CPU 1.
    pub pin: bool,
    /// The peer binaries, built ([`crate::peers::ensure_built`]) before the first run.
    pub peer_bins: BTreeMap<PeerBin, PathBuf>,
    /// Where child processes' logs go.
    pub log_dir: PathBuf,
    /// Every process in its own network namespace ([`Netns`]: frontends are its first hosts,
    /// workers the next), or all on loopback (`None`).
    pub netns: Option<Arc<Netns>>,
}

impl RunOpts {
    /// Engines per worker process (the total is rounded up to a multiple of the processes).
    pub fn engines_per_process(&self) -> u32 {
        self.workers.div_ceil(self.worker_processes.max(1)).max(1)
    }

    /// Frontend `i`'s share of the load.
    fn load_of(&self, i: u32) -> Load {
        let n = self.frontends.max(1);
        match &self.load {
            Load::Closed { concurrency } => Load::Closed {
                concurrency: concurrency / n + u32::from(i < concurrency % n),
            },
            Load::Open {
                rates,
                seed,
                max_in_flight,
            } => Load::Open {
                rates: rates.iter().map(|r| r / f64::from(n)).collect(),
                seed: seed.wrapping_add(u64::from(i)),
                max_in_flight: *max_in_flight,
            },
        }
    }

    /// The host (netns index) and address of frontend `i` or worker process `i`.
    fn host(&self, role: Source) -> (Option<usize>, IpAddr) {
        let i = match role {
            Source::Frontend(i) => i,
            Source::Worker(i) => self.frontends as usize + i,
        };
        match &self.netns {
            Some(n) => (Some(i), n.address(i)),
            None => (None, IpAddr::V4(Ipv4Addr::LOCALHOST)),
        }
    }
}

/// One window of one run of one arm, as measured.
#[derive(Debug, Clone, Default)]
pub struct Run {
    /// What the frontends measured (merged).
    pub report: FrontendReport,
    /// Frontend CPU over the window, seconds (every frontend).
    pub frontend_cpu_s: f64,
    /// All worker processes' CPU over the window, seconds.
    pub worker_cpu_s: f64,
    /// Time frontend threads were runnable but waited for a CPU, seconds.
    pub frontend_wait_s: f64,
    /// Time worker threads were runnable but waited for a CPU, seconds.
    pub worker_wait_s: f64,
    /// Packets sent over the window: TCP segments plus UDP datagrams, both directions.
    pub segments: u64,
    /// Of them, the packets the frontends sent (ACKs, credit), on the netns topology only
    /// (0 on loopback, where they cannot be told apart).
    pub frontend_segments: u64,
    /// The plane's connections at mid-window, counted as the arm says.
    pub connections: u64,
    /// Times a frontend thread blocked and was woken (voluntary context switches).
    pub frontend_wakeups: u64,
    /// Times a worker thread blocked and was woken.
    pub worker_wakeups: u64,
    /// Machine-wide soft-interrupt time over the window, seconds.
    pub softirq_s: f64,
    /// What the engines did over the window.
    pub engines: EngineStats,
}

/// Which child said a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    Frontend(usize),
    Worker(usize),
}

/// A child process of a run; its stdin takes the orchestrator's commands.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
}

/// Kills its children when dropped, so no run outlives its measurement.
#[derive(Default)]
struct Children(Vec<Proc>);

impl Drop for Children {
    fn drop(&mut self) {
        for p in &mut self.0 {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

/// Runs `arm` once with fresh processes, window after window, until every step of the load
/// has been measured or `keep_going` says no after a window; returns each window's run.
///
/// # Errors
///
/// A message saying which process failed, with its log's tail.
pub fn run_arm(
    arm: &Arm,
    opts: &RunOpts,
    repeat: u32,
    keep_going: &mut dyn FnMut(&Run) -> bool,
) -> Result<Vec<Run>, String> {
    let exe = executable(arm, opts)?;
    let log = |role: &str| {
        opts.log_dir
            .join(format!("{}-{repeat}-{role}.log", arm.name))
    };
    let (tx, lines) = mpsc::channel();
    let mut children = Children::default();
    let addresses = start_workers(&exe, arm, opts, &log, &tx, &lines, &mut children)?;
    let workers = children.0.len();
    let ports = start_frontends(&exe, arm, opts, addresses, &log, &tx, &lines, &mut children)?;
    drop(tx);
    let fleet = Fleet::new(arm.conns, &children.0, workers, ports, opts.netns.is_some());
    for p in &mut children.0[workers..] {
        command(p, &FrontendCommand::Go.to_string())?;
    }
    let steps = opts.load.steps();
    let windows = u32::try_from(steps).unwrap_or(u32::MAX);
    let deadline = opts.warmup + (opts.duration + opts.settle) * windows + Duration::from_secs(60);
    let mut tracker = Tracker::new(&fleet, steps);
    let started = Instant::now();
    let mut runs = Vec::new();
    while runs.len() < steps {
        let left = deadline.saturating_sub(started.elapsed());
        let (from, line) = next_line(&lines, left, &log("frontend0"))?;
        let sample_workers = |children: &mut Children| -> Result<(), String> {
            for p in &mut children.0[..workers] {
                command(p, &WorkerCommand::Sample.to_string())?;
            }
            Ok(())
        };
        if let Some(run) = tracker.handle(from, &line, &mut || sample_workers(&mut children))? {
            let more = keep_going(&run);
            runs.push(run);
            if !more {
                break;
            }
        }
    }
    Ok(runs)
}

/// The binary that runs `arm`'s processes.
fn executable(arm: &Arm, opts: &RunOpts) -> Result<PathBuf, String> {
    match arm.runner {
        Runner::Ours => std::env::current_exe().map_err(|e| e.to_string()),
        Runner::Peer(bin) => opts
            .peer_bins
            .get(&bin)
            .cloned()
            .ok_or_else(|| format!("the {} peer binary was not built", bin.binary)),
    }
}

/// Starts the worker processes one after another, each once the previous one is ready, and
/// returns the addresses they announced.
fn start_workers(
    exe: &Path,
    arm: &Arm,
    opts: &RunOpts,
    log: &impl Fn(&str) -> PathBuf,
    tx: &mpsc::Sender<(Source, String)>,
    lines: &mpsc::Receiver<(Source, String)>,
    children: &mut Children,
) -> Result<Vec<String>, String> {
    let mut addresses = Vec::new();
    for i in 0..opts.worker_processes.max(1) as usize {
        let source = Source::Worker(i);
        let (netns_host, host) = opts.host(source);
        let worker = Role::Worker(WorkerArgs {
            arm: arm.name.to_owned(),
            engines: opts.engines_per_process(),
            speedup: opts.speedup,
            cpu: opts.pin.then_some(1),
            host,
        });
        let log = log(&format!("worker{i}"));
        children
            .0
            .push(spawn(exe, &worker, &log, opts, netns_host, source, tx)?);
        let (_, line) = next_line(lines, Duration::from_secs(60), &log)?;
        match line.parse() {
            Ok(WorkerLine::Ready { address }) => addresses.push(address),
            Ok(other) => return Err(format!("worker {i} said {other} before READY")),
            Err(e) => return Err(format!("worker {i} said {e} (expected READY <address>)")),
        }
    }
    Ok(addresses)
}

/// Starts the frontends, each with its share of the load, and returns the ports they
/// announced.
#[allow(clippy::too_many_arguments)]
fn start_frontends(
    exe: &Path,
    arm: &Arm,
    opts: &RunOpts,
    workers: Vec<String>,
    log: &impl Fn(&str) -> PathBuf,
    tx: &mpsc::Sender<(Source, String)>,
    lines: &mpsc::Receiver<(Source, String)>,
    children: &mut Children,
) -> Result<Vec<u16>, String> {
    let mut ports = Vec::new();
    for i in 0..opts.frontends.max(1) {
        let source = Source::Frontend(i as usize);
        let (netns_host, host) = opts.host(source);
        let frontend = Role::Frontend(frontend_args(arm, opts, workers.clone(), i, host));
        let log = log(&format!("frontend{i}"));
        children
            .0
            .push(spawn(exe, &frontend, &log, opts, netns_host, source, tx)?);
        loop {
            let (_, line) = next_line(lines, Duration::from_secs(60), &log)?;
            match line.parse::<FrontendLine>() {
                Ok(FrontendLine::Ready { port }) => break ports.push(port),
                Ok(other) => return Err(format!("frontend {i} said {other} before READY")),
                Err(e) if e.is_unknown() => {}
                Err(e) => return Err(format!("frontend {i} said {e}")),
            }
        }
    }
    Ok(ports)
}

/// Frontend `i`'s arguments for `arm`, to the worker processes at `workers`.
fn frontend_args(
    arm: &Arm,
    opts: &RunOpts,
    workers: Vec<String>,
    i: u32,
    host: IpAddr,
) -> FrontendArgs {
    let (concurrency, rates, seed, max_in_flight) = match opts.load_of(i) {
        Load::Closed { concurrency } => (Some(concurrency), Vec::new(), 1, 1),
        Load::Open {
            rates,
            seed,
            max_in_flight,
        } => (None, rates, seed, max_in_flight),
    };
    FrontendArgs {
        arm: arm.name.to_owned(),
        workers,
        engines_per_process: opts.engines_per_process(),
        concurrency,
        rates,
        seed,
        max_in_flight,
        isl: opts.isl,
        osl: opts.osl,
        warmup: opts.warmup.as_secs_f64(),
        duration: opts.duration.as_secs_f64(),
        settle: opts.settle.as_secs_f64(),
        threads: opts.frontend_threads,
        cpu: opts.pin.then_some(0),
        host,
    }
}

/// The PKI of this run's TLS arms: generated once, at run time (no key is committed), in a
/// temporary directory that lives as long as the orchestrator.
fn run_pki() -> &'static velo_tls::testing::TestPki {
    static PKI: std::sync::OnceLock<velo_tls::testing::TestPki> = std::sync::OnceLock::new();
    PKI.get_or_init(velo_tls::testing::TestPki::new)
}

/// Spawns `exe` as `role` (inside its network namespace if there is one; a TLS arm's with
/// `DYN_TCP_TLS_*` pointing at the run's PKI), its stderr to `log`, its stdout's lines to `tx`
/// as said by `source`.
fn spawn(
    exe: &Path,
    role: &Role,
    log: &Path,
    opts: &RunOpts,
    netns_host: Option<usize>,
    source: Source,
    tx: &mpsc::Sender<(Source, String)>,
) -> Result<Proc, String> {
    let mut argv: Vec<OsString> = vec![exe.into()];
    argv.extend(role.command_line().into_iter().map(OsString::from));
    let mut cmd = match (&opts.netns, netns_host) {
        (Some(n), Some(i)) => {
            let mut cmd = Command::new("ip");
            cmd.args(n.wrap(i, argv));
            cmd
        }
        _ => {
            let mut cmd = Command::new(exe);
            cmd.args(&argv[1..]);
            cmd
        }
    };
    let arm = match role {
        Role::Frontend(a) => &a.arm,
        Role::Worker(a) => &a.arm,
    };
    if crate::arms::is_tls(arm) {
        cmd.envs(crate::arms::tls_env(run_pki()));
    }
    let err = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(err)
        .stdin(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let stdin = child.stdin.take();
    let tx = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send((source, line)).is_err() {
                break;
            }
        }
    });
    Ok(Proc { child, stdin })
}

/// Writes `line` to a child's stdin.
fn command(p: &mut Proc, line: &str) -> Result<(), String> {
    let stdin = p.stdin.as_mut().ok_or("a child without stdin")?;
    writeln!(stdin, "{line}")
        .and_then(|()| stdin.flush())
        .map_err(|e| format!("telling a child {line}: {e}"))
}

fn next_line(
    lines: &mpsc::Receiver<(Source, String)>,
    timeout: Duration,
    log: &Path,
) -> Result<(Source, String), String> {
    lines.recv_timeout(timeout).map_err(|e| {
        let tail = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = tail.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!(
            "{} ({e}); its log {}:\n{}",
            log.display(),
            log.display(),
            tail.join("\n")
        )
    })
}
