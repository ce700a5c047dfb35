//! `cargo run --release -p velo-bench`: compare response planes on a mock serving fleet.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser};
use indicatif::{ProgressBar, ProgressStyle};
use tokio_util::task::TaskTracker;
use velo_bench::adapter::ours;
use velo_bench::arms::{self, Arm, PeerBin, Runner};
use velo_bench::orchestrate::{self, RunOpts};
use velo_bench::report::{ArmReport, Figures};
use velo_bench::reqplane::RequestSender;
use velo_bench::roles::{self, FrontendArgs, Role, WorkerArgs, WorkerSetup};
use velo_bench::{peers, plots};

/// Compare response planes side by side on a mock LLM serving fleet (Dynamo's mocker model):
/// a closed-loop load through fresh frontend and worker processes per run.
#[derive(Parser)]
#[command(name = "velo-bench", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    role: Option<Role>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Arms to run, comma-separated, or `all`.
    #[arg(long, default_value = "all")]
    arms: String,
    /// Requests in flight (closed loop).
    #[arg(long, default_value_t = 256)]
    concurrency: u32,
    /// Measurement window, seconds.
    #[arg(long, default_value_t = 8.0)]
    duration: f64,
    /// Warm-up before the window, seconds (the window also waits for the first request to
    /// complete).
    #[arg(long, default_value_t = 3.0)]
    warmup: f64,
    /// Mock engines in all (spread over the worker processes).
    #[arg(long, default_value_t = 8)]
    workers: u32,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    worker_processes: u32,
    /// Prompt length (input sequence length), tokens.
    #[arg(long, default_value_t = 256)]
    isl: u32,
    /// Output length (output sequence length), tokens.
    #[arg(long, default_value_t = 128)]
    osl: u32,
    /// The mocker's speedup ratio (pass times are divided by it).
    #[arg(long, default_value_t = 10.0)]
    speedup: f64,
    /// Interleaved repeats per arm; the report gives medians.
    #[arg(long, default_value_t = 2)]
    repeats: u32,
    /// Write every figure and the configuration to this JSON file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write SVG plots into this directory.
    #[arg(long)]
    plots: Option<PathBuf>,
    /// Pin the frontend to CPU 0 and the worker processes to CPU 1.
    #[arg(long)]
    pin: bool,
    /// Frontend runtime threads (1 runs a current-thread runtime).
    #[arg(long, default_value_t = 2)]
    frontend_threads: u32,
    /// Cargo profile the peer arms' binaries are built with (before the first run, if missing
    /// or stale); measurements want `release`, the smoke test uses the cheaper `smoke`.
    #[arg(long, default_value = "release")]
    peers_profile: String,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    roles::exit(match cli.role {
        Some(Role::Frontend(a)) => roles::run_frontend_role(a, frontend),
        Some(Role::Worker(a)) => roles::run_worker_role(a, worker),
        None => orchestrate(cli.run),
    })
}

/// Our frontend for arm `a.arm`: our plane, our request channel.
async fn frontend(a: FrontendArgs) -> Result<ours::Frontend, String> {
    let (config, _) = arms::our_config(&a.arm)?;
    let requests = RequestSender::connect_all(&a.workers).await?;
    let plane = response_plane::FrontendPlane::bind(config, TaskTracker::new())
        .await
        .map_err(|e| e.to_string())?;
    Ok(ours::Frontend::new(plane, requests))
}

/// Our worker for arm `a.arm`.
async fn worker(a: WorkerArgs) -> Result<WorkerSetup<ours::Worker>, String> {
    let (config, flush_per_pass) = arms::our_config(&a.arm)?;
    let plane =
        response_plane::WorkerPlane::new(config, TaskTracker::new()).map_err(|e| e.to_string())?;
    Ok(WorkerSetup::new(ours::Worker(plane), flush_per_pass))
}

/// Builds the peer binaries the selected arms need (feature `peers`).
fn peer_bins(arms: &[Arm], profile: &str) -> Result<BTreeMap<PeerBin, PathBuf>, String> {
    let mut bins = BTreeMap::new();
    for arm in arms {
        if let Runner::Peer(bin) = arm.runner
            && !bins.contains_key(&bin)
        {
            bins.insert(bin, peers::ensure_built(bin, profile)?);
        }
    }
    Ok(bins)
}

fn orchestrate(a: RunArgs) -> Result<(), String> {
    let arms: Vec<Arm> = arms::select(&a.arms)?;
    a.check()?;
    let log_dir = std::env::temp_dir().join(format!("velo-bench-{}", std::process::id()));
    std::fs::create_dir_all(&log_dir).map_err(|e| e.to_string())?;
    let opts = a.run_opts(peer_bins(&arms, &a.peers_profile)?, log_dir.clone());
    println!("{}", a.banner(&opts));
    let results = run_all(&arms, &opts, a.repeats)?;
    let reports = arm_reports(&arms, &results);
    velo_bench::report::print_table(&reports);
    for r in reports.iter().filter(|r| !r.error_samples.is_empty()) {
        eprintln!("{} errors, e.g.: {}", r.arm, r.error_samples.join(" | "));
    }
    if let Some(path) = &a.json {
        write_json(path, &a, &opts, &arms, &reports)?;
    }
    if let Some(dir) = &a.plots {
        write_plots(dir, &arms, &results)?;
    }
    let _ = std::fs::remove_dir_all(&log_dir);
    Ok(())
}

