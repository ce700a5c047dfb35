//! A run of streams, then a scrape of the metrics endpoint over HTTP: names, labels and
//! values, and the exposition is valid for Prometheus (`promtool check metrics`).

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use response_plane::{ConnectionInfo, Plane, RegisterOptions, ResponseError};
use runtime_glue::{ResponseService, Role, ServiceConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Resolves `f`, failing the test after a generous bound.
async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("the stream made progress within 30 s")
}

async fn scrape(service: &ResponseService) -> String {
    let addr = service.metrics_addr().expect("a metrics endpoint");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    body.to_owned()
}

/// `name{labels} value` lines, keyed by name and sorted labels.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_owned(), value.parse().ok()?))
        })
        .collect()
}

fn value(s: &HashMap<String, f64>, name: &str, labels: &[(&str, &str)]) -> f64 {
    s.iter()
        .filter(|(k, _)| k.starts_with(&format!("{name}{{")) || k.as_str() == name)
        .filter(|(k, _)| {
            labels
                .iter()
                .all(|(l, v)| k.contains(&format!("{l}=\"{v}\"")))
        })
        .map(|(_, v)| *v)
        .sum()
}

async fn run(plane: Plane) {
    let lookup = |var: &str| match var {
        "DYN_RESPONSE_PLANE" => Some(plane.name().to_owned()),
        "DYN_TCP_RESPONSE_STREAM_HOST" => Some("127.0.0.1".to_owned()),
        "DYN_VELO_METRICS_ADDR" => Some("127.0.0.1:0".to_owned()),
        // Batches wait up to 10 s, so below only an edge, a hint or a heartbeat flushes.
        "DYN_VELO_RESPONSE_BATCH_MS" => Some("10000".to_owned()),
        _ => None,
    };
    let service = ResponseService::start(ServiceConfig::from_lookup(Role::Both, lookup).unwrap())
        .await
        .unwrap();
    let before = samples(&scrape(&service).await);
    assert_eq!(
        value(
            &before,
            "dynamo_component_errors_total",
            &[("error_type", "response_stream")]
        ),
        0.0
    );

    // One stream that completes. Its prologue and first item are edges, written at once;
    // once the first item has arrived, the next nine wait in an open batch that only the
    // flush hint can write (the batch delay is 10 s), so the frontend reading them proves
    // the hint flushed, and counted, a batch.
    let (info, pending) = service.register::<u32>(RegisterOptions::default()).unwrap();
    let mut tx = service.connect::<u32>(&info).await.unwrap();
    tx.send_prologue(Ok(())).await.unwrap();
    let mut rx = within(pending.established()).await.unwrap();
    tx.send(&0).await.unwrap();
    assert_eq!(within(rx.next()).await.unwrap().unwrap(), 0);
    for i in 1..10 {
        tx.send(&i).await.unwrap();
    }
    service.flush();
    for i in 1..10 {
        assert_eq!(within(rx.next()).await.unwrap().unwrap(), i);
    }
    tx.finish().await.unwrap();
    assert!(within(rx.next()).await.is_none(), "a clean end");

    // One whose setup fails: the worker cannot reach the frontend (a response_stream error).
    let mut unreachable: serde_json::Value = serde_json::from_str(&info.info).unwrap();
    // Another frontend instance, which is down (connections are cached per instance).
    unreachable["addr"] = "127.0.0.1:1".into();
    unreachable["instance"] = "0000000000000000000000000000abcd".into();
    let bad = ConnectionInfo {
        transport: info.transport.clone(),
        info: unreachable.to_string(),
    };
    let err = service.connect::<u32>(&bad).await.unwrap_err();
    assert!(matches!(err, ResponseError::Unreachable { .. }), "{err}");

    // One the frontend kills: the worker counts a cancellation.
    let (info, pending) = service.register::<u32>(RegisterOptions::default()).unwrap();
    let mut tx = service.connect::<u32>(&info).await.unwrap();
    tx.send_prologue(Ok(())).await.unwrap();
    service.flush();
    let ctx = tx.context();
    let mut rx = pending.established().await.unwrap();
    rx.kill();
    tokio::time::timeout(Duration::from_secs(10), ctx.killed())
        .await
        .unwrap();
    drop((rx, tx));

    let body = scrape(&service).await;
    let after = samples(&body);
    assert_eq!(
        value(
            &after,
            "dynamo_component_errors_total",
            &[("error_type", "response_stream")]
        ),
        1.0,
        "{body}"
    );
    assert_eq!(
        value(&after, "dynamo_component_cancellation_total", &[]),
        1.0,
        "{body}"
    );
    assert_eq!(
        value(
            &after,
            "velo_response_streams_registered_total",
            &[("side", "frontend")]
        ),
        2.0,
        "{body}"
    );
    assert_eq!(
        value(
            &after,
            "velo_response_streams_established_total",
            &[("side", "worker")]
        ),
        2.0,
        "{body}"
    );
    assert_eq!(
        value(
            &after,
            "velo_response_stream_setup_seconds_count",
            &[("side", "frontend")]
        ),
        2.0,
        "{body}"
    );
    assert!(
        body.contains("velo_response_stream_setup_seconds_bucket{le=\"0.0001\",side=\"frontend\"}")
            || body.contains(
                "velo_response_stream_setup_seconds_bucket{side=\"frontend\",le=\"0.0001\"}"
            ),
        "explicit boundaries in seconds:\n{body}"
    );
    if plane == Plane::Velo {
        // The batch-size histogram is the transport's own bucket counts, read at the scrape
        // (lanes keep sending heartbeats meanwhile: between two readings of the counters).
        let batches = |s: &response_plane::PlaneStats| -> u64 { s.mux.batch_records.iter().sum() };
        let small = |s: &response_plane::PlaneStats| s.mux.batch_records[0];
        let worker = service.worker().unwrap();
        let early = worker.stats();
        let exported = samples(&scrape(&service).await);
        let late = worker.stats();
        let count = value(
            &exported,
            "velo_response_batch_records_count",
            &[("side", "worker")],
        );
        assert!(
            (batches(&early) as f64..=batches(&late) as f64).contains(&count),
            "{count} batches exported, the transport counted {} then {}",
            batches(&early),
            batches(&late)
        );
        let ones = value(
            &exported,
            "velo_response_batch_records_bucket",
            &[("side", "worker"), ("le", "1")],
        );
        assert!((small(&early) as f64..=small(&late) as f64).contains(&ones));
        assert!(
            value(
                &exported,
                "velo_response_batch_records_bucket",
                &[("side", "worker"), ("le", "+Inf")],
            ) == count
        );
        assert!(
            value(
                &after,
                "velo_response_records_sent_total",
                &[("side", "worker")]
            ) >= 11.0,
            "{body}"
        );
        assert!(
            value(
                &after,
                "velo_response_records_received_total",
                &[("side", "frontend")]
            ) >= 11.0,
            "{body}"
        );
        assert!(
            value(
                &after,
                "velo_response_batches_sent_total",
                &[("side", "worker")]
            ) >= 1.0,
            "{body}"
        );
        assert!(
            value(
                &after,
                "velo_response_batch_records_count",
                &[("side", "worker")]
            ) >= 1.0,
            "{body}"
        );
        assert_eq!(
            value(
                &after,
                "velo_response_lanes_connected",
                &[("side", "worker")]
            ),
            4.0,
            "{body}"
        );
        assert!(
            value(
                &after,
                "velo_response_streams_ended_total",
                &[("side", "frontend"), ("reason", "finished")]
            ) >= 1.0,
            "{body}"
        );
        assert!(
            value(
                &after,
                "velo_response_flushes_total",
                &[("side", "worker"), ("reason", "hint")]
            ) >= 1.0,
            "the flush hint wrote the middle items:\n{body}"
        );
    }
    for name in [
        "velo_response_credit_stalls_total",
        "velo_response_stale_drops_total",
        "velo_response_handshake_failures_total",
        "velo_response_streams_active",
    ] {
        assert!(
            body.contains(&format!("# TYPE {name} ")),
            "{name} is exported:\n{body}"
        );
    }
    if std::env::var_os("VELO_SHOW_METRICS").is_some() {
        println!("{body}");
    }
    promtool_check(&body);

    let report = service.shutdown().await;
    assert_eq!(report.outcome(), "clean");
    let err = service
        .register::<u32>(RegisterOptions::default())
        .unwrap_err();
    assert_eq!(
        err,
        ResponseError::Closed,
        "registrations after shutdown fail cleanly"
    );
}

/// Validates the exposition with Prometheus's own checker (Debian package `prometheus`).
fn promtool_check(body: &str) {
    use std::io::Write;
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child =
        child.expect("promtool is needed for this test: apt-get install prometheus (.ci/run does)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{report}\n--- exposition ---\n{body}"
    );
}

#[cfg(feature = "tcp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_after_streams_on_the_velo_plane_shows_names_labels_and_values() {
    run(Plane::Velo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_after_streams_on_the_classic_plane_shows_names_labels_and_values() {
    run(Plane::Classic).await;
}
