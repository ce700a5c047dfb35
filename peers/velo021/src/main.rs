//! velo-bench's velo 0.21 arms: the role binary (`frontend` / `worker`) velo-bench spawns for
//! `velo-0.21`, `velo-0.21-5ms` and `velo-0.21-pass`, on the published velo 0.21 (`default-features = false`)
//! through its public API, configured as Dynamo's Velo plane (PR #15231) configures it:
//!
//! - one `Velo` node per process, mux only (no per-stream listener);
//! - messenger mux with a credit window of 32 items;
//! - a TCP transport with 4 lanes, on the process's address (`--host`: loopback, or its own on
//!   the bench's netns topology), port chosen by the OS;
//! - zero-round-trip open: the frontend pre-binds each anchor and mints a ticket, the worker
//!   opens its sender from the ticket; a worker prepares each frontend once
//!   (`register_peer` + the `_hello` exchange), not per stream;
//! - flush policy left at velo's default (`velo-0.21`: greedy, a write at the end of every
//!   wake), or tuned: a 5 ms linger (`velo-0.21-5ms`, as our `velo-tcp-5ms`), or that linger
//!   plus a flush once per forward pass (`velo-0.21-pass`, as our `velo-tcp-pass`).
//!
//! Requests travel on velo-bench's request channel, as for our own arms.

mod frame;
mod frontend;
mod worker;

use std::net::{IpAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use velo::Velo;
use velo::streaming::{AutoFlush, FlushPolicy, MuxConfig};
use velo::transports::tcp::TcpTransportBuilder;
use velo_bench::reqplane::RequestSender;
use velo_bench::roles::{self, FrontendArgs, Role, WorkerArgs, WorkerSetup};

/// Credit window per stream, in items (Dynamo's `RESPONSE_CREDIT_WINDOW`; velo's default too).
const CREDIT_WINDOW: u32 = 32;
/// TCP lanes per peer (Dynamo's `RESPONSE_TCP_LANES`; velo's default is 1).
const TCP_LANES: u16 = 4;
/// The tuned arms' linger: a batch goes at most this long after its oldest record.
const LINGER: Duration = Duration::from_millis(5);

/// How an arm's batches are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flush {
    /// velo's default, left as Dynamo leaves it: at the end of every wake.
    Greedy,
    /// [`LINGER`] after a batch's oldest record.
    Linger,
    /// Once per forward pass (`Velo::flush_batch`), with [`LINGER`] as the cap.
    PerPass,
}

fn main() -> std::process::ExitCode {
    roles::main(|role| match role {
        Role::Frontend(a) => roles::run_frontend_role(a, frontend),
        Role::Worker(a) => roles::run_worker_role(a, worker),
    })
}

fn flush_of(arm: &str) -> Result<Flush, String> {
    match arm {
        "velo-0.21" => Ok(Flush::Greedy),
        "velo-0.21-5ms" => Ok(Flush::Linger),
        "velo-0.21-pass" => Ok(Flush::PerPass),
        other => Err(format!("{other:?} is not a velo 0.21 arm")),
    }
}

async fn frontend(a: FrontendArgs) -> Result<frontend::Frontend, String> {
    let (node, port) = node(flush_of(&a.arm)?, a.host).await?;
    let requests = RequestSender::connect_all(&a.workers).await?;
    Ok(frontend::Frontend::new(node, port, requests))
}

async fn worker(a: WorkerArgs) -> Result<WorkerSetup<worker::Worker>, String> {
    let flush = flush_of(&a.arm)?;
    let (node, _) = node(flush, a.host).await?;
    Ok(WorkerSetup::new(
        worker::Worker::new(node),
        flush == Flush::PerPass,
    ))
}

/// One response-plane node on `host` and its TCP port.
async fn node(flush: Flush, host: IpAddr) -> Result<(Velo, u16), String> {
    let flush_policy = match flush {
        Flush::Greedy => FlushPolicy::default(),
        Flush::Linger | Flush::PerPass => FlushPolicy::Auto(AutoFlush {
            on_admission: false,
            max_linger: Some(LINGER),
        }),
    };
    let mux = MuxConfig {
        enabled: true,
        initial_credit: CREDIT_WINDOW,
        flush_policy,
        ..MuxConfig::default()
    };
    // Bound here (rather than with `bind_addr`) only to learn the port the harness counts
    // connections on; the transport sizes its buffers before any connection arrives.
    let listener = TcpListener::bind((host, 0)).map_err(|e| e.to_string())?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let tcp = TcpTransportBuilder::new()
        .from_listener(listener)
        .map_err(|e| e.to_string())?
        .lanes(TCP_LANES)
        .build()
        .map_err(|e| e.to_string())?;
    let node = Velo::builder()
        .mux_only()
        .messenger_mux(mux)
        .map_err(|e| e.to_string())?
        .add_transport(Arc::new(tcp))
        .build()
        .await
        .map_err(|e| format!("velo node: {e:#}"))?;
    Ok((node, port))
}