impl RunArgs {
    /// Rejects counts of zero and durations that are not positive.
    fn check(&self) -> Result<(), String> {
        if self.concurrency == 0
            || self.repeats == 0
            || self.worker_processes == 0
            || self.workers == 0
            || self.osl == 0
        {
            return Err(
                "--concurrency, --repeats, --workers, --worker-processes and --osl must be at least 1"
                    .into(),
            );
        }
        if !(self.duration > 0.0 && self.warmup >= 0.0 && self.speedup > 0.0) {
            return Err("--duration and --speedup must be positive, --warmup not negative".into());
        }
        Ok(())
    }

    /// How every arm is run.
    fn run_opts(&self, peer_bins: BTreeMap<PeerBin, PathBuf>, log_dir: PathBuf) -> RunOpts {
        RunOpts {
            concurrency: self.concurrency,
            duration: Duration::from_secs_f64(self.duration),
            warmup: Duration::from_secs_f64(self.warmup),
            workers: self.workers,
            worker_processes: self.worker_processes,
            isl: self.isl,
            osl: self.osl,
            speedup: self.speedup,
            frontend_threads: self.frontend_threads,
            pin: self.pin,
            peer_bins,
            log_dir,
        }
    }

    /// The configuration line printed above the table.
    fn banner(&self, opts: &RunOpts) -> String {
        format!(
            "velo-bench: concurrency {}, ISL {} / OSL {}, {} engines in {} worker processes, speedup {}, warm-up {} s, window {} s, {} repeat(s), frontend threads {}{}",
            opts.concurrency,
            opts.isl,
            opts.osl,
            opts.engines_per_process() * opts.worker_processes,
            opts.worker_processes,
            opts.speedup,
            self.warmup,
            self.duration,
            self.repeats,
            opts.frontend_threads,
            if opts.pin { ", pinned" } else { "" }
        )
    }
}

/// Runs every arm `repeats` times, the repeats interleaved across arms, behind a progress
/// bar; returns each arm's runs.
fn run_all(
    arms: &[Arm],
    opts: &RunOpts,
    repeats: u32,
) -> Result<Vec<Vec<orchestrate::Run>>, String> {
    let total = u64::from(repeats) * arms.len() as u64;
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?,
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let mut results: Vec<Vec<orchestrate::Run>> = vec![Vec::new(); arms.len()];
    for repeat in 0..repeats {
        for (i, arm) in arms.iter().enumerate() {
            bar.set_message(format!("{} (repeat {}/{})", arm.name, repeat + 1, repeats));
            let run = orchestrate::run_arm(arm, opts, repeat)
                .map_err(|e| format!("arm {}: {e}", arm.name))?;
            results[i].push(run);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    Ok(results)
}

/// Each arm's figures: every run's and their medians, and a few of its errors.
fn arm_reports(arms: &[Arm], results: &[Vec<orchestrate::Run>]) -> Vec<ArmReport> {
    arms.iter()
        .zip(results)
        .map(|(arm, runs)| {
            let figures: Vec<Figures> = runs.iter().map(Figures::of).collect();
            ArmReport {
                arm: arm.name.to_owned(),
                about: arm.about.to_owned(),
                median: Figures::median(&figures),
                runs: figures,
                error_samples: runs
                    .iter()
                    .flat_map(|r| r.report.error_samples.clone())
                    .take(5)
                    .collect(),
            }
        })
        .collect()
}

/// Writes the configuration and every arm's figures (each with the configuration) to `path`.
fn write_json(
    path: &Path,
    a: &RunArgs,
    opts: &RunOpts,
    arms: &[Arm],
    reports: &[ArmReport],
) -> Result<(), String> {
    let config = serde_json::json!({
        "concurrency": opts.concurrency, "duration_s": a.duration, "warmup_s": a.warmup,
        "workers": opts.engines_per_process() * opts.worker_processes, "worker_processes": opts.worker_processes,
        "isl": opts.isl, "osl": opts.osl, "speedup": opts.speedup, "repeats": a.repeats,
        "frontend_threads": opts.frontend_threads, "pin": opts.pin,
        "peers_profile": a.peers_profile,
        "arms": arms.iter().map(|a| a.name).collect::<Vec<_>>(),
    });
    let arms_json: Vec<serde_json::Value> = reports
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).unwrap_or_default();
            if let Some(o) = v.as_object_mut() {
                o.insert("config".into(), config.clone());
            }
            v
        })
        .collect();
    let doc = serde_json::json!({ "config": config, "arms": arms_json });
    std::fs::write(
        path,
        serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes the SVG plots of each arm's first run into `dir`.
fn write_plots(dir: &Path, arms: &[Arm], results: &[Vec<orchestrate::Run>]) -> Result<(), String> {
    let curves: Vec<plots::Curves<'_>> = arms
        .iter()
        .zip(results)
        .filter_map(|(arm, runs)| {
            let r = &runs.first()?.report;
            Some(plots::Curves {
                arm: arm.name,
                ttft: &r.ttft_cdf,
                itl: &r.itl_cdf,
                tokens: &r.tokens_series,
            })
        })
        .collect();
    plots::write(dir, &curves)
}
