//! The Prometheus scrape endpoint: `GET /metrics` over HTTP/1.1.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;

/// Most scrape connections served at once. Past it the endpoint stops accepting: further
/// clients wait in the kernel's listen backlog until a connection ends, so clients that
/// connect and say nothing cannot grow the process, and a scrape queued behind them is
/// served (not refused) once they time out.
pub(crate) const MAX_CONNECTIONS: usize = 64;

/// Longest a client may take to send a request's headers, counting the wait for the next
/// request on a kept-alive connection; then the connection is closed. A scraper sends its
/// request at once, so a silent (slowloris) client holds a slot at most this long.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest a scrape connection may stay open, whatever it does (a client that reads its
/// response slowly included).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// Bounds on the endpoint's connections.
#[derive(Debug)]
pub(crate) struct Limits {
    max_connections: usize,
    header_timeout: Duration,
    /// One permit per connection being served.
    slots: Arc<Semaphore>,
}

impl Limits {
    pub(crate) fn new(max_connections: usize, header_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            max_connections,
            header_timeout,
            slots: Arc::new(Semaphore::new(max_connections)),
        })
    }
}

/// Serves scrapes until `stop`, at most [`MAX_CONNECTIONS`] at once; connections run on
/// `tracker`, each bounded in time ([`HEADER_TIMEOUT`], `CONNECTION_TIMEOUT`).
pub(crate) async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    let limits = Limits::new(MAX_CONNECTIONS, HEADER_TIMEOUT);
    serve_with(listener, metrics, tracker, stop, limits).await;
}

async fn serve_with(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    tracker: TaskTracker,
    stop: CancellationToken,
    limits: Arc<Limits>,
) {
    debug_assert!(limits.max_connections > 0);
    loop {
        // A slot first, then a connection: at the cap, clients wait in the backlog.
        // Cancel safety: a permit not yet granted is not taken; `accept` loses no connection.
        let permit = tokio::select! {
            p = limits.slots.clone().acquire_owned() => p,
            () = stop.cancelled() => return,
        };
        let Ok(permit) = permit else {
            return; // the semaphore is never closed
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = stop.cancelled() => return,
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let metrics = metrics.clone();
        tracker.spawn(connection(stream, metrics, limits.header_timeout, permit));
    }
}

/// Serves one connection within its time bounds; its slot frees when it ends.
async fn connection(
    stream: TcpStream,
    metrics: Arc<Metrics>,
    header_timeout: Duration,
    _slot: OwnedSemaphorePermit,
) {
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let response = respond(&metrics, &req);
        async move { Ok::<_, Infallible>(response) }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let conn = http.serve_connection(TokioIo::new(stream), service);
    let _ = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await;
}

fn respond(metrics: &Metrics, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let mut response = if req.method() == Method::GET && req.uri().path() == "/metrics" {
        let mut r = Response::new(Full::new(Bytes::from(metrics.render())));
        r.headers_mut().insert(
            "content-type",
            hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
        );
        r
    } else {
        let mut r = Response::new(Full::new(Bytes::from_static(b"not found: GET /metrics\n")));
        *r.status_mut() = StatusCode::NOT_FOUND;
        r
    };
    response.headers_mut().insert(
        "cache-control",
        hyper::header::HeaderValue::from_static("no-store"),
    );
    response
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;
    use crate::metrics::Telemetry;

    const BOUND: Duration = Duration::from_secs(30);

    async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
        tokio::time::timeout(BOUND, f)
            .await
            .unwrap_or_else(|_| panic!("{what}: not done within {BOUND:?}"))
    }

    /// Polls the connection tasks on `tracker` until `done` holds for their number; returns
    /// the largest number seen.
    async fn watch_open(tracker: &TaskTracker, done: impl Fn(usize) -> bool) -> usize {
        let mut most = 0;
        within("the open count", async {
            loop {
                let open = tracker.len();
                most = most.max(open);
                if done(open) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        most
    }

    async fn scrape(addr: std::net::SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut raw = Vec::new();
        within("the scrape", s.read_to_end(&mut raw)).await.unwrap();
        String::from_utf8(raw).unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn silent_connections_are_capped_and_closed_and_a_scrape_still_succeeds() {
        const CAP: usize = 4;
        let limits = Limits::new(CAP, Duration::from_millis(300));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Arc::new(Metrics::new(Telemetry::new().unwrap(), None, None));
        let (tracker, stop) = (TaskTracker::new(), CancellationToken::new());
        // The accept loop runs apart: `tracker` holds the connection tasks only.
        let server = serve_with(listener, metrics, tracker.clone(), stop.clone(), limits);
        let server = tokio::spawn(server);
        let mut silent = Vec::new();
        for _ in 0..3 * CAP {
            silent.push(TcpStream::connect(addr).await.unwrap());
        }
        let most = watch_open(&tracker, |open| open >= CAP).await;
        assert!(most <= CAP, "{most} connections held, the cap is {CAP}");
        let response = scrape(addr).await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        for mut s in silent {
            // Closed by the server: end of stream, or a reset.
            let mut byte = [0; 1];
            let read = within("a silent connection is closed", s.read(&mut byte)).await;
            assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        }
        let most = watch_open(&tracker, |open| open == 0).await;
        assert!(most <= CAP, "{most} connections held, the cap is {CAP}");
        stop.cancel();
        within("the endpoint stops", server).await.unwrap();
    }
}
