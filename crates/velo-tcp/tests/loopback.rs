//! The TCP transport on real loopback sockets. Every wait is bounded.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::task::TaskTracker;
use velo_mux::{LaneError, StreamEnd};
use velo_session::{ConnectError, OpenStreamError};
use velo_wire::{Close, CloseCode, Frame, FrameDecoder, Hello, InstanceId, Role, Token};

const PROLOGUE: &[u8] = br#"{"error":null}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_responses_use_four_lanes() {
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&tracker).await;
    let worker = worker(&tracker);
    let mut senders = Vec::new();
    for t in 0..16 {
        let s = worker
            .endpoint()
            .open(
                frontend.local_addr(),
                frontend.instance(),
                t,
                &Token([0; 16]),
                PROLOGUE,
            )
            .await
            .unwrap();
        senders.push(s);
    }
    let peer = worker.endpoint().peers().pop().expect("one connection");
    assert_eq!(
        peer.lane_streams(),
        vec![4, 4, 4, 4],
        "streams run on all four lanes"
    );
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
    // The kernel's view: exactly four established connections to the listener.
    assert_eq!(established_connections(frontend.local_addr().port()), 4);
    assert_eq!(worker.stats().lanes_dialed, 4);
    // The frontend counts a lane once attached, just after answering its handshake.
    eventually("four lanes accepted", || {
        frontend.stats().lanes_accepted == 4
    })
    .await;
}

/// A raw client that speaks our framing by hand.
async fn raw_hello(addr: std::net::SocketAddr, hello: &Hello, version: u8) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut bytes = Vec::new();
    Frame::Hello(*hello).encode(&mut bytes);
    bytes[9] = version; // header (5) + magic (4): the version byte
    s.write_all(&bytes).await.unwrap();
    s
}

