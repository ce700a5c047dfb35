//! The role CLI every bench binary speaks: `frontend` and `worker` subcommands, spawned by the
//! orchestrator ([`crate::orchestrate`]) once per run. Our binary and the peer binaries
//! (`peers/`) share it, so an arm differs from another only in the constructors it passes:
//!
//! ```no_run
//! use velo_bench::roles::{self, Role, WorkerSetup};
//! # use velo_bench::adapter::ours;
//! # async fn frontend(a: roles::FrontendArgs) -> Result<ours::Frontend, String> { todo!() }
//! # async fn worker(a: roles::WorkerArgs) -> Result<WorkerSetup<ours::Worker>, String> { todo!() }
//! fn main() -> std::process::ExitCode {
//!     roles::main(|role| match role {
//!         Role::Frontend(a) => roles::run_frontend_role(a, frontend),
//!         Role::Worker(a) => roles::run_worker_role(a, worker),
//!     })
//! }
//! ```

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::adapter::{BenchFrontend, BenchWorker};
use crate::frontend::Load;
use crate::worker::{Ingress, RequestChannel, WorkerOpts};
use crate::{frontend, procfs, worker};

/// A process of one run.
#[derive(Subcommand, Debug, Clone, PartialEq)]
pub enum Role {
    /// (internal) A frontend process of one run.
    #[command(hide = true)]
    Frontend(FrontendArgs),
    /// (internal) A worker process of one run.
    #[command(hide = true)]
    Worker(WorkerArgs),
}

/// The command line of a binary that only runs roles (the peer binaries).
#[derive(Parser, Debug)]
#[command(about = "A velo-bench role binary; run by velo-bench, not by hand")]
pub struct RoleCli {
    /// The role.
    #[command(subcommand)]
    pub role: Role,
}

/// A frontend process's arguments.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct FrontendArgs {
    /// The arm.
    #[arg(long)]
    pub arm: String,
    /// The worker processes' addresses, as each announced it
    /// ([`WorkerLine::Ready`](crate::protocol::WorkerLine::Ready)).
    #[arg(long, value_delimiter = ',')]
    pub workers: Vec<String>,
    /// Mock engines per worker process.
    #[arg(long)]
    pub engines_per_process: u32,
    /// Closed loop: requests in flight.
    #[arg(long, required_unless_present = "rates")]
    pub concurrency: Option<u32>,
    /// Open loop: offered loads, requests per second, one measurement window each (instead of
    /// `--concurrency`).
    #[arg(long, value_delimiter = ',', conflicts_with = "concurrency")]
    pub rates: Vec<f64>,
    /// Open loop: the seed of the arrival times.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Open loop: requests in flight at most (an arrival beyond is dropped and counted).
    #[arg(long, default_value_t = 65_536)]
    pub max_in_flight: u32,
    /// Prompt length, tokens.
    #[arg(long)]
    pub isl: u32,
    /// Output length, tokens.
    #[arg(long)]
    pub osl: u32,
    /// Warm-up, seconds.
    #[arg(long)]
    pub warmup: f64,
    /// Measurement window, seconds.
    #[arg(long)]
    pub duration: f64,
    /// Time the requests of a window get to end before it is reported, seconds.
    #[arg(long, default_value_t = 1.0)]
    pub settle: f64,
    /// Runtime threads (1: a current-thread runtime).
    #[arg(long, default_value_t = 2)]
    pub threads: u32,
    /// Pin the process to this CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// The address the plane listens on and gives workers.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub host: IpAddr,
}

/// A worker process's arguments.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct WorkerArgs {
    /// The arm.
    #[arg(long)]
    pub arm: String,
    /// Mock engines in this process.
    #[arg(long)]
    pub engines: u32,
    /// The mocker's speedup ratio.
    #[arg(long)]
    pub speedup: f64,
    /// Pin the process to this CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// The address the worker takes requests on (and its plane binds to, where it listens).
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub host: IpAddr,
}

impl Role {
    /// The command line (after the binary's name) that parses back into this role: how the
    /// orchestrator spawns it.
    pub fn command_line(&self) -> Vec<String> {
        match self {
            Self::Frontend(a) => a.command_line(),
            Self::Worker(a) => a.command_line(),
        }
    }
}

