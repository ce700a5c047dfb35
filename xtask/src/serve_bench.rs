//! `serve-bench`: velo-serve driven over HTTP by its load generator (`velo-serve load`), per
//! response plane, at a closed-loop concurrency and an open-loop Poisson rate. For each plane
//! it starts a fresh `velo-serve` (a frontend with its response plane on its own thread, plus
//! mock worker processes), waits for it to be healthy, runs each load, stops it, and prints one
//! table: client-side TTFT, per-chunk gaps, mean ITL p99, output tokens/s, HTTP errors and the
//! frontend's CPU per token split into its HTTP side and its response plane.

use std::net::TcpListener;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::cmd::Cmd;
use crate::{Result, flags};

/// How long a stopped velo-serve may take to exit before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Options {
    planes: Vec<String>,
    concurrency: u64,
    rate: f64,
    secs: f64,
    workers: u64,
    isl: u64,
    osl: u64,
    speedup: f64,
}

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Self> {
        let known = [
            "planes",
            "concurrency",
            "rate",
            "duration",
            "workers",
            "isl",
            "osl",
            "speedup",
        ];
        let flags = flags::parse(args, &known)?;
        let num = |name: &str, default: f64| -> Result<f64> {
            match flags.get(name) {
                None => Ok(default),
                Some(v) => v
                    .parse()
                    .map_err(|_| format!("--{name} must be a number, not `{v}`").into()),
            }
        };
        let planes: Vec<String> = flags
            .get("planes")
            .copied()
            .unwrap_or("velo,tcp")
            .split(',')
            .map(str::to_owned)
            .collect();
        if let Some(p) = planes.iter().find(|p| *p != "velo" && *p != "tcp") {
            return Err(format!("--planes: `{p}` is not `velo` or `tcp`").into());
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let whole = |v: f64| v.max(1.0) as u64;
        Ok(Self {
            planes,
            concurrency: whole(num("concurrency", 64.0)?),
            rate: num("rate", 200.0)?,
            secs: num("duration", 8.0)?,
            workers: whole(num("workers", 2.0)?),
            isl: whole(num("isl", 128.0)?),
            osl: whole(num("osl", 128.0)?),
            speedup: num("speedup", 10.0)?,
        })
    }
}

pub(crate) fn run(opts: &Options) -> Result {
    Cmd::cargo()
        .args(["build", "--release", "-p", "velo-serve"])
        .run()?;
    let bin = crate::soak::target_dir().join("release").join("velo-serve");
    let bin = bin.display().to_string();
    let mut rows = Vec::new();
    let load_before = loadavg();
    for plane in &opts.planes {
        rows.extend(one_plane(opts, &bin, plane)?);
    }
    println!(
        "\nserve-bench: load average before {load_before}, after {}",
        loadavg()
    );
    println!(
        "isl {} osl {}, {} worker processes x 4 engines, speedup {}, {} s windows",
        opts.isl, opts.osl, opts.workers, opts.speedup, opts.secs
    );
    let mut header = true;
    for row in rows {
        let mut lines = row.lines();
        let (h1, h2, r) = (lines.next(), lines.next(), lines.next());
        if header {
            println!("{}\n{}", h1.unwrap_or_default(), h2.unwrap_or_default());
            header = false;
        }
        println!("{}", r.unwrap_or_default());
    }
    Ok(())
}

/// Starts velo-serve on `plane`, runs both loads, stops it; the load generator's tables.
fn one_plane(opts: &Options, bin: &str, plane: &str) -> Result<Vec<String>> {
    let port = free_port()?;
    let addr = format!("127.0.0.1:{port}");
    println!("serve-bench: {plane}: starting velo-serve on {addr}");
    let mut server = Command::new(bin)
        .args(["--http", &addr, "--plane-thread"])
        .args(["--workers", &opts.workers.to_string()])
        .args(["--speedup", &opts.speedup.to_string()])
        .env("DYN_RESPONSE_PLANE", plane)
        .spawn()
        .map_err(|e| format!("cannot start {bin}: {e}"))?;
    let loads = [
        vec![
            "--mode".to_owned(),
            "closed".into(),
            "--concurrency".into(),
            opts.concurrency.to_string(),
        ],
        vec![
            "--mode".to_owned(),
            "open".into(),
            "--rate".into(),
            opts.rate.to_string(),
        ],
    ];
    let mut rows = Vec::new();
    let mut failure = None;
    for load in loads {
        let out = Cmd::new(bin)
            .arg("load")
            .args(["--addr", &addr, "--label", plane])
            .args(["--frontend-pid", &server.id().to_string()])
            .args(["--duration-s", &opts.secs.to_string()])
            .args([
                "--isl",
                &opts.isl.to_string(),
                "--osl",
                &opts.osl.to_string(),
            ])
            .args(load)
            .read();
        match out {
            Ok(table) => {
                print!("{table}");
                rows.push(table);
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    stop(&mut server)?;
    match failure {
        Some(e) => Err(e),
        None => Ok(rows),
    }
}

/// Asks velo-serve to exit (SIGTERM: its workers leave discovery and drain), bounded.
fn stop(server: &mut Child) -> Result {
    let _ = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status();
    let started = Instant::now();
    while started.elapsed() < STOP_TIMEOUT {
        if server.try_wait()?.is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    server.kill()?;
    server.wait()?;
    Err("velo-serve did not exit within 30 s of SIGTERM".into())
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}
