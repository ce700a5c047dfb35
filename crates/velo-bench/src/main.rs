//! `cargo run --release -p velo-bench`: compare response planes on a mock serving fleet.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use tokio_util::task::TaskTracker;
use velo_bench::adapter::ours;
use velo_bench::arms::{self, Arm, PeerBin, Runner};
use velo_bench::frontend::Load;
use velo_bench::netns::Netns;
use velo_bench::open_loop::{self, OpenArm, Slo};
use velo_bench::orchestrate::{Run, RunOpts};
use velo_bench::report::ArmReport;
use velo_bench::reqplane::RequestSender;
use velo_bench::roles::{self, FrontendArgs, Role, WorkerArgs, WorkerSetup};
use velo_bench::suite::{self, Table};
use velo_bench::{peers, plots, report};

/// Compare response planes side by side on a mock LLM serving fleet (Dynamo's mocker model):
/// fresh frontend and worker processes per run; a closed-loop table, a plane-saturation table
/// and an open-loop (Poisson) rate sweep.
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
    /// Tables to make, comma-separated: `closed`, `saturation`, `open`, or `all`.
    #[arg(long, default_value = "all")]
    tables: String,
    /// Closed loop: requests in flight (over all frontends).
    #[arg(long, default_value_t = 256)]
    concurrency: u32,
    /// Closed loop: measurement window, seconds.
    #[arg(long, default_value_t = 8.0)]
    duration: f64,
    /// Warm-up before the first window, seconds (the window also waits for the first request
    /// to complete).
    #[arg(long, default_value_t = 3.0)]
    warmup: f64,
    /// Closed loop: mock engines in all (spread over the worker processes).
    #[arg(long, default_value_t = 8)]
    workers: u32,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    worker_processes: u32,
    /// Frontend processes (the load is split evenly over them).
    #[arg(long, default_value_t = 1)]
    frontends: u32,
    /// Prompt length (input sequence length), tokens.
    #[arg(long, default_value_t = 256)]
    isl: u32,
    /// Output length (output sequence length), tokens.
    #[arg(long, default_value_t = 128)]
    osl: u32,
    /// Closed loop: the mocker's speedup ratio (pass times are divided by it).
    #[arg(long, default_value_t = 10.0)]
    speedup: f64,
    /// Closed loop: interleaved repeats per arm; the report gives medians.
    #[arg(long, default_value_t = 2)]
    repeats: u32,
    /// Closed loop: pin the frontends to CPU 0 and the worker processes to CPU 1.
    #[arg(long)]
    pin: bool,
    /// Closed loop: frontend runtime threads (1 runs a current-thread runtime).
    #[arg(long, default_value_t = 2)]
    frontend_threads: u32,
    #[command(flatten)]
    saturation: SaturationArgs,
    #[command(flatten)]
    open: OpenArgs,
    /// Where the processes talk: `loopback`, or `netns` (each process in its own network
    /// namespace, joined by veth pairs of MTU 1500; needs root).
    #[arg(long, value_enum, default_value_t = Topology::Loopback)]
    topology: Topology,
    /// Write every figure and the configuration to this JSON file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write SVG plots of the closed loop into this directory.
    #[arg(long)]
    plots: Option<PathBuf>,
    /// Cargo profile the peer arms' binaries are built with (before the first run, if missing
    /// or stale); measurements want `release`, the smoke test uses the cheaper `smoke`.
    #[arg(long, default_value = "release")]
    peers_profile: String,
}

/// The saturation table (and the open loop's fleet): frontends pinned to CPU 0 on a
/// current-thread runtime, workers pinned to CPU 1, a fast fleet.
#[derive(Args, Debug)]
struct SaturationArgs {
    /// Saturation: requests in flight.
    #[arg(long, default_value_t = 2048)]
    sat_concurrency: u32,
    /// Saturation and open loop: mock engines in all.
    #[arg(long, default_value_t = 16)]
    sat_workers: u32,
    /// Saturation and open loop: the mocker's speedup ratio.
    #[arg(long, default_value_t = 100.0)]
    sat_speedup: f64,
    /// Saturation: measurement window, seconds.
    #[arg(long, default_value_t = 5.0)]
    sat_duration: f64,
}