impl FrontendArgs {
    /// `frontend` and these arguments' flags.
    pub fn command_line(&self) -> Vec<String> {
        let mut line = vec!["frontend".to_owned()];
        flag(&mut line, "--arm", &self.arm);
        flag(&mut line, "--workers", self.workers.join(","));
        flag(&mut line, "--engines-per-process", self.engines_per_process);
        if let Some(c) = self.concurrency {
            flag(&mut line, "--concurrency", c);
        }
        if !self.rates.is_empty() {
            let rates: Vec<String> = self.rates.iter().map(f64::to_string).collect();
            flag(&mut line, "--rates", rates.join(","));
        }
        flag(&mut line, "--seed", self.seed);
        flag(&mut line, "--max-in-flight", self.max_in_flight);
        flag(&mut line, "--isl", self.isl);
        flag(&mut line, "--osl", self.osl);
        flag(&mut line, "--warmup", self.warmup);
        flag(&mut line, "--duration", self.duration);
        flag(&mut line, "--settle", self.settle);
        flag(&mut line, "--threads", self.threads);
        if let Some(cpu) = self.cpu {
            flag(&mut line, "--cpu", cpu);
        }
        flag(&mut line, "--host", self.host);
        line
    }

    /// The load these arguments describe: an open loop when rates are given.
    pub fn load(&self) -> Load {
        match self.concurrency {
            Some(concurrency) if self.rates.is_empty() => Load::Closed { concurrency },
            _ => Load::Open {
                rates: self.rates.clone(),
                seed: self.seed,
                max_in_flight: self.max_in_flight,
            },
        }
    }
}

impl WorkerArgs {
    /// `worker` and these arguments' flags.
    pub fn command_line(&self) -> Vec<String> {
        let mut line = vec!["worker".to_owned()];
        flag(&mut line, "--arm", &self.arm);
        flag(&mut line, "--engines", self.engines);
        flag(&mut line, "--speedup", self.speedup);
        if let Some(cpu) = self.cpu {
            flag(&mut line, "--cpu", cpu);
        }
        flag(&mut line, "--host", self.host);
        line
    }
}

/// What a worker constructor returns: the plane, whether its engines flush once per forward
/// pass, and where requests come from.
pub struct WorkerSetup<W, I = RequestChannel> {
    /// The plane.
    pub plane: W,
    /// Call [`BenchWorker::flush`] at the end of every forward pass.
    pub flush_per_pass: bool,
    /// Where requests come from.
    pub ingress: I,
}

impl<W> WorkerSetup<W> {
    /// `plane` on our request channel.
    pub fn new(plane: W, flush_per_pass: bool) -> Self {
        Self {
            plane,
            flush_per_pass,
            ingress: RequestChannel,
        }
    }
}

/// Parses a [`RoleCli`] and runs `role`, mapping its outcome to an exit code (the error is
/// printed).
pub fn main(role: impl FnOnce(Role) -> Result<(), String>) -> std::process::ExitCode {
    exit(role(parse()))
}

/// Parses the process's command line as a [`RoleCli`] (exiting with clap's message if it is
/// not one), for a binary that must look at its role before running it.
pub fn parse() -> Role {
    RoleCli::parse().role
}

