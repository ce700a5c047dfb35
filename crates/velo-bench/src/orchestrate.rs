//! Runs arms: fresh frontend and worker processes per run, sampled by the kernel's counters
//! at the frontend's window markers; repeats interleaved across arms.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::arms::{Arm, Conns, PeerBin, Runner};
use crate::frontend::FrontendReport;
use crate::procfs;

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
    let exe = match arm.runner {
        Runner::Ours => std::env::current_exe().map_err(|e| e.to_string())?,
        Runner::Peer(bin) => opts
            .peer_bins
            .get(&bin)
            .cloned()
            .ok_or_else(|| format!("the {} peer binary was not built", bin.binary))?,
    };
    let log = |role: &str| {
        opts.log_dir
            .join(format!("{}-{repeat}-{role}.log", arm.name))
    };
    let mut children = Children(Vec::new());
    let mut addrs = Vec::new();
    for i in 0..opts.worker_processes.max(1) {
        let mut cmd = Command::new(&exe);
        cmd.args([
            "worker",
            "--arm",
            arm.name,
            "--engines",
            &opts.engines_per_process().to_string(),
        ])
        .args(["--speedup", &opts.speedup.to_string()]);
        if opts.pin {
            cmd.args(["--cpu", "1"]);
        }
        let (child, lines) = spawn(cmd, &log(&format!("worker{i}")))?;
        children.0.push(child);
        let ready = next_line(&lines, Duration::from_secs(60), &log(&format!("worker{i}")))?;
        let addr = ready
            .strip_prefix("READY ")
            .ok_or_else(|| format!("worker said {ready:?}, expected READY"))?;
        addrs.push(addr.to_owned());
    }
    let worker_pids: Vec<u32> = children.0.iter().map(Child::id).collect();
    let mut cmd = Command::new(&exe);
    cmd.args(["frontend", "--arm", arm.name, "--workers", &addrs.join(",")])
        .args([
            "--engines-per-process",
            &opts.engines_per_process().to_string(),
        ])
        .args([
            "--concurrency",
            &opts.concurrency.to_string(),
            "--isl",
            &opts.isl.to_string(),
            "--osl",
            &opts.osl.to_string(),
        ])
        .args([
            "--warmup",
            &opts.warmup.as_secs_f64().to_string(),
            "--duration",
            &opts.duration.as_secs_f64().to_string(),
        ])
        .args(["--threads", &opts.frontend_threads.to_string()]);
    if opts.pin {
        cmd.args(["--cpu", "0"]);
    }
    let flog = log("frontend");
    let (child, lines) = spawn(cmd, &flog)?;
    let frontend_pid = child.id();
    children.0.push(child);
    let sample = || {
        (
            procfs::cpu_seconds(frontend_pid),
            worker_pids
                .iter()
                .map(|p| procfs::cpu_seconds(*p))
                .sum::<f64>(),
            procfs::sent_packets(),
        )
    };
    let deadline = opts.warmup + opts.duration + Duration::from_secs(60);
    let started = Instant::now();
    let (mut port, mut start, mut end, mut connections) = (0u16, None, None, 0u64);
    loop {
        let left = deadline.saturating_sub(started.elapsed());
        let line = next_line(&lines, left, &flog)?;
        if let Some(p) = line.strip_prefix("READY ") {
            port = p.trim().parse().unwrap_or(0);
        } else if line == "WINDOW_START" {
            start = Some(sample());
        } else if line == "WINDOW_MID" {
            connections = match arm.conns {
                Conns::FrontendTcpPort => procfs::established_on_port(port),
                Conns::WorkerUdpSockets => procfs::udp_sockets_of(&worker_pids),
            };
        } else if line == "WINDOW_END" {
            end = Some(sample());
        } else if let Some(json) = line.strip_prefix("RESULT ") {
            let report: FrontendReport = serde_json::from_str(json)
                .map_err(|e| format!("bad RESULT from the frontend: {e}"))?;
            let (Some(s0), Some(s1)) = (start, end) else {
                return Err("the frontend reported without a window".into());
            };
            return Ok(Run {
                report,
                frontend_cpu_s: s1.0 - s0.0,
                worker_cpu_s: s1.1 - s0.1,
                segments: s1.2.saturating_sub(s0.2),
                connections,
            });
        }
    }
}

fn spawn(mut cmd: Command, log: &Path) -> Result<(Child, mpsc::Receiver<String>), String> {
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
