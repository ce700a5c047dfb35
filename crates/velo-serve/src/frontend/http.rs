//! The HTTP server's own bounds: connections served at once, how long a client may take to
//! send its request's headers and its body, and how long it may leave an answer unread.
//! Without them a client that opens connections and sends nothing (or a byte a minute), or
//! stops reading a streamed answer, holds a task, a socket and a buffer each, for ever.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_io_timeout::TimeoutStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::openai::ApiError;

/// HTTP connections served at once by default; more wait in the kernel's accept queue.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// How long a client has to send a request's headers by default (also how long an idle
/// kept-alive connection waits for its next request).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a client has to send a request's body by default.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection's writes may make no progress by default (a client that stopped
/// reading, its window closed) before the connection is cut.
pub const DEFAULT_WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes of request bodies being read at once by default (64 bodies of the default 4 MiB
/// limit); a request past it is refused with 503.
pub const DEFAULT_BODY_BUDGET_BYTES: usize = 256 << 20;
/// How long the accept loop pauses after an accept error (out of file descriptors: retrying
/// at once would spin).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// The HTTP server's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Connections served at once.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers.
    pub header_read_timeout: Duration,
    /// How long a client may take to send a request's body.
    pub body_read_timeout: Duration,
    /// How long a connection's writes may make no progress (the client stopped reading)
    /// before the connection is cut, freeing its slot and whatever it held.
    pub write_stall_timeout: Duration,
    /// Bytes of request bodies being read at once: each request reserves its body's length
    /// (its `Content-Length`, else the largest body allowed) while it is read.
    pub body_budget_bytes: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            write_stall_timeout: DEFAULT_WRITE_STALL_TIMEOUT,
            body_budget_bytes: DEFAULT_BODY_BUDGET_BYTES,
        }
    }
}

/// Serves `app` on `listener` within `limits` until `stop`, then lets open connections finish
/// their requests (the caller bounds that wait on `tracker`).
pub(super) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    loop {
        // Cancel safety: a permit or a connection not yet taken is simply not taken.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot,
            () = stop.cancelled() => break,
        };
        let Ok(slot) = slot else { break };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = stop.cancelled() => break,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                tracing::warn!(error = %e, "cannot accept an HTTP connection");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        // Each SSE event is a small write: without TCP_NODELAY, Nagle's algorithm holds it
        // until the client's delayed ACK (~40 ms on Linux), which serve-bench saw as TTFT.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on an HTTP connection");
        }
        // A write that makes no progress for the stall bound fails the connection: hyper
        // drops it, with the answer's queue and the slot.
        let mut io = TimeoutStream::new(tcp);
        io.set_write_timeout(Some(limits.write_stall_timeout));
        let service = TowerToHyperService::new(app.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(Box::pin(io)), service));
        tracker.spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "HTTP connection ended in error");
            }
            drop(slot);
        });
    }
    // Open connections finish the request in flight and close.
    graceful.shutdown().await;
}

/// The memory reserved for request bodies being read, in KiB (a semaphore counts at most
/// `u32::MAX` permits).
#[derive(Debug)]
pub struct BodyBudget(Semaphore);

impl BodyBudget {
    /// A budget of `limits.body_budget_bytes`.
    pub fn new(limits: &HttpLimits) -> Self {
        let kib = limits
            .body_budget_bytes
            .div_ceil(1024)
            .min(Semaphore::MAX_PERMITS);
        Self(Semaphore::new(kib))
    }
}

/// The request's body, read within `limits.body_read_timeout` and `max_bytes`, and while its
/// length (`declared`, else `max_bytes`) fits what is left of `budget`.
///
/// # Errors
///
/// 413 naming the limit, 503 naming the budget when it is spent, 408 when the body is late,
/// 400 when it cannot be read.
pub(super) async fn read_body(
    body: Body,
    declared: Option<u64>,
    max_bytes: usize,
    (limits, budget): (HttpLimits, &BodyBudget),
) -> Result<Bytes, ApiError> {
    let reserve = declared
        .and_then(|n| usize::try_from(n).ok())
        .map_or(max_bytes, |n| n.min(max_bytes));
    let kib = u32::try_from(reserve.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
    // Released when the body has been read (or refused).
    let Ok(_reserved) = budget.0.try_acquire_many(kib) else {
        return Err(ApiError::overloaded(format!(
            "the server is reading as many request bodies as its budget of {} bytes allows \
             (body_budget_bytes); retry later",
            limits.body_budget_bytes
        )));
    };
    let within = limits.body_read_timeout;
    let read = tokio::time::timeout(within, Limited::new(body, max_bytes).collect()).await;
    match read {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            ..ApiError::invalid(
                format!(
                    "the request body is larger than this server's limit of {max_bytes} bytes \
                     (max_body_bytes)"
                ),
                None,
            )
        }),
        Ok(Err(e)) => Err(ApiError::invalid(
            format!("cannot read the request body: {e}"),
            None,
        )),
        Err(_) => Err(ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            ..ApiError::invalid(
                format!("the request body did not arrive within {within:?}"),
                None,
            )
        }),
    }
}