/// The open-loop table.
#[derive(Args, Debug)]
struct OpenArgs {
    /// Open loop: offered loads, requests per second, in rising order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "500,1000,2000,3000,4000,6000,8000,11000,16000"
    )]
    rates: Vec<f64>,
    /// Open loop: each rate's measurement window, seconds.
    #[arg(long, default_value_t = 2.0)]
    open_duration: f64,
    /// Open loop: time between rates (the last rate's requests end, the next settles), seconds.
    #[arg(long, default_value_t = 1.0)]
    open_settle: f64,
    /// Open loop: the seed of the arrival times.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Open loop: the TTFT p99 objective a sustained rate meets, ms.
    #[arg(long, default_value_t = 50.0)]
    slo_ttft_p99_ms: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Topology {
    /// Every process on the host's loopback.
    Loopback,
    /// Every process in its own network namespace, veth pairs of MTU 1500 to a bridge.
    Netns,
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
    let (config, _) = arms::our_config_at(&a.arm, a.host)?;
    let requests = RequestSender::connect_all(&a.workers).await?;
    let plane = response_plane::FrontendPlane::bind(config, TaskTracker::new())
        .await
        .map_err(|e| e.to_string())?;
    Ok(ours::Frontend::new(plane, requests))
}

/// Our worker for arm `a.arm`.
async fn worker(a: WorkerArgs) -> Result<WorkerSetup<ours::Worker>, String> {
    let (config, flush_per_pass) = arms::our_config_at(&a.arm, a.host)?;
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
    let tables = Table::parse_list(&a.tables)?;
    a.check()?;
    let began = Instant::now();
    let log_dir = std::env::temp_dir().join(format!("velo-bench-{}", std::process::id()));
    std::fs::create_dir_all(&log_dir).map_err(|e| e.to_string())?;
    let netns = match a.topology {
        Topology::Loopback => None,
        Topology::Netns => Some(Arc::new(Netns::create(
            (a.frontends + a.worker_processes) as usize,
        )?)),
    };
    let base = a.closed_opts(peer_bins(&arms, &a.peers_profile)?, log_dir.clone(), netns);
    let mut doc = serde_json::Map::new();
    let bar = progress(&a, &tables, arms.len())?;
    for table in &tables {
        let value = run_table(*table, &a, &arms, &base, &bar)?;
        doc.insert(table.name().into(), value);
    }
    bar.finish_and_clear();
    let took = began.elapsed().as_secs_f64();
    println!("The report took {took:.0} s.");
    if let Some(path) = &a.json {
        write_json(path, &a, &arms, doc)?;
    }
    let _ = std::fs::remove_dir_all(&log_dir);
    Ok(())
}

/// Runs one table, prints it, and returns its JSON.
fn run_table(
    table: Table,
    a: &RunArgs,
    arms: &[Arm],
    base: &RunOpts,
    bar: &ProgressBar,
) -> Result<serde_json::Value, String> {
    let cpus = std::thread::available_parallelism().map_or(2.0, |n| n.get() as f64);
    let opts = match table {
        Table::Closed => base.clone(),
        Table::Saturation => a.saturation_opts(base),
        Table::Open => a.open_opts(base),
    };
    let cap = suite::capacity(&opts, cpus);
    let banner = a.banner(table, &opts);
    match table {
        Table::Closed | Table::Saturation => {
            let repeats = if table == Table::Closed { a.repeats } else { 1 };
            let (reports, runs) = suite::closed(arms, &opts, repeats, cap, bar)?;
            bar.suspend(|| {
                println!("{banner}\n");
                report::print_table(&reports);
                for r in reports.iter().filter(|r| !r.error_samples.is_empty()) {
                    eprintln!("{} errors, e.g.: {}", r.arm, r.error_samples.join(" | "));
                }
            });
            if let (Table::Closed, Some(dir)) = (table, &a.plots) {
                write_plots(dir, arms, &runs)?;
            }
            Ok(table_json(&opts, &reports))
        }
        Table::Open => {
            let slo = a.slo();
            let open = suite::open(arms, &opts, &slo, cap, bar)?;
            bar.suspend(|| {
                println!("{banner}\n");
                open_loop::print_table(&open, &slo);
            });
            Ok(open_json(&opts, &slo, &open))
        }
    }
}

