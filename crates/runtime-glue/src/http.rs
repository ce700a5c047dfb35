//! The Prometheus scrape endpoint: `GET /metrics` over HTTP/1.1.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;

/// Longest a scrape connection may stay open.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves scrapes until `stop`; connections run on `tracker`, each bounded in time.
pub(crate) async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    loop {
        // Cancel safety: `accept` loses no connection when dropped.
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = stop.cancelled() => return,
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let metrics = metrics.clone();
        tracker.spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let response = respond(&metrics, &req);
                async move { Ok::<_, Infallible>(response) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await;
        });
    }
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
