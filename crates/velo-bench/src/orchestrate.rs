//! Runs arms: fresh frontend and worker processes per run ([`crate::roles`]), sampled by the
//! kernel's counters at the frontend's window lines ([`crate::protocol`]).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::arms::{Arm, Conns, PeerBin, Runner};
use crate::frontend::FrontendReport;
use crate::procfs;
use crate::protocol::{FrontendLine, WorkerLine};
use crate::roles::{FrontendArgs, Role, WorkerArgs};

/// How every arm is run.
#[derive(Debug, Clone)]
pub struct RunOpts {
    /// Requests in flight.
    pub concurrency: u32,
    /// Measurement window.
    pub duration: Duration,
    /// Warm-up before the window.
    pub warmup: Duration,
    /// Mock engines in all, spread over the worker processes.
    pub workers: u32,
    /// Worker processes.
    pub worker_processes: u32,
    /// Prompt length.
    pub isl: u32,
    /// Output length.
    pub osl: u32,
    /// The mocker's speedup ratio.
    pub speedup: f64,
    /// Frontend runtime threads (1: a current-thread runtime).
    pub frontend_threads: u32,
    /// Pin the frontend to CPU 0 and the workers to CPU 1.
    pub pin: bool,
    /// The peer binaries, built ([`crate::peers::ensure_built`]) before the first run.
    pub peer_bins: BTreeMap<PeerBin, PathBuf>,
    /// Where child processes' logs go.
    pub log_dir: PathBuf,
}

impl RunOpts {
    /// Engines per worker process (the total is rounded up to a multiple of the processes).
    pub fn engines_per_process(&self) -> u32 {
        self.workers.div_ceil(self.worker_processes.max(1)).max(1)
    }
}

/// One run of one arm, as measured.
#[derive(Debug, Clone)]
pub struct Run {
    /// What the frontend measured.
    pub report: FrontendReport,
    /// Frontend CPU over the window, seconds.
    pub frontend_cpu_s: f64,
    /// All worker processes' CPU over the window, seconds.
    pub worker_cpu_s: f64,
    /// Packets sent on the host over the window: TCP segments plus UDP datagrams.
    pub segments: u64,
    /// The plane's connections at mid-window, counted as the arm says ([`Conns`]).
    pub connections: u64,
}

/// Kills its children when dropped, so no run outlives its measurement.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `arm` once with fresh processes.
///
/// # Errors
///
/// A message saying which process failed, with its log's tail.
pub fn run_arm(arm: &Arm, opts: &RunOpts, repeat: u32) -> Result<Run, String> {
    let exe = executable(arm, opts)?;
    let log = |role: &str| {
        opts.log_dir
            .join(format!("{}-{repeat}-{role}.log", arm.name))
    };
    let mut children = Children(Vec::new());
    let addresses = start_workers(&exe, arm, opts, log, &mut children)?;
    let workers: Vec<u32> = children.0.iter().map(Child::id).collect();
    let frontend = Role::Frontend(frontend_args(arm, opts, addresses));
    let frontend_log = log("frontend");
    let (child, lines) = spawn(&exe, &frontend, &frontend_log)?;
    let fleet = Fleet {
        conns: arm.conns,
        frontend: child.id(),
        workers,
    };
    children.0.push(child);
    let deadline = opts.warmup + opts.duration + Duration::from_secs(60);
    measure(&fleet, &lines, deadline, &frontend_log)
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
    log: impl Fn(&str) -> PathBuf,
    children: &mut Children,
) -> Result<Vec<String>, String> {
    let worker = Role::Worker(WorkerArgs {
        arm: arm.name.to_owned(),
        engines: opts.engines_per_process(),
        speedup: opts.speedup,
        cpu: opts.pin.then_some(1),
    });
    let mut addresses = Vec::new();
    for i in 0..opts.worker_processes.max(1) {
        let log = log(&format!("worker{i}"));
        let (child, lines) = spawn(exe, &worker, &log)?;
        children.0.push(child);
        let line = next_line(&lines, Duration::from_secs(60), &log)?;
        let WorkerLine::Ready { address } = line
            .parse()
            .map_err(|e| format!("worker {i} said {e} (expected READY <address>)"))?;
        addresses.push(address);
    }
    Ok(addresses)
}

/// The frontend's arguments for `arm`, to the worker processes at `workers`.
fn frontend_args(arm: &Arm, opts: &RunOpts, workers: Vec<String>) -> FrontendArgs {
    FrontendArgs {
        arm: arm.name.to_owned(),
        workers,
        engines_per_process: opts.engines_per_process(),
        concurrency: opts.concurrency,
        isl: opts.isl,
        osl: opts.osl,
        warmup: opts.warmup.as_secs_f64(),
        duration: opts.duration.as_secs_f64(),
        threads: opts.frontend_threads,
        cpu: opts.pin.then_some(0),
    }
}