impl RunArgs {
    /// Rejects counts of zero and durations that are not positive.
    fn check(&self) -> Result<(), String> {
        if self.concurrency == 0
            || self.repeats == 0
            || self.worker_processes == 0
            || self.workers == 0
            || self.frontends == 0
            || self.osl == 0
            || self.saturation.sat_concurrency == 0
            || self.saturation.sat_workers == 0
        {
            return Err(
                "--concurrency, --repeats, --workers, --worker-processes, --frontends, --osl, --sat-concurrency and --sat-workers must be at least 1"
                    .into(),
            );
        }
        let positive = [
            self.duration,
            self.speedup,
            self.saturation.sat_duration,
            self.saturation.sat_speedup,
            self.open.open_duration,
            self.open.slo_ttft_p99_ms,
        ];
        if !(positive.iter().all(|v| *v > 0.0)
            && self.warmup >= 0.0
            && self.open.open_settle >= 0.0)
        {
            return Err("durations, speedups and the SLO must be positive, --warmup and --open-settle not negative".into());
        }
        if self.open.rates.is_empty() || self.open.rates.iter().any(|r| *r <= 0.0) {
            return Err("--rates needs at least one rate, each positive".into());
        }
        Ok(())
    }

    /// The closed loop's options (the others derive from them).
    fn closed_opts(
        &self,
        peer_bins: BTreeMap<PeerBin, PathBuf>,
        log_dir: PathBuf,
        netns: Option<Arc<Netns>>,
    ) -> RunOpts {
        RunOpts {
            load: Load::Closed {
                concurrency: self.concurrency,
            },
            duration: Duration::from_secs_f64(self.duration),
            warmup: Duration::from_secs_f64(self.warmup),
            settle: Duration::from_secs(1),
            workers: self.workers,
            worker_processes: self.worker_processes,
            frontends: self.frontends,
            isl: self.isl,
            osl: self.osl,
            speedup: self.speedup,
            frontend_threads: self.frontend_threads,
            pin: self.pin,
            peer_bins,
            log_dir,
            netns,
        }
    }

    /// The saturation run: frontends pinned on one core, one runtime thread, a fast fleet.
    fn saturation_opts(&self, base: &RunOpts) -> RunOpts {
        let s = &self.saturation;
        RunOpts {
            load: Load::Closed {
                concurrency: s.sat_concurrency,
            },
            duration: Duration::from_secs_f64(s.sat_duration),
            warmup: base.warmup.min(Duration::from_secs(2)),
            workers: s.sat_workers,
            speedup: s.sat_speedup,
            frontend_threads: 1,
            pin: true,
            ..base.clone()
        }
    }

    /// The open loop: the saturation run's fleet and pinning, the rates in steps.
    fn open_opts(&self, base: &RunOpts) -> RunOpts {
        let o = &self.open;
        RunOpts {
            load: Load::Open {
                rates: o.rates.clone(),
                seed: o.seed,
                max_in_flight: MAX_IN_FLIGHT,
            },
            duration: Duration::from_secs_f64(o.open_duration),
            settle: Duration::from_secs_f64(o.open_settle),
            ..self.saturation_opts(base)
        }
    }

    fn slo(&self) -> Slo {
        Slo {
            ttft_p99_ms: self.open.slo_ttft_p99_ms,
            unserved_pct: UNSERVED_PCT,
        }
    }

