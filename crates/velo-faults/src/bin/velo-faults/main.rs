//! `velo-faults`: runs every fault scenario against both response planes and prints one table
//! (`cargo xtask faults`). It spawns fresh frontend and worker processes of itself per
//! scenario (the hidden `frontend` and `worker` subcommands), drives them over a line
//! protocol, injects faults through a fault proxy, signals and network namespaces, and exits
//! non-zero when a stream is left hanging, a detection exceeds its bound, a stream meant to
//! finish loses items, or the frontend's memory grows past its bound.

mod children;
mod frontend;
mod proxy_role;
mod run;
mod scenarios;
mod service;
mod table;
mod verdict;
mod worker;
mod world;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::run::RunOpts;
use crate::scenarios::Scenario;

/// Fault scenarios against the response planes: detection times, hanging streams, sibling
/// delivery and frontend memory, in one table.
#[derive(Parser)]
#[command(name = "velo-faults", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    role: Option<Role>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Role {
    /// (internal) A frontend process of one scenario.
    #[command(hide = true)]
    Frontend(service::RoleArgs),
    /// (internal) A worker process of one scenario.
    #[command(hide = true)]
    Worker(service::RoleArgs),
    /// A fault proxy driven over standard input (used by the soak).
    Proxy(proxy_role::ProxyArgs),
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Planes to run, comma-separated: `velo`, `tcp`.
    #[arg(long, default_value = "velo,tcp")]
    planes: String,
    /// Scenarios to run, comma-separated, or `all` (the baseline always runs first).
    #[arg(long, default_value = "all")]
    scenarios: String,
    /// The velo plane's idle timeout, ms (the detection bound is this plus the slack).
    #[arg(long, default_value_t = 2000)]
    idle_ms: u64,
    /// Slack on top of the idle timeout, ms.
    #[arg(long, default_value_t = 1000)]
    slack_ms: u64,
    /// The frontends' shutdown grace, ms (the go-away scenario's bound).
    #[arg(long, default_value_t = 4000)]
    grace_ms: u64,
    /// Where the processes' logs go (default: a fresh directory under the temp dir).
    #[arg(long)]
    logs: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.role {
        Some(Role::Frontend(a)) => runtime(2).and_then(|rt| rt.block_on(frontend::run(a))),
        Some(Role::Worker(a)) => runtime(1).and_then(|rt| rt.block_on(worker::run(a))),
        Some(Role::Proxy(a)) => runtime(1).and_then(|rt| rt.block_on(proxy_role::run(a))),
        None => runtime(2).and_then(|rt| rt.block_on(orchestrate(cli.run))),
    };
    // Exit at once: a runtime would wait for the thread blocked reading standard input.
    let code = match outcome {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("velo-faults: {e}");
            1
        }
    };
    std::process::exit(code)
}

fn runtime(threads: usize) -> Result<tokio::runtime::Runtime, String> {
    let built = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    };
    built.map_err(|e| e.to_string())
}

async fn orchestrate(a: RunArgs) -> Result<(), String> {
    let planes = planes(&a.planes)?;
    let scenarios = select(&a.scenarios)?;
    let log_dir = a.logs.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("velo-faults-{}", std::process::id()))
    });
    let opts = RunOpts {
        idle: Duration::from_millis(a.idle_ms),
        slack: Duration::from_millis(a.slack_ms),
        grace: Duration::from_millis(a.grace_ms),
        log_dir: log_dir.clone(),
    };
    println!(
        "velo-faults: idle timeout {:.1} s, detection bound idle + {:.1} s slack = {:.1} s \
         (go-away: grace {:.1} s); logs in {}",
        opts.idle.as_secs_f64(),
        opts.slack.as_secs_f64(),
        (opts.idle + opts.slack).as_secs_f64(),
        opts.grace.as_secs_f64(),
        log_dir.display()
    );
    let mut rows = Vec::new();
    for plane in &planes {
        let mut base = None;
        for sc in &scenarios {
            eprintln!("velo-faults: {} on {plane}", sc.name);
            let row = run::run(sc, plane, &opts, base.as_ref()).await;
            if sc.name == "baseline" {
                base = Some(row.baseline());
            }
            rows.push(row);
        }
    }
    let failed = table::print(&rows);
    if failed > 0 {
        return Err(format!(
            "{failed} scenario run(s) failed; logs in {}",
            log_dir.display()
        ));
    }
    let _ = std::fs::remove_dir_all(&log_dir);
    Ok(())
}

fn planes(list: &str) -> Result<Vec<String>, String> {
    list.split(',')
        .map(|p| match p.trim() {
            p @ ("velo" | "tcp") => Ok(p.to_owned()),
            other => Err(format!("unknown plane `{other}` (velo, tcp)")),
        })
        .collect()
}

/// The scenarios `list` names, the baseline first.
fn select(list: &str) -> Result<Vec<Scenario>, String> {
    let all = scenarios::all();
    if list == "all" {
        return Ok(all);
    }
    let names: Vec<&str> = list.split(',').map(str::trim).collect();
    if let Some(unknown) = names.iter().find(|n| !all.iter().any(|s| s.name == **n)) {
        let known: Vec<&str> = all.iter().map(|s| s.name).collect();
        return Err(format!(
            "unknown scenario `{unknown}` ({})",
            known.join(", ")
        ));
    }
    Ok(all
        .into_iter()
        .filter(|s| s.name == "baseline" || names.contains(&s.name))
        .collect())
}