/// The exit code of a role or an orchestration, printing the error.
pub fn exit(outcome: Result<(), String>) -> std::process::ExitCode {
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("velo-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs a frontend process: builds its plane with `make` inside the runtime and runs the load,
/// which says the windows' lines and their results
/// ([`FrontendLine::Result`](crate::protocol::FrontendLine::Result)).
///
/// # Errors
///
/// Pinning, the runtime, the constructor or the load failed.
pub fn run_frontend_role<F, Fut>(
    args: FrontendArgs,
    make: impl FnOnce(FrontendArgs) -> Fut,
) -> Result<(), String>
where
    F: BenchFrontend,
    Fut: Future<Output = Result<F, String>>,
{
    pin(args.cpu)?;
    let opts = frontend::FrontendOpts {
        worker_processes: args.workers.len(),
        engines_per_process: args.engines_per_process,
        load: args.load(),
        isl: args.isl,
        osl: args.osl,
        warmup: Duration::from_secs_f64(args.warmup),
        duration: Duration::from_secs_f64(args.duration),
        settle: Duration::from_secs_f64(args.settle),
    };
    runtime(args.threads)?.block_on(async move {
        let plane = make(args).await?;
        frontend::run(plane, opts)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    })
}

/// Runs a worker process on a current-thread runtime: builds its plane with `make`, starts
/// the engines and the ingress, says [`WorkerLine::Ready`](crate::protocol::WorkerLine::Ready) and
/// serves until killed.
///
/// # Errors
///
/// Pinning, the runtime, the constructor or the ingress failed.
pub fn run_worker_role<W, I, Fut>(
    args: WorkerArgs,
    make: impl FnOnce(WorkerArgs) -> Fut,
) -> Result<(), String>
where
    W: BenchWorker,
    I: Ingress<W>,
    Fut: Future<Output = Result<WorkerSetup<W, I>, String>>,
{
    pin(args.cpu)?;
    worker::set_host(args.host);
    let (engines, speedup) = (args.engines, args.speedup);
    runtime(1)?.block_on(async move {
        let setup = make(args).await?;
        let opts = WorkerOpts {
            engines,
            speedup,
            flush_per_pass: setup.flush_per_pass,
        };
        worker::run_with(setup.plane, opts, setup.ingress).await
    })
}

/// Appends `--name value` (a float in Rust's shortest form that parses back to it exactly).
fn flag(line: &mut Vec<String>, name: &str, value: impl std::fmt::Display) {
    line.push(name.to_owned());
    line.push(value.to_string());
}

fn pin(cpu: Option<usize>) -> Result<(), String> {
    match cpu {
        Some(cpu) => procfs::pin_to_cpu(cpu).map_err(|e| format!("pin to cpu {cpu}: {e}")),
        None => Ok(()),
    }
}

/// A runtime with `threads` workers (1: a current-thread runtime).
fn runtime(threads: u32) -> Result<tokio::runtime::Runtime, String> {
    let r = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads as usize)
            .enable_all()
            .build()
    };
    r.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(role: &Role) -> Role {
        let line = std::iter::once("velo-bench".to_owned()).chain(role.command_line());
        RoleCli::try_parse_from(line).expect("parses").role
    }

    #[test]
    fn command_lines_parse_back_into_their_roles() {
        let frontend = FrontendArgs {
            arm: "velo-tcp-5ms".into(),
            workers: vec!["127.0.0.1:1".into(), "tcp://127.0.0.1:2/ab/ns/c/e".into()],
            engines_per_process: 4,
            concurrency: Some(256),
            rates: Vec::new(),
            seed: 1,
            max_in_flight: 100,
            isl: 256,
            osl: 128,
            warmup: 0.5,
            duration: 1.0 / 3.0,
            settle: 0.25,
            threads: 1,
            cpu: Some(0),
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        let worker = WorkerArgs {
            arm: "tcp".into(),
            engines: 2,
            speedup: 10.0,
            cpu: None,
            host: "10.77.0.3".parse().unwrap(),
        };
        let open = FrontendArgs {
            concurrency: None,
            rates: vec![100.0, 1e4 / 3.0],
            seed: u64::MAX,
            host: "10.77.0.2".parse().unwrap(),
            ..frontend.clone()
        };
        assert_eq!(frontend.load(), Load::Closed { concurrency: 256 });
        assert!(
            matches!(open.load(), Load::Open { rates, seed: u64::MAX, max_in_flight: 100 } if rates.len() == 2)
        );
        for role in [
            Role::Frontend(frontend.clone()),
            Role::Frontend(open),
            Role::Frontend(FrontendArgs {
                cpu: None,
                ..frontend
            }),
            Role::Worker(worker.clone()),
            Role::Worker(WorkerArgs {
                cpu: Some(1),
                speedup: 0.1,
                ..worker
            }),
        ] {
            assert_eq!(parsed(&role), role);
        }
    }
}