async fn read_close(s: &mut TcpStream) -> Close {
    let mut buf = bytes::BytesMut::new();
    let mut dec = FrameDecoder::new(4096);
    loop {
        if let Some(Frame::Close(c)) = dec.decode(&mut buf).unwrap() {
            return c;
        }
        let n = within("close frame", s.read_buf(&mut buf)).await.unwrap();
        assert!(n > 0, "connection ended without a CLOSE frame");
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
    // A worker of version 2 talking to us. Refused by an answer (a timeout would be
    // BAD_HANDSHAKE).
    let mut s = raw_hello(frontend.local_addr(), &worker_hello(frontend.instance()), 2).await;
    let close = read_close(&mut s).await;
    assert_eq!(close.code, CloseCode::UNSUPPORTED_VERSION);
    assert_eq!(
        close.reason,
        "unsupported protocol version 2: this side speaks version 3"
    );
    assert_eq!(frontend.stats().handshake_failures, 1);

    // A frontend of version 2 answering our worker.
    let fake = tokio::net::TcpListener::bind(loopback()).await.unwrap();
    let fake_addr = fake.local_addr().unwrap();
    let fake_id = InstanceId::from_u128(5);
    tokio::spawn(async move {
        loop {
            let Ok((mut c, _)) = fake.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 63];
                let _ = c.read_exact(&mut buf).await;
                let mut answer = Vec::new();
                let mut h = worker_hello(fake_id);
                h.role = Role::Frontend;
                h.instance_id = fake_id;
                h.peer_instance_id = InstanceId::ANY;
                Frame::Hello(h).encode(&mut answer);
                answer[9] = 2;
                let _ = c.write_all(&answer).await;
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
    let err = worker
        .endpoint()
        .peer(frontend.local_addr(), stale)
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
async fn garbage_bytes_close_that_connection_and_the_listener_keeps_serving() {
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&tracker).await;
    let mut junk = TcpStream::connect(frontend.local_addr()).await.unwrap();
    junk.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let close = read_close(&mut junk).await;
    assert_eq!(close.code, CloseCode::PROTOCOL_ERROR);
    let mut rest = Vec::new();
    within("eof", junk.read_to_end(&mut rest)).await.unwrap();
    assert_eq!(frontend.stats().handshake_failures, 1);
    // Still serving.
    let worker = worker(&tracker);
    let mut s = worker
        .endpoint()
        .open(
            frontend.local_addr(),
            frontend.instance(),
            1,
            &Token([0; 16]),
            PROLOGUE,
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
    // The default handshake bound (5 s): far longer than serving another worker takes, so the
    // silent peer certainly still holds its slot meanwhile (and the worker's own lanes never
    // race it).
    let (frontend, mut inbox) = frontend(&tracker).await;
    let timeout = tcp_config().handshake_timeout;
    // Taken before connecting: certainly before the frontend starts the silent peer's timer.
    let t0 = Instant::now();
    let mut silent = TcpStream::connect(frontend.local_addr()).await.unwrap();
    // Meanwhile a real worker connects and streams, while the silent peer holds its slot.
    let worker = worker(&tracker);
    let mut s = worker
        .endpoint()
        .open(
            frontend.local_addr(),
            frontend.instance(),
            1,
            &Token([0; 16]),
            PROLOGUE,
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
    let mut probe = [0u8; 1];
    let still_open =
        matches!(silent.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    assert!(
        still_open,
        "the other worker was served while the silent peer was still connected"
    );
    assert_eq!(frontend.stats().handshake_timeouts, 0);
    // The silent one is closed once its handshake timeout passes.
    let close = read_close(&mut silent).await;
    assert_eq!(close.code, CloseCode::BAD_HANDSHAKE);
    assert!(t0.elapsed() >= timeout, "{:?}", t0.elapsed());
    assert_eq!(frontend.stats().handshake_timeouts, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_dies_mid_stream_ends_its_streams_as_lost() {
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&tracker).await;
    let (addr, id) = (frontend.local_addr(), frontend.instance());
    // The worker runs on a runtime of its own, which we then tear down: its tasks and
    // sockets vanish at once, as when a worker process dies.
    let worker_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    worker_rt.spawn(async move {
        let wt = TaskTracker::new();
        let worker = worker(&wt);
        let mut streams = Vec::new();
        for t in 0..8 {
            let mut s = worker
                .endpoint()
                .open(addr, id, t, &Token([0; 16]), PROLOGUE)
                .await
                .unwrap();
            s.send(b"first").await.unwrap();
            s.flush();
            streams.push(s);
        }
        ready_tx.send(()).unwrap();
        std::future::pending::<()>().await;
        drop(streams);
    });
    within("worker ready", ready_rx).await.unwrap();
    let mut receivers = Vec::new();
    for _ in 0..8 {
        let mut r = within("accept", inbox.recv()).await.unwrap().accept();
        assert_eq!(
            within("first", r.recv()).await.unwrap().unwrap(),
            Bytes::from_static(b"first")
        );
        receivers.push(r);
    }
    worker_rt.shutdown_background();
    for mut r in receivers {
        let end = within("end", r.recv()).await.expect("an end is reported");
        // Lost because the connections ended, not by the idle timer (nor anything else).
        assert!(
            matches!(end, Err(StreamEnd::Lost(LaneError::Transport(_)))),
            "{end:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontend_restarted_under_a_new_instance_id_is_prepared_again() {
    let tracker = TaskTracker::new();
    let (first, mut inbox) = frontend(&tracker).await;
    let addr = first.local_addr();
    let old_id = first.instance();
    let worker = worker(&tracker);
    let mut s = worker
        .endpoint()
        .open(addr, old_id, 1, &Token([0; 16]), PROLOGUE)
        .await
        .unwrap();
    s.send(b"before").await.unwrap();
    s.flush();
    let _held = within("accept", inbox.recv()).await.unwrap().accept();
    first.abort();
    drop(first);
    // The same address, a new instance.
    let new_id = InstanceId::from_u128(0xfeed);
    let (tx, mut inbox2) = tokio::sync::mpsc::channel(16);
    let mux = velo_mux::MuxConfig::builder(velo_mux::Side::Frontend)
        .build()
        .unwrap();
    let second = within("rebind", async {
        loop {
            match velo_tcp::TcpFrontend::bind_as(
                addr,
                new_id,
                mux.clone(),
                tcp_config(),
                std::sync::Arc::new(Inbox(tx.clone())),
                tracker.clone(),
            )
            .await
            {
                Ok(f) => break f,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await;
    // The old stream is gone, and so (each lane notices on its own) is the old connection...
    assert!(matches!(
        within("old stream closed", s.closed()).await,
        StreamEnd::Lost(_)
    ));
    let old_peer = s.peer().clone();
    within("old connection closed", old_peer.closed()).await;
    // ...an address that still names the old instance gets a clear refusal...
    let err = worker
        .endpoint()
        .open(addr, old_id, 2, &Token([0; 16]), PROLOGUE)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            OpenStreamError::Connect(ConnectError::Refused {
                code: CloseCode::IDENTITY_MISMATCH,
                ..
            })
        ),
        "{err}"
    );
    // ...and the new instance is prepared afresh.
    let mut s2 = worker
        .endpoint()
        .open(addr, new_id, 3, &Token([0; 16]), PROLOGUE)
        .await
        .unwrap();
    s2.send(b"after").await.unwrap();
    s2.flush();
    let mut r = within("accept", inbox2.recv()).await.unwrap().accept();
    assert_eq!(
        within("item", r.recv()).await.unwrap().unwrap(),
        Bytes::from_static(b"after")
    );
    drop(second);
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
        worker.stats().lanes_dialed,
        4,
        "one preparation of four lanes"
    );
    // The frontend counts a lane once attached, just after answering its handshake.
    eventually("four lanes accepted", || {
        frontend.stats().lanes_accepted == 4
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_preparation_is_not_cached_and_retries_after_a_backoff() {
    let tracker = TaskTracker::new();
    // Nothing listens on this port while `_closed` holds it.
    let (_closed, addr) = closed_port();
    let id = InstanceId::from_u128(9);
    let worker_backing_off = |min: Duration| {
        let mut cfg = tcp_config();
        cfg.backoff = velo_session::Backoff { min, max: min };
        let mux = velo_mux::MuxConfig::builder(velo_mux::Side::Worker)
            .build()
            .unwrap();
        velo_tcp::TcpWorker::new(mux, cfg, tracker.clone())
    };
    // A backoff far longer than the test: the second request certainly falls within it.
    let worker = worker_backing_off(Duration::from_secs(60));
    let err = within("peer", worker.endpoint().peer(addr, id))
        .await
        .unwrap_err();
    assert!(matches!(err, ConnectError::Io { .. }), "{err}");
    let dials = worker.stats().dial_failures;
    // Within the backoff: fail fast, no new dial.
    let err = within("peer", worker.endpoint().peer(addr, id))
        .await
        .unwrap_err();
    assert!(matches!(err, ConnectError::BackingOff { .. }), "{err}");
    assert!(err.to_string().contains("next attempt in"), "{err}");
    assert_eq!(worker.stats().dial_failures, dials);
    // After the backoff (1 ms here): a real new attempt.
    let worker = worker_backing_off(Duration::from_millis(1));
    let err = within("peer", worker.endpoint().peer(addr, id))
        .await
        .unwrap_err();
    assert!(matches!(err, ConnectError::Io { .. }), "{err}");
    let dials = worker.stats().dial_failures;
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
    assert!(worker.stats().dial_failures > dials);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_every_task_without_waiting_for_half_open_connections() {
    let tracker = TaskTracker::new();
    // Handshake and idle bounds far beyond the test's own: shutdown must not wait for them.
    let (tx, _inbox) = tokio::sync::mpsc::channel(16);
    let mux = velo_mux::MuxConfig::builder(velo_mux::Side::Frontend)
        .idle_timeout(Duration::from_secs(3600))
        .build()
        .unwrap();
    let cfg = velo_tcp::TcpConfig {
        handshake_timeout: Duration::from_secs(3600),
        ..tcp_config()
    };
    let frontend = velo_tcp::TcpFrontend::bind(
        loopback(),
        mux,
        cfg,
        std::sync::Arc::new(Inbox(tx)),
        tracker.clone(),
    )
    .await
    .unwrap();
    // One connection mid-handshake, silent.
    let _silent = TcpStream::connect(frontend.local_addr()).await.unwrap();
    // One handshaken lane whose peer then stops reading and never closes.
    let mut half = raw_hello(frontend.local_addr(), &worker_hello(frontend.instance()), 3).await;
    let mut answer = [0u8; 63];
    within("answer", half.read_exact(&mut answer))
        .await
        .unwrap();
    within("shutdown", frontend.shutdown()).await;
    tracker.close();
    within("every task ends", tracker.wait()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_silent_after_its_handshake_is_closed_by_the_idle_timer() {
    let tracker = TaskTracker::new();
    let (tx, _inbox) = tokio::sync::mpsc::channel(16);
    let idle = Duration::from_millis(500);
    let mux = velo_mux::MuxConfig::builder(velo_mux::Side::Frontend)
        .idle_timeout(idle)
        .build()
        .unwrap();
    let frontend = velo_tcp::TcpFrontend::bind(
        loopback(),
        mux,
        tcp_config(),
        std::sync::Arc::new(Inbox(tx)),
        tracker.clone(),
    )
    .await
    .unwrap();
    // Taken before connecting: certainly before the frontend starts the lane's idle timer.
    let t0 = Instant::now();
    let mut half = raw_hello(frontend.local_addr(), &worker_hello(frontend.instance()), 3).await;
    let mut answer = [0u8; 63];
    within("answer", half.read_exact(&mut answer))
        .await
        .unwrap();
    let close = read_close(&mut half).await;
    assert_eq!(close.code, CloseCode::IDLE_TIMEOUT);
    let waited = t0.elapsed();
    assert!(waited >= idle && waited < idle + SLACK, "{waited:?}");
}
