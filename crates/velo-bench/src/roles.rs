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
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::adapter::{BenchFrontend, BenchWorker};
use crate::protocol::FrontendLine;
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
    /// Requests in flight.
    #[arg(long)]
    pub concurrency: u32,
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
    /// Runtime threads (1: a current-thread runtime).
    #[arg(long, default_value_t = 2)]
    pub threads: u32,
    /// Pin the process to this CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
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
        flag(&mut line, "--concurrency", self.concurrency);
        flag(&mut line, "--isl", self.isl);
        flag(&mut line, "--osl", self.osl);
        flag(&mut line, "--warmup", self.warmup);
        flag(&mut line, "--duration", self.duration);
        flag(&mut line, "--threads", self.threads);
        if let Some(cpu) = self.cpu {
            flag(&mut line, "--cpu", cpu);
        }
        line
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
    exit(role(RoleCli::parse().role))
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

/// Runs a frontend process: builds its plane with `make` inside the runtime, runs the load
/// (saying the window's lines) and says [`FrontendLine::Result`].
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
        concurrency: args.concurrency,
        isl: args.isl,
        osl: args.osl,
        warmup: Duration::from_secs_f64(args.warmup),
        duration: Duration::from_secs_f64(args.duration),
    };
    runtime(args.threads)?.block_on(async move {
        let plane = make(args).await?;
        let report = frontend::run(plane, opts)
            .await
            .map_err(|e| e.to_string())?;
        FrontendLine::Result(Box::new(report))
            .say()
            .await
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
            concurrency: 256,
            isl: 256,
            osl: 128,
            warmup: 0.5,
            duration: 1.0 / 3.0,
            threads: 1,
            cpu: Some(0),
        };
        let worker = WorkerArgs {
            arm: "tcp".into(),
            engines: 2,
            speedup: 10.0,
            cpu: None,
        };
        for role in [
            Role::Frontend(frontend.clone()),
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