    /// The configuration line printed above a table.
    fn banner(&self, table: Table, opts: &RunOpts) -> String {
        let load = match &opts.load {
            Load::Closed { concurrency } => format!("closed loop, concurrency {concurrency}"),
            Load::Open { rates, seed, .. } => format!(
                "open loop (Poisson, seed {seed}), {} rates from {} to {} req/s, TTFT p99 objective {} ms",
                rates.len(),
                rates.first().copied().unwrap_or(0.0),
                rates.last().copied().unwrap_or(0.0),
                self.open.slo_ttft_p99_ms
            ),
        };
        format!(
            "## {}: {load}, ISL {} / OSL {}, {} engines in {} worker processes, {} frontend(s), speedup {}, warm-up {} s, window {} s, {} repeat(s), frontend threads {}{}, {}",
            table.name(),
            opts.isl,
            opts.osl,
            opts.engines_per_process() * opts.worker_processes,
            opts.worker_processes,
            opts.frontends,
            opts.speedup,
            opts.warmup.as_secs_f64(),
            opts.duration.as_secs_f64(),
            if table == Table::Closed {
                self.repeats
            } else {
                1
            },
            opts.frontend_threads,
            if opts.pin {
                ", pinned (frontends CPU 0, workers CPU 1)"
            } else {
                ""
            },
            match self.topology {
                Topology::Loopback => "loopback",
                Topology::Netns => "netns (veth, MTU 1500)",
            }
        )
    }
}

/// Requests in flight at most per frontend in the open loop (arrivals beyond are dropped).
const MAX_IN_FLIGHT: u32 = 65_536;
/// Arrivals of a sustained rate that may fail, be dropped or run late, percent.
const UNSERVED_PCT: f64 = 0.1;

/// A progress bar over every run of every table.
fn progress(a: &RunArgs, tables: &[Table], arms: usize) -> Result<ProgressBar, String> {
    let runs: u64 = tables
        .iter()
        .map(|t| match t {
            Table::Closed => u64::from(a.repeats),
            Table::Saturation | Table::Open => 1,
        })
        .sum::<u64>()
        * arms as u64;
    let bar = ProgressBar::new(runs);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?,
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    Ok(bar)
}

/// A closed-loop table's configuration and arms.
fn table_json(opts: &RunOpts, reports: &[ArmReport]) -> serde_json::Value {
    let config = opts_json(opts);
    let arms: Vec<serde_json::Value> = reports
        .iter()
        .map(|r| {
            let mut v = serde_json::to_value(r).unwrap_or_default();
            if let Some(o) = v.as_object_mut() {
                o.insert("config".into(), config.clone());
            }
            v
        })
        .collect();
    serde_json::json!({ "config": config, "arms": arms })
}

/// The open-loop table's configuration, objective and arms.
fn open_json(opts: &RunOpts, slo: &Slo, arms: &[OpenArm]) -> serde_json::Value {
    serde_json::json!({ "config": opts_json(opts), "slo": slo, "arms": arms })
}

fn opts_json(opts: &RunOpts) -> serde_json::Value {
    let (concurrency, rates) = match &opts.load {
        Load::Closed { concurrency } => (Some(*concurrency), Vec::new()),
        Load::Open { rates, .. } => (None, rates.clone()),
    };
    serde_json::json!({
        "concurrency": concurrency, "rates": rates,
        "duration_s": opts.duration.as_secs_f64(), "warmup_s": opts.warmup.as_secs_f64(),
        "workers": opts.engines_per_process() * opts.worker_processes,
        "worker_processes": opts.worker_processes, "frontends": opts.frontends,
        "isl": opts.isl, "osl": opts.osl, "speedup": opts.speedup,
        "frontend_threads": opts.frontend_threads, "pin": opts.pin,
        "topology": if opts.netns.is_some() { "netns" } else { "loopback" },
    })
}

/// Writes every table to `path`; the closed loop's arms are also at the top (`arms`), as
/// before the other tables existed.
fn write_json(
    path: &Path,
    a: &RunArgs,
    arms: &[Arm],
    mut doc: serde_json::Map<String, serde_json::Value>,
) -> Result<(), String> {
    if let Some(closed) = doc.get("closed").cloned() {
        doc.insert("config".into(), closed["config"].clone());
        doc.insert("arms".into(), closed["arms"].clone());
    }
    doc.insert("repeats".into(), a.repeats.into());
    doc.insert("peers_profile".into(), a.peers_profile.clone().into());
    doc.insert(
        "arm_names".into(),
        arms.iter().map(|a| a.name).collect::<Vec<_>>().into(),
    );
    std::fs::write(
        path,
        serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes the SVG plots of each arm's first run into `dir`.
fn write_plots(dir: &Path, arms: &[Arm], results: &[Vec<Run>]) -> Result<(), String> {
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
