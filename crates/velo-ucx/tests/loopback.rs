//! The UCX transport on real loopback endpoints (UCX_TLS=tcp over lo). Every wait is bounded.

#![cfg(feature = "ucx")]

mod common;

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::*;
use tokio_util::task::TaskTracker;
use velo_mux::{LaneError, StreamEnd};
use velo_session::ConnectError;
use velo_ucx::testing::{RawEndpoint, RawLane};
use velo_ucx::{ProgressEngine, UcxConfig, UcxError};
use velo_wire::{Close, CloseCode, Frame, FrameDecoder, Hello, InstanceId, Role, Token};

const PROLOGUE: &[u8] = br#"{"error":null}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ucx_responses_use_four_lanes() {
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&tracker).await;
    let worker = worker(&tracker);
    let mut senders = Vec::new();
    for t in 0..16 {
        let s = within(
            "open",
            worker.endpoint().open(
                frontend.local_addr(),
                frontend.instance(),
                t,
                &Token([0; 16]),
                PROLOGUE,
            ),
        )
        .await
        .unwrap();
        senders.push(s);
    }
    let peer = worker.endpoint().peers().pop().expect("one connection");
    assert_eq!(peer.lane_streams(), vec![4, 4, 4, 4]);
    let mut receivers = Vec::new();
    for s in &mut senders {
        s.send(b"item").await.unwrap();
        s.flush();
    }
    for _ in 0..16 {
        let mut r = within("accept", inbox.recv()).await.unwrap().accept();
        assert_eq!(
            within("item", r.recv()).await.unwrap().unwrap(),
            Bytes::from_static(b"item")
        );
        receivers.push(r);
    }
    assert_eq!(worker.handshake_stats().lanes_dialed, 4);
    // The frontend counts a lane once attached, just after answering its handshake.
    eventually("four lanes accepted", || {
        frontend.handshake_stats().lanes_accepted == 4
    })
    .await;
    assert_eq!(frontend.handshake_stats().connections_accepted, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_streams_of_a_hundred_items_arrive_in_order() {
    const STREAMS: u64 = 1000;
    const ITEMS: usize = 100;
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&tracker).await;
    let worker = worker(&tracker);
    let (addr, id) = (frontend.local_addr(), frontend.instance());
    let started = Instant::now();
    let producers = tokio::spawn({
        let worker = worker.clone();
        async move {
            let mut tasks = Vec::new();
            for t in 0..STREAMS {
                let mut s = worker
                    .endpoint()
                    .open(addr, id, t, &Token([0; 16]), PROLOGUE)
                    .await
                    .unwrap();
                tasks.push(tokio::spawn(async move {
                    for i in 0..ITEMS {
                        s.send(format!("{t}:{i}").as_bytes()).await.unwrap();
                    }
                    s.finish(Bytes::new()).await.unwrap();
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        }
    });
    let mut consumers = Vec::new();
    for _ in 0..STREAMS {
        let incoming = within("accept", inbox.recv()).await.unwrap();
        let t = incoming.ticket();
        let mut r = incoming.accept();
        consumers.push(tokio::spawn(async move {
            let mut n = 0;
            while let Some(item) = r.recv().await {
                assert_eq!(
                    item.unwrap(),
                    format!("{t}:{n}").as_bytes(),
                    "stream {t} item {n}"
                );
                n += 1;
            }
            assert_eq!(r.end(), Some(&StreamEnd::Finished));
            n
        }));
    }
    for c in consumers {
        assert_eq!(within("consumer", c).await.unwrap(), ITEMS);
    }
    within("producers", producers).await.unwrap();
    eprintln!(
        "{} records in {:?}",
        STREAMS * ITEMS as u64,
        started.elapsed()
    );
    let stats = frontend.endpoint().stats();
    assert_eq!(stats.streams_finished, STREAMS);
    assert_eq!(stats.stale_drops, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_items_cross_by_rendezvous_and_keep_their_order() {
    // 1 MiB items go by rendezvous (their payload lands after later eager messages were
    // handled); small items in between must still arrive after them, in order.
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&tracker).await;
    let worker = worker_with(&tracker, ucx_config(), |b| b.lanes(1));
    let mut s = within(
        "open",
        worker.endpoint().open(
            frontend.local_addr(),
            frontend.instance(),
            1,
            &Token([0; 16]),
            PROLOGUE,
        ),
    )
    .await
    .unwrap();
    let big = |i: u8| Bytes::from(vec![i; 1 << 20]);
    let producer = tokio::spawn(async move {
        for i in 0..20u8 {
            if i % 3 == 0 {
                s.send_bytes(big(i)).await.unwrap();
            } else {
                s.send(&[i; 10]).await.unwrap();
            }
            s.flush();
        }
        s.finish(Bytes::new()).await.unwrap();
    });
    let mut r = within("accept", inbox.recv()).await.unwrap().accept();
    for i in 0..20u8 {
        let item = within("item", r.recv()).await.unwrap().unwrap();
        if i % 3 == 0 {
            assert_eq!(item, big(i), "item {i}");
        } else {
            assert_eq!(&item[..], &[i; 10], "item {i}");
        }
    }
    assert_eq!(within("end", r.recv()).await, None);
    within("producer", producer).await.unwrap();
    let st = frontend.stats();
    assert!(st.rendezvous_received > 0, "{st:?}");
    assert_eq!(frontend.endpoint().stats().stale_drops, 0);
}

/// Encodes a HELLO and overwrites its version byte.
fn hello_bytes(hello: &Hello, version: u8) -> Vec<u8> {
    let mut bytes = Vec::new();
    Frame::Hello(*hello).encode(&mut bytes);
    bytes[9] = version; // header (5) + magic (4): the version byte
    bytes
}

async fn read_frame(lane: &mut RawLane) -> Option<Frame> {
    let mut buf = BytesMut::new();
    let mut dec = FrameDecoder::new(4096);
    loop {
        if let Some(f) = dec.decode(&mut buf).unwrap() {
            return Some(f);
        }
        let n = within("frame", lane.read(&mut buf)).await.ok()?;
        if n == 0 {
            return None;
        }
    }
}

async fn read_close(lane: &mut RawLane) -> Close {
    match read_frame(lane).await {
        Some(Frame::Close(c)) => c,
        other => panic!("expected a CLOSE frame, got {other:?}"),
    }
}

fn worker_hello(frontend: InstanceId) -> Hello {
    Hello {
        role: Role::Worker,
        lane_index: 0,
        lane_count: 1,
        instance_id: InstanceId::from_u128(77),
        peer_instance_id: frontend,
        max_frame_len: 1 << 20,
        initial_window: 32,
        idle_timeout_ms: 10_000,
        capabilities: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_mismatch_is_refused_with_a_clear_error_on_both_sides() {
    let tracker = TaskTracker::new();
    let (frontend, _inbox) = frontend(&tracker).await;
    // A worker of version 2 talking to our frontend.
    let raw = RawEndpoint::new(None, &ucx_config(), &tracker).unwrap();
    let mut lane = raw.connect(frontend.local_addr()).await.unwrap();
    lane.write(&hello_bytes(&worker_hello(frontend.instance()), 2))
        .await
        .unwrap();
    let close = read_close(&mut lane).await;
    assert_eq!(close.code, CloseCode::UNSUPPORTED_VERSION);
    assert_eq!(
        close.reason,
        "unsupported protocol version 2: this side speaks version 3"
    );
    assert_eq!(frontend.handshake_stats().handshake_failures, 1);

    // A frontend of version 2 answering our worker.
    let mut fake = RawEndpoint::new(Some(loopback()), &ucx_config(), &tracker).unwrap();
    let fake_addr = std::net::SocketAddr::new(loopback().ip(), fake.port().unwrap());
    let fake_id = InstanceId::from_u128(5);
    tokio::spawn(async move {
        while let Some(mut lane) = fake.accept().await {
            tokio::spawn(async move {
                let _ = read_frame(&mut lane).await;
                let mut h = worker_hello(fake_id);
                h.role = Role::Frontend;
                h.instance_id = fake_id;
                h.peer_instance_id = InstanceId::ANY;
                let _ = lane.write(&hello_bytes(&h, 2)).await;
                tokio::time::sleep(Duration::from_secs(5)).await;
            });
        }
    });
    let worker = worker(&tracker);
    let err = within("peer", worker.endpoint().peer(fake_addr, fake_id))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ConnectError::Wire { .. }), "{msg}");
    assert!(
        msg.contains("unsupported protocol version 2: this side speaks version 3"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_holding_another_instance_id_is_refused_as_identity_mismatch() {
    let tracker = TaskTracker::new();
    let (frontend, _inbox) = frontend(&tracker).await;
    let worker = worker(&tracker);
    let stale = InstanceId::from_u128(12345);
    let err = within("peer", worker.endpoint().peer(frontend.local_addr(), stale))
        .await
        .unwrap_err();
    match &err {
        ConnectError::Refused { code, reason, .. } => {
            assert_eq!(*code, CloseCode::IDENTITY_MISMATCH);
            assert!(reason.contains(&stale.to_string()), "{reason}");
        }
        other => panic!("expected a refusal, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_bytes_close_that_lane_and_the_listener_keeps_serving() {
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&tracker).await;
    let raw = RawEndpoint::new(None, &ucx_config(), &tracker).unwrap();
    let mut junk = raw.connect(frontend.local_addr()).await.unwrap();
    junk.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let close = read_close(&mut junk).await;
    assert_eq!(close.code, CloseCode::PROTOCOL_ERROR);
    // Then the lane ends.
    let mut rest = BytesMut::new();
    let end = within("end", async {
        loop {
            match junk.read(&mut rest).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    });
    end.await;
    assert_eq!(frontend.handshake_stats().handshake_failures, 1);
    // Still serving.
    let worker = worker(&tracker);
    let mut s = within(
        "open",
        worker.endpoint().open(
            frontend.local_addr(),
            frontend.instance(),
            1,
            &Token([0; 16]),
            PROLOGUE,
        ),
    )
    .await
    .unwrap();
    s.send(b"hello").await.unwrap();
    s.flush();
    let mut r = within("accept", inbox.recv()).await.unwrap().accept();
    assert_eq!(
        within("item", r.recv()).await.unwrap().unwrap(),
        Bytes::from_static(b"hello")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_speaks_is_dropped_without_stalling_others() {
    let tracker = TaskTracker::new();
    // The default handshake bound (5 s), on both sides: far longer than serving another worker
    // takes, so the silent peer certainly still holds its slot meanwhile (and the worker's own
    // lanes never race it).
    let cfg = UcxConfig {
        handshake_timeout: velo_ucx::DEFAULT_HANDSHAKE_TIMEOUT,
        ..ucx_config()
    };
    let (frontend, mut inbox) = frontend_with(&tracker, cfg.clone()).await;
    let raw = RawEndpoint::new(None, &ucx_config(), &tracker).unwrap();
    // Taken before connecting: certainly before the frontend starts the silent peer's timer
    // (UCX connects asynchronously, so it may start a little after `connect` returned).
    let t0 = Instant::now();
    let mut silent = raw.connect(frontend.local_addr()).await.unwrap();
    let worker = worker_with(&tracker, cfg.clone(), |b| b);
    let mut s = within(
        "open",
        worker.endpoint().open(
            frontend.local_addr(),
            frontend.instance(),
            1,
            &Token([0; 16]),
            PROLOGUE,
        ),
    )
    .await
    .unwrap();
    s.send(b"not stalled").await.unwrap();
    s.flush();
    let mut r = within("accept", inbox.recv()).await.unwrap().accept();
    assert_eq!(
        within("item", r.recv()).await.unwrap().unwrap(),
        Bytes::from_static(b"not stalled")
    );
    assert_eq!(
        frontend.handshake_stats().handshake_timeouts,
        0,
        "the other worker was served while the silent peer was still connected"
    );
    // The silent one is closed once its handshake timeout passes.
    let close = read_close(&mut silent).await;
    assert_eq!(close.code, CloseCode::BAD_HANDSHAKE);
    assert!(t0.elapsed() >= cfg.handshake_timeout, "{:?}", t0.elapsed());
    assert_eq!(frontend.handshake_stats().handshake_timeouts, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontend_that_aborts_ends_the_worker_streams_as_lost_exactly_once() {
    // The frontend force-closes its endpoints (UCX endpoint error on the worker's side).
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&tracker).await;
    let worker = worker(&tracker);
    let mut senders = Vec::new();
    for t in 0..8 {
        let mut s = within(
            "open",
            worker.endpoint().open(
                frontend.local_addr(),
                frontend.instance(),
                t,
                &Token([0; 16]),
                PROLOGUE,
            ),
        )
        .await
        .unwrap();
        s.send(b"first").await.unwrap();
        s.flush();
        senders.push(s);
    }
    let mut receivers = Vec::new();
    for _ in 0..8 {
        let mut r = within("accept", inbox.recv()).await.unwrap().accept();
        assert_eq!(
            within("first", r.recv()).await.unwrap().unwrap(),
            &b"first"[..]
        );
        receivers.push(r);
    }
    let peer = worker.endpoint().peers().pop().unwrap();
    frontend.abort();
    for s in &senders {
        // Lost through the abort (a failed endpoint, or the CLOSE it may still send), not by
        // the idle timer.
        let end = within("lost", s.closed()).await;
        assert!(
            matches!(&end, StreamEnd::Lost(e) if !matches!(e, LaneError::IdleTimeout(_))),
            "{end:?}"
        );
    }
    within("connection closed", peer.closed()).await;
    let st = peer.stats();
    assert_eq!(st.streams_lost, 8, "each stream ends once: {st:?}");
    // Sends now fail instead of hanging.
    for mut s in senders {
        assert!(s.send(b"more").await.is_err());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_closed_by_the_peer_ends_every_stream_on_it_once() {
    // A worker-side peer that handshakes by hand and then force-closes its endpoint: the
    // frontend's streams on that lane end as lost, each exactly once.
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&tracker).await;
    let raw = RawEndpoint::new(None, &ucx_config(), &tracker).unwrap();
    let mut lane = raw.connect(frontend.local_addr()).await.unwrap();
    lane.write(&hello_bytes(&worker_hello(frontend.instance()), 3))
        .await
        .unwrap();
    assert!(matches!(read_frame(&mut lane).await, Some(Frame::Hello(_))));
    // Two streams opened by hand, one DATA each.
    let mut batch = Vec::new();
    for slot in 0..2u8 {
        batch.extend_from_slice(&[0x01, slot, 0x00, 0x01]); // OPEN slot g0, ticket 1
        batch.extend_from_slice(&[0; 16]); // token
        batch.push(u8::try_from(PROLOGUE.len()).unwrap());
        batch.extend_from_slice(PROLOGUE);
        batch.extend_from_slice(&[0x02, slot, 0x00, 0x00, 0x01, b'x']); // DATA seq 0, "x"
    }
    let mut frame = vec![0x02];
    frame.extend_from_slice(&u32::try_from(batch.len()).unwrap().to_le_bytes());
    frame.extend_from_slice(&batch);
    lane.write(&frame).await.unwrap();
    let mut receivers = Vec::new();
    for _ in 0..2 {
        let mut r = within("accept", inbox.recv()).await.unwrap().accept();
        assert_eq!(within("x", r.recv()).await.unwrap().unwrap(), &b"x"[..]);
        receivers.push(r);
    }
    raw.abort(); // every endpoint of the raw peer is force-closed
    for mut r in receivers {
        let end = within("end", r.recv()).await.expect("an end is reported");
        assert!(matches!(end, Err(StreamEnd::Lost(_))), "{end:?}");
        assert_eq!(within("then nothing", r.recv()).await, None);
    }
    // The driver may fail the lane (a send failing) before it counts the endpoint error.
    eventually("an endpoint error is counted", || {
        frontend.stats().endpoint_errors >= 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_requests_share_one_preparation() {
    let tracker = TaskTracker::new();
    let (frontend, _inbox) = frontend(&tracker).await;
    let worker = worker(&tracker);
    let (addr, id) = (frontend.local_addr(), frontend.instance());
    let opens: Vec<_> = (0..50)
        .map(|t| {
            let w = worker.clone();
            tokio::spawn(async move {
                w.endpoint()
                    .open(addr, id, t, &Token([0; 16]), PROLOGUE)
                    .await
                    .map(|_| ())
            })
        })
        .collect();
    for o in opens {
        within("open", o).await.unwrap().unwrap();
    }
    assert_eq!(
        worker.handshake_stats().lanes_dialed,
        4,
        "one preparation of four lanes"
    );
    // The frontend counts a lane once attached, just after answering its handshake.
    eventually("four lanes accepted", || {
        frontend.handshake_stats().lanes_accepted == 4
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_frontend_fails_fast_and_retries_after_a_backoff() {
    let tracker = TaskTracker::new();
    // Nothing listens on this port while `_closed` holds it.
    let (_closed, addr) = closed_port();
    let id = InstanceId::from_u128(9);
    let worker_backing_off = |min: Duration| {
        let mut cfg = ucx_config();
        cfg.backoff = velo_session::Backoff { min, max: min };
        worker_with(&tracker, cfg, |b| b)
    };
    // A backoff far longer than the test: the second request certainly falls within it.
    let worker = worker_backing_off(Duration::from_secs(60));
    let err = within("peer", worker.endpoint().peer(addr, id))
        .await
        .unwrap_err();
    // Fast: UCX's endpoint error (an I/O error of the lane), not the handshake timeout.
    assert!(matches!(err, ConnectError::Io { .. }), "{err}");
    let dials = worker.handshake_stats().dial_failures;
    let err = within("peer", worker.endpoint().peer(addr, id))
        .await
        .unwrap_err();
    assert!(matches!(err, ConnectError::BackingOff { .. }), "{err}");
    assert_eq!(worker.handshake_stats().dial_failures, dials);
    // After the backoff (1 ms here): a real new attempt.
    let worker = worker_backing_off(Duration::from_millis(1));
    let err = within("peer", worker.endpoint().peer(addr, id))
        .await
        .unwrap_err();
    assert!(matches!(err, ConnectError::Io { .. }), "{err}");
    let dials = worker.handshake_stats().dial_failures;
    let err = within("a new attempt after the backoff", async {
        loop {
            match worker.endpoint().peer(addr, id).await {
                Err(ConnectError::BackingOff { .. }) => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                other => break other,
            }
        }
    })
    .await
    .unwrap_err();
    assert!(matches!(err, ConnectError::Io { .. }), "{err}");
    assert!(worker.handshake_stats().dial_failures > dials);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_every_task_and_the_driver_within_its_bound() {
    let tracker = TaskTracker::new();
    // A handshake bound far beyond the test's own: shutdown must not wait for it. What it may
    // wait for is each closing lane's flush (`close_timeout`) and the UCX teardown.
    let cfg = UcxConfig {
        handshake_timeout: Duration::from_secs(3600),
        ..ucx_config()
    };
    let bound = cfg.close_timeout + UCX_TEARDOWN + SLACK;
    let (frontend, mut inbox) = frontend_with(&tracker, cfg).await;
    // A handshaken lane whose peer then goes silent, and one mid-handshake.
    let raw = RawEndpoint::new(None, &ucx_config(), &tracker).unwrap();
    let _silent = raw.connect(frontend.local_addr()).await.unwrap();
    let worker = worker(&tracker);
    let mut s = within(
        "open",
        worker.endpoint().open(
            frontend.local_addr(),
            frontend.instance(),
            1,
            &Token([0; 16]),
            PROLOGUE,
        ),
    )
    .await
    .unwrap();
    s.send(b"x").await.unwrap();
    s.flush();
    let _r = within("accept", inbox.recv()).await.unwrap().accept();
    let t0 = Instant::now();
    within("shutdown", frontend.shutdown()).await;
    worker.close();
    raw.abort();
    tracker.close();
    within("every task ends", tracker.wait()).await;
    assert!(t0.elapsed() < bound, "{:?}", t0.elapsed());
}

/// velo-ucx's bound on tearing down a UCX worker (`sys::TEARDOWN_TIME`).
const UCX_TEARDOWN: Duration = Duration::from_millis(200);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_thread_engine_carries_streams_too() {
    let tracker = TaskTracker::new();
    let cfg = UcxConfig {
        engine: ProgressEngine::Thread,
        ..ucx_config()
    };
    let (frontend, mut inbox) = frontend_with(&tracker, cfg.clone()).await;
    let worker = worker_with(&tracker, cfg, |b| b);
    let mut s = within(
        "open",
        worker.endpoint().open(
            frontend.local_addr(),
            frontend.instance(),
            1,
            &Token([0; 16]),
            PROLOGUE,
        ),
    )
    .await
    .unwrap();
    let producer = tokio::spawn(async move {
        for i in 0..1000u32 {
            s.send(&i.to_le_bytes()).await.unwrap();
        }
        s.finish(Bytes::new()).await.unwrap();
    });
    let mut r = within("accept", inbox.recv()).await.unwrap().accept();
    for i in 0..1000u32 {
        assert_eq!(
            within("item", r.recv()).await.unwrap().unwrap(),
            &i.to_le_bytes()[..]
        );
    }
    assert_eq!(within("end", r.recv()).await, None);
    within("producer", producer).await.unwrap();
    within("shutdown", frontend.shutdown()).await;
    worker.close();
    tracker.close();
    within("the progress threads end", tracker.wait()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transports_without_a_network_transport_are_a_startup_error() {
    let tracker = TaskTracker::new();
    let cfg = UcxConfig {
        tls: Some("sm,self".into()),
        ..UcxConfig::loopback()
    };
    let mux = velo_mux::MuxConfig::builder(velo_mux::Side::Worker)
        .build()
        .unwrap();
    let err = velo_ucx::UcxWorker::new(mux, cfg, tracker.clone())
        .err()
        .expect("refused");
    assert!(matches!(err, UcxError::Transports(_)), "{err}");
    assert!(
        err.to_string()
            .starts_with("UCX initialisation failed: UCX_TLS=sm,self names no network transport"),
        "{err}"
    );
}