/// Reads the frontend's lines until its report, sampling `fleet` on the window's lines.
/// Lines that are not the protocol's are skipped: they are not meant for the orchestrator.
fn measure(
    fleet: &Fleet,
    lines: &mpsc::Receiver<String>,
    deadline: Duration,
    log: &Path,
) -> Result<Run, String> {
    let started = Instant::now();
    let mut window = Window::default();
    loop {
        let left = deadline.saturating_sub(started.elapsed());
        let line = next_line(lines, left, log)?;
        match line.parse::<FrontendLine>() {
            Ok(message) => {
                if let Some(run) = window.handle_line(message, fleet)? {
                    return Ok(run);
                }
            }
            Err(e) if e.is_unknown() => {}
            Err(e) => return Err(format!("the frontend said {e}")),
        }
    }
}

/// The processes of one run, as the kernel's counters see them.
struct Fleet {
    conns: Conns,
    frontend: u32,
    workers: Vec<u32>,
}

impl Fleet {
    fn sample(&self) -> Sample {
        Sample {
            frontend_cpu_s: procfs::cpu_seconds(self.frontend),
            worker_cpu_s: self
                .workers
                .iter()
                .map(|p| procfs::cpu_seconds(*p))
                .sum::<f64>(),
            packets: procfs::sent_packets(),
        }
    }

    /// The plane's connections, counted as the arm says; `port` is the frontend's.
    fn connections(&self, port: u16) -> u64 {
        match self.conns {
            Conns::FrontendTcpPort => procfs::established_on_port(port),
            Conns::WorkerUdpSockets => procfs::udp_sockets_of(&self.workers),
        }
    }
}

/// The kernel's counters at one edge of the window.
#[derive(Debug, Clone, Copy)]
struct Sample {
    frontend_cpu_s: f64,
    worker_cpu_s: f64,
    packets: u64,
}

/// What the frontend's lines have told of the window so far.
#[derive(Debug, Default)]
struct Window {
    port: u16,
    start: Option<Sample>,
    end: Option<Sample>,
    connections: u64,
}

impl Window {
    /// Takes one of the frontend's lines, sampling `fleet` where the line says; returns the
    /// run once the frontend has reported.
    fn handle_line(&mut self, line: FrontendLine, fleet: &Fleet) -> Result<Option<Run>, String> {
        match line {
            FrontendLine::Ready { port } => self.port = port,
            FrontendLine::WindowStart => self.start = Some(fleet.sample()),
            FrontendLine::WindowMid => self.connections = fleet.connections(self.port),
            FrontendLine::WindowEnd => self.end = Some(fleet.sample()),
            FrontendLine::Result(report) => return self.run(*report).map(Some),
        }
        Ok(None)
    }

    fn run(&self, report: FrontendReport) -> Result<Run, String> {
        let (Some(s0), Some(s1)) = (self.start, self.end) else {
            return Err("the frontend reported without a window".into());
        };
        Ok(Run {
            report,
            frontend_cpu_s: s1.frontend_cpu_s - s0.frontend_cpu_s,
            worker_cpu_s: s1.worker_cpu_s - s0.worker_cpu_s,
            segments: s1.packets.saturating_sub(s0.packets),
            connections: self.connections,
        })
    }
}

/// Spawns `exe` as `role`, its stderr to `log`; returns its stdout's lines.
fn spawn(exe: &Path, role: &Role, log: &Path) -> Result<(Child, mpsc::Receiver<String>), String> {
    let mut cmd = Command::new(exe);
    cmd.args(role.command_line());
    let err = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(err)
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok((child, rx))
}

fn next_line(
    lines: &mpsc::Receiver<String>,
    timeout: Duration,
    log: &Path,
) -> Result<String, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frontend_lines_make_a_run_only_after_a_window() {
        let me = std::process::id();
        let fleet = Fleet {
            conns: Conns::FrontendTcpPort,
            frontend: me,
            workers: vec![me],
        };
        let result = FrontendLine::Result(Box::default());
        let mut window = Window::default();
        let early = window.handle_line(result.clone(), &fleet);
        assert_eq!(early.unwrap_err(), "the frontend reported without a window");
        for line in ["READY 0", "WINDOW_START", "WINDOW_MID", "WINDOW_END"] {
            let line = line.parse().expect("a protocol line");
            assert!(window.handle_line(line, &fleet).unwrap().is_none());
        }
        let run = window.handle_line(result, &fleet).unwrap().expect("a run");
        assert!(run.frontend_cpu_s >= 0.0 && run.worker_cpu_s >= 0.0);
    }
}
