//! velo-bench's Dynamo arms: the role binary (`frontend` / `worker`) velo-bench spawns for
//! `dynamo-tcp`, `dynamo-tcp-drt` and `dynamo-quic`. Dynamo's planes come from dynamo-runtime 1.6.1 as a
//! dependency, through its public API only; see `peers/README.md` for what each arm uses
//! and why.
//!
//! Configuration is Dynamo's: its documented defaults and environment variables. The only
//! ones this binary sets (when unset) keep both planes on the process's address (`--host`:
//! loopback, or its own address on the bench's netns topology), where Dynamo would pick the
//! first non-loopback address: `DYN_TCP_RESPONSE_STREAM_HOST` (response listeners, TCP and
//! QUIC) and `DYN_TCP_RPC_HOST` (the request-plane server of the arms on a
//! `DistributedRuntime`).

mod drt;
mod frontend;
mod worker;

use dynamo_runtime::pipeline::network::ResponsePlaneMode;
use velo_bench::roles::{self, FrontendArgs, Role, WorkerArgs, WorkerSetup};

/// The endpoint the workers serve, as Dynamo names one.
pub(crate) const NAMESPACE: &str = "velo-bench";
pub(crate) const COMPONENT: &str = "mocker";
pub(crate) const ENDPOINT: &str = "generate";

/// Dynamo's host selection, set to the process's `--host` when unset.
const HOST_ENV: [&str; 2] = ["DYN_TCP_RESPONSE_STREAM_HOST", "DYN_TCP_RPC_HOST"];

fn main() -> std::process::ExitCode {
    let role = roles::parse();
    let host = match &role {
        Role::Frontend(a) => a.host,
        Role::Worker(a) => a.host,
    };
    for key in HOST_ENV {
        if std::env::var_os(key).is_none() {
            // SAFETY: no other thread exists yet: the runtime starts after this loop.
            unsafe { std::env::set_var(key, host.to_string()) };
        }
    }
    roles::exit(run(role))
}

fn run(role: Role) -> Result<(), String> {
    match role {
        Role::Frontend(a) => roles::run_frontend_role(a, frontend),
        Role::Worker(a) => match drt_mode(&a.arm)? {
            Some(mode) => roles::run_worker_role(a, |_| drt::worker(mode)),
            None => roles::run_worker_role(a, tcp_worker),
        },
    }
}

/// The response plane of an arm on a `DistributedRuntime`, or `None` for dynamo-tcp (ours
/// request channel, no runtime).
fn drt_mode(arm: &str) -> Result<Option<ResponsePlaneMode>, String> {
    match arm {
        // TLS is Dynamo's own, switched on by the DYN_TCP_TLS_* variables the orchestrator
        // sets for this arm.
        "dynamo-tcp" | "dynamo-tcp-tls" => Ok(None),
        "dynamo-tcp-drt" => Ok(Some(ResponsePlaneMode::Tcp)),
        "dynamo-quic" => Ok(Some(ResponsePlaneMode::Quic)),
        other => Err(format!("{other:?} is not a Dynamo arm")),
    }
}

async fn frontend(a: FrontendArgs) -> Result<frontend::Frontend, String> {
    match drt_mode(&a.arm)? {
        Some(mode) => frontend::Frontend::drt(drt::runtime(mode).await?, &a.workers).await,
        None => frontend::Frontend::tcp(&a.workers).await,
    }
}

async fn tcp_worker(_: WorkerArgs) -> Result<WorkerSetup<worker::Worker>, String> {
    Ok(WorkerSetup::new(worker::Worker::tcp(), false))
}

/// The value of environment variable `key`, or `default`.
pub(crate) fn env_or(key: &str, default: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| default.to_owned())
}
