//! The response-plane contract (REFERENCE.md section 2), written once and run against every
//! plane on loopback. Every wait is bounded.
//!
//! One file on purpose (a little over 800 code lines): the contract is one list of stories,
//! run per plane by the `contract!` macro at the end; splitting it would split that list.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use response_plane::{
    Codec, ConnectionInfo, Disconnect, FrontendPlane, Plane, ProtocolViolation, RegisterOptions,
    ResponseError, ResponsePlaneConfig, TypedError, VeloTransport, WorkerPlane,
};
use serde::{Deserialize, Serialize};
use tokio_util::task::TaskTracker;

const BOUND: Duration = Duration::from_secs(30);

/// An item shaped like an engine's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Token {
    index: u32,
    token_ids: Vec<u32>,
    finish_reason: Option<String>,
}

fn token(index: u32) -> Token {
    Token {
        index,
        token_ids: vec![index, index + 1],
        finish_reason: None,
    }
}

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {BOUND:?}"))
}

/// A plane and, for the velo plane, its transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Under {
    plane: Plane,
    transport: VeloTransport,
}

const CLASSIC: Under = Under {
    plane: Plane::Classic,
    transport: VeloTransport::Tcp,
};
#[cfg(feature = "tcp")]
const VELO_TCP: Under = Under {
    plane: Plane::Velo,
    transport: VeloTransport::Tcp,
};
#[cfg(feature = "ucx")]
const VELO_UCX: Under = Under {
    plane: Plane::Velo,
    transport: VeloTransport::Ucx,
};

impl Under {
    /// A name for files and the helper process.
    fn label(self) -> String {
        match self.plane {
            Plane::Classic => "tcp".to_owned(),
            Plane::Velo => format!("velo-{}", self.transport.name()),
        }
    }

    fn from_label(label: &str) -> Self {
        let transport = match label {
            "velo-ucx" => VeloTransport::Ucx,
            _ => VeloTransport::Tcp,
        };
        let plane = if label.starts_with("velo") {
            Plane::Velo
        } else {
            Plane::Classic
        };
        Self { plane, transport }
    }
}

fn config(under: Under) -> ResponsePlaneConfig {
    let mut c = ResponsePlaneConfig::from_lookup(|var| match var {
        "DYN_RESPONSE_PLANE" => Some(under.plane.name().to_owned()),
        "DYN_VELO_RESPONSE_TRANSPORT" => Some(under.transport.name().to_owned()),
        "DYN_TCP_RESPONSE_STREAM_HOST" => Some("127.0.0.1".to_owned()),
        _ => None,
    })
    .unwrap()
    .to_builder()
    .idle_timeout(Duration::from_secs(10));
    if under.transport == VeloTransport::Ucx {
        // Loopback only, whatever the environment says: UCX_TLS=tcp, UCX_NET_DEVICES=lo.
        c = c
            .ucx_tls(Some("tcp".to_owned()))
            .ucx_net_devices(Some("lo".to_owned()));
    }
    c.build().unwrap()
}

struct Setup {
    frontend: FrontendPlane,
    worker: WorkerPlane,
    _tracker: TaskTracker,
}

async fn setup(plane: Under) -> Setup {
    let tracker = TaskTracker::new();
    let frontend = FrontendPlane::bind(config(plane), tracker.clone())
        .await
        .unwrap();
    let worker = WorkerPlane::new(config(plane), tracker.clone()).unwrap();
    Setup {
        frontend,
        worker,
        _tracker: tracker,
    }
}

fn register(s: &Setup) -> (ConnectionInfo, response_plane::PendingResponse<Token>) {
    s.frontend
        .register::<Token>(RegisterOptions::default())
        .unwrap()
}

async fn prologue_ok_items_arrive_in_order_then_a_clean_end(plane: Under) {
    let s = setup(plane).await;
    for codec in [Codec::Msgpack, Codec::Json] {
        let (info, pending) = s
            .frontend
            .register::<Token>(RegisterOptions {
                codec,
                ..Default::default()
            })
            .unwrap();
        let worker = s.worker.clone();
        // More items than the credit window: the sender waits for the reader, as it should.
        let producer = tokio::spawn(async move {
            let mut tx = worker.connect::<Token>(&info).await?;
            tx.send_prologue(Ok(())).await?;
            for i in 0..100 {
                tx.send(&token(i)).await?;
                worker.flush();
            }
            tx.finish().await?;
            worker.flush();
            Ok::<_, ResponseError>(())
        });
        let rx = within("established", pending.established()).await.unwrap();
        let got: Vec<_> = within("read", rx.collect::<Vec<_>>()).await;
        let want: Vec<_> = (0..100).map(|i| Ok(token(i))).collect();
        assert_eq!(got, want, "{codec:?}");
        within("producer", producer).await.unwrap().unwrap();
    }
    assert!(info_is_small(&s));
}

fn info_is_small(s: &Setup) -> bool {
    let (info, _p) = register(s);
    let json = serde_json::to_string(&info).unwrap();
    json.len() < 512 && json.len() < 128 * 1024
}

async fn an_error_prologue_is_cannot_connect_with_the_typed_cause(plane: Under) {
    let s = setup(plane).await;
    let (info, pending) = register(&s);
    let mut tx = within("connect", s.worker.connect::<Token>(&info))
        .await
        .unwrap();
    let cause = TypedError {
        kind: "EngineRefused".into(),
        message: "queue full".into(),
        retryable: true,
    };
    within("prologue", tx.send_prologue(Err(cause.clone())))
        .await
        .unwrap();
    s.worker.flush();
    let err = within("established", pending.established())
        .await
        .unwrap_err();
    assert_eq!(err, ResponseError::Refused { cause });
    assert!(err.is_remote() && err.is_retryable() && !err.is_cancelled());
    // The prologue goes exactly once, first.
    assert!(matches!(
        tx.send_prologue(Ok(())).await,
        Err(ResponseError::Prologue(_))
    ));
}

async fn the_prologue_is_sent_exactly_once_and_first(plane: Under) {
    let s = setup(plane).await;
    let (info, _pending) = register(&s);
    let mut tx = within("connect", s.worker.connect::<Token>(&info))
        .await
        .unwrap();
    assert!(matches!(
        tx.send(&token(0)).await,
        Err(ResponseError::Prologue(_))
    ));
    within("prologue", tx.send_prologue(Ok(()))).await.unwrap();
    assert!(matches!(
        tx.send_prologue(Ok(())).await,
        Err(ResponseError::Prologue(_))
    ));
}

async fn stop_is_graceful_and_the_stream_ends_quietly(plane: Under) {
    let s = setup(plane).await;
    let (info, pending) = register(&s);
    let mut tx = within("connect", s.worker.connect::<Token>(&info))
        .await
        .unwrap();
    within("prologue", tx.send_prologue(Ok(()))).await.unwrap();
    let ctx = tx.context();
    within("send", tx.send(&token(0))).await.unwrap();
    s.worker.flush();
    let mut rx = within("established", pending.established()).await.unwrap();
    assert_eq!(within("first", rx.next()).await, Some(Ok(token(0))));
    rx.stop();
    within("the engine sees the stop", ctx.stopped()).await;
    assert!(ctx.is_stopped() && !ctx.is_killed());
    // Produced before the stop took effect: still delivered.
    within("send", tx.send(&token(1))).await.unwrap();
    within("finish", tx.finish()).await.unwrap();
    s.worker.flush();
    assert_eq!(within("second", rx.next()).await, Some(Ok(token(1))));
    assert_eq!(within("quiet end", rx.next()).await, None);
}

async fn a_stop_answered_by_dropping_the_sender_still_ends_quietly(plane: Under) {
    let s = setup(plane).await;
    let (info, pending) = register(&s);
    let mut tx = within("connect", s.worker.connect::<Token>(&info))
        .await
        .unwrap();
    within("prologue", tx.send_prologue(Ok(()))).await.unwrap();
    s.worker.flush();
    let ctx = tx.context();
    let mut rx = within("established", pending.established()).await.unwrap();
    rx.stop();
    within("stop seen", ctx.stopped()).await;
    drop(tx);
    s.worker.flush();
    assert_eq!(within("quiet end", rx.next()).await, None);
}

async fn kill_reaches_the_engine_and_further_sends_fail(plane: Under) {
    let s = setup(plane).await;
    let (info, pending) = register(&s);
    let mut tx = within("connect", s.worker.connect::<Token>(&info))
        .await
        .unwrap();
    within("prologue", tx.send_prologue(Ok(()))).await.unwrap();
    s.worker.flush();
    let ctx = tx.context();
    let mut rx = within("established", pending.established()).await.unwrap();
    rx.kill();
    within("the engine sees the kill", ctx.killed()).await;
    assert!(ctx.is_killed());
    assert_eq!(within("after kill", rx.next()).await, None);
    let err = within("send after kill", async {
        loop {
            match tx.send(&token(9)).await {
                Ok(()) => tokio::time::sleep(Duration::from_millis(5)).await,
                Err(e) => break e,
            }
        }
    })
    .await;
    assert!(
        err.is_cancelled() || matches!(err, ResponseError::Disconnected { .. }),
        "{err}"
    );
}

async fn dropping_the_receiver_kills_the_stream(plane: Under) {
    let s = setup(plane).await;
    let (info, pending) = register(&s);
    let mut tx = within("connect", s.worker.connect::<Token>(&info))
        .await
        .unwrap();
    within("prologue", tx.send_prologue(Ok(()))).await.unwrap();
    s.worker.flush();
    let ctx = tx.context();
    let rx = within("established", pending.established()).await.unwrap();
    drop(rx);
    within("the engine sees the kill", ctx.killed()).await;
}

async fn dropping_the_sender_without_finish_is_an_abnormal_end(plane: Under) {
    let s = setup(plane).await;
    let (info, pending) = register(&s);
    let mut tx = within("connect", s.worker.connect::<Token>(&info))
        .await
        .unwrap();
    within("prologue", tx.send_prologue(Ok(()))).await.unwrap();
    within("send", tx.send(&token(0))).await.unwrap();
    drop(tx);
    s.worker.flush();
    let mut rx = within("established", pending.established()).await.unwrap();
    assert_eq!(within("item", rx.next()).await, Some(Ok(token(0))));
    let end = within("end", rx.next())
        .await
        .expect("an abnormal end is reported");
    let err = end.unwrap_err();
    assert!(
        matches!(&err, ResponseError::Disconnected(_))
            && err
                .to_string()
                .starts_with("stream ended before generation completed"),
        "{err}"
    );
    assert!(err.is_retryable());
    assert_eq!(within("then nothing", rx.next()).await, None);
}

/// Both planes count the streams they handed out until each ends (or is dropped), report
/// when none is left, and count a stream that ended in error (not a cancellation).
async fn streams_in_flight_are_counted_until_they_end_and_errors_are_counted(plane: Under) {
    let s = setup(plane).await;
    let (info, pending) = register(&s);
    let mut tx = within("connect", s.worker.connect::<Token>(&info))
        .await
        .unwrap();
    within("prologue", tx.send_prologue(Ok(()))).await.unwrap();
    s.worker.flush();
    let mut rx = within("established", pending.established()).await.unwrap();
    assert_eq!(s.frontend.stats().streams_in_flight, 1);
    assert_eq!(s.worker.stats().streams_in_flight, 1);
    // A clean end: both counts go back to zero, and both sides report themselves drained.
    within("finish", tx.finish()).await.unwrap();
    s.worker.flush();
    assert_eq!(within("end", rx.next()).await, None);
    within("the frontend drained", s.frontend.drained()).await;
    within("the worker drained", s.worker.drained()).await;
    assert_eq!(s.frontend.stats().stream_errors, 0);
    // A stream whose sender is dropped mid-way ends in error on the frontend.
    let (info, pending) = register(&s);
    let mut tx = within("connect", s.worker.connect::<Token>(&info))
        .await
        .unwrap();
    within("prologue", tx.send_prologue(Ok(()))).await.unwrap();
    drop(tx);
    s.worker.flush();
    let mut rx = within("established", pending.established()).await.unwrap();
    assert!(matches!(within("end", rx.next()).await, Some(Err(_))));
    assert_eq!(s.frontend.stats().stream_errors, 1);
    within("the frontend drained", s.frontend.drained()).await;
    // A killed stream is a cancellation, not an error.
    let (info, pending) = register(&s);
    let mut tx = within("connect", s.worker.connect::<Token>(&info))
        .await
        .unwrap();
    within("prologue", tx.send_prologue(Ok(()))).await.unwrap();
    s.worker.flush();
    let rx = within("established", pending.established()).await.unwrap();
    drop(rx);
    within("the worker seeing the kill", tx.context().killed()).await;
    assert!(tx.send(&token(1)).await.unwrap_err().is_cancelled());
    assert_eq!(s.worker.stats().stream_errors, 0);
    drop(tx);
    within("the worker drained", s.worker.drained()).await;
}

async fn a_worker_process_gone_mid_stream_is_disconnected(plane: Under) {
    let tracker = TaskTracker::new();
    let frontend = FrontendPlane::bind(config(plane), tracker.clone())
        .await
        .unwrap();
    let (info, pending) = frontend
        .register::<Token>(RegisterOptions::default())
        .unwrap();
    // The worker lives on a runtime of its own, torn down mid-stream like a dead process.
    let worker_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (sent_tx, sent_rx) = tokio::sync::oneshot::channel();
    worker_rt.spawn(async move {
        let wt = TaskTracker::new();
        let worker = WorkerPlane::new(config(plane), wt).unwrap();
        let mut tx = worker.connect::<Token>(&info).await.unwrap();
        tx.send_prologue(Ok(())).await.unwrap();
        tx.send(&token(0)).await.unwrap();
        worker.flush();
        sent_tx.send(()).unwrap();
        std::future::pending::<()>().await;
        drop((tx, worker));
    });
    within("worker sent", sent_rx).await.unwrap();
    let mut rx = within("established", pending.established()).await.unwrap();
    assert_eq!(within("item", rx.next()).await, Some(Ok(token(0))));
    worker_rt.shutdown_background();
    let err = within("end", rx.next()).await.expect("an end").unwrap_err();
    assert!(matches!(err, ResponseError::Disconnected { .. }), "{err}");
}

async fn a_one_mib_item_arrives_intact(plane: Under) {
    let s = setup(plane).await;
    let (info, pending) = register(&s);
    let mut tx = within("connect", s.worker.connect::<Token>(&info))
        .await
        .unwrap();
    within("prologue", tx.send_prologue(Ok(()))).await.unwrap();
    let big = Token {
        index: 1,
        token_ids: (0..262_144).collect(),
        finish_reason: Some("length".into()),
    };
    within("send big", tx.send(&big)).await.unwrap();
    within("send small", tx.send(&token(2))).await.unwrap();
    within("finish", tx.finish()).await.unwrap();
    s.worker.flush();
    let rx = within("established", pending.established()).await.unwrap();
    let got: Vec<_> = within("read", rx.collect::<Vec<_>>()).await;
    assert_eq!(got, vec![Ok(big), Ok(token(2))]);
}

/// Env vars that turn the ignored helper test below into the worker process of
/// `ten_thousand_concurrent_streams_all_complete`.
const HELPER_PLANE: &str = "VELO_CONTRACT_WORKER_PLANE";
const HELPER_INFOS: &str = "VELO_CONTRACT_WORKER_INFOS";
const HELPER_ITEMS: u32 = 5;

async fn ten_thousand_concurrent_streams_all_complete(plane: Under) {
    const STREAMS: u32 = 10_000;
    // The worker runs in a process of its own (this test binary, re-run as the helper test):
    // as in production, and so each process holds one end of each classic connection.
    raise_fd_limit(u64::from(STREAMS) + 1024);
    let tracker = TaskTracker::new();
    let frontend = FrontendPlane::bind(config(plane), tracker.clone())
        .await
        .unwrap();
    let mut readers = Vec::new();
    let mut infos = String::new();
    for n in 0..STREAMS {
        let (info, pending) = frontend
            .register::<Token>(RegisterOptions::default())
            .unwrap();
        infos.push_str(&serde_json::to_string(&info).unwrap());
        infos.push('\n');
        readers.push(tokio::spawn(async move {
            let rx = pending.established().await?;
            let got: Vec<_> = rx.collect().await;
            Ok::<_, ResponseError>((n, got))
        }));
    }
    let path = std::env::temp_dir().join(format!(
        "velo-contract-{}-{}.jsonl",
        plane.label(),
        std::process::id()
    ));
    std::fs::write(&path, infos).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "worker_process_helper",
            "--include-ignored",
            "--nocapture",
        ])
        .env(HELPER_PLANE, plane.label())
        .env(HELPER_INFOS, &path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the worker process");
    for r in readers {
        let (n, got) = within("reader", r).await.unwrap().unwrap();
        let want: Vec<_> = (0..HELPER_ITEMS).map(|i| Ok(token(n * 100 + i))).collect();
        assert_eq!(got, want, "stream {n}");
    }
    // Every stream arrived: the worker process may exit now (it waits for its stdin's end).
    drop(child.stdin.take());
    let status = within(
        "worker process exits",
        tokio::task::spawn_blocking(move || child.wait()),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(status.success(), "worker process: {status}");
    let _ = std::fs::remove_file(&path);
    assert_eq!(frontend.pending(), 0);
}

/// Classic connections the helper process has in setup at once: each waits in the
/// frontend's accept queue, and a loaded machine's accept loop is slow, so a deep burst would
/// run into the classic plane's connect timeout (3 s).
const CONNECTS_IN_FLIGHT: usize = 256;

/// The worker process of `ten_thousand_concurrent_streams_all_complete`: streams to every
/// address in the file it is given, then keeps flushing until its stdin ends (the test closes
/// it once every stream arrived). Does nothing unless started by that test.
#[test]
#[ignore = "helper process of ten_thousand_concurrent_streams_all_complete, which runs it"]
fn worker_process_helper() {
    let (Ok(plane), Ok(path)) = (std::env::var(HELPER_PLANE), std::env::var(HELPER_INFOS)) else {
        return;
    };
    let plane = Under::from_label(&plane);
    raise_fd_limit(11_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let worker = WorkerPlane::new(config(plane), TaskTracker::new()).unwrap();
        let infos = std::fs::read_to_string(path).unwrap();
        let mut writers = Vec::new();
        // Streams are all open at once; only the connect calls are paced (the classic plane's
        // connection-per-stream bursts would otherwise overflow the accept queue).
        let connecting = std::sync::Arc::new(tokio::sync::Semaphore::new(CONNECTS_IN_FLIGHT));
        for (n, line) in infos.lines().enumerate() {
            let info: ConnectionInfo = serde_json::from_str(line).unwrap();
            let n = u32::try_from(n).unwrap();
            let worker = worker.clone();
            let connecting = connecting.clone();
            writers.push(tokio::spawn(async move {
                let permit = connecting.acquire_owned().await.expect("never closed");
                let mut tx = worker.connect::<Token>(&info).await?;
                drop(permit);
                tx.send_prologue(Ok(())).await?;
                for i in 0..HELPER_ITEMS {
                    tx.send(&token(n * 100 + i)).await?;
                }
                tx.finish().await
            }));
        }
        let flusher = {
            let worker = worker.clone();
            tokio::spawn(async move {
                loop {
                    worker.flush();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        };
        for w in writers {
            within("writer", w).await.unwrap().unwrap();
        }
        // The last batches leave while the flusher runs: exit only once the test says every
        // stream arrived, by closing our stdin (or by exiting itself).
        tokio::task::spawn_blocking(|| {
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
        })
        .await
        .unwrap();
        flusher.abort();
    });
}

/// The classic plane holds two descriptors per stream in one process; raise the soft limit
/// (and the hard one, which root may) to what the test needs, or say why it cannot run.
fn raise_fd_limit(needed: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
    assert!(ok, "getrlimit(RLIMIT_NOFILE) failed");
    if lim.rlim_cur >= needed {
        return;
    }
    let want = libc::rlimit {
        rlim_cur: needed,
        rlim_max: lim.rlim_max.max(needed),
    };
    // SAFETY: setrlimit reads the struct we own.
    let ok = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0;
    assert!(
        ok,
        "this test needs {needed} file descriptors (soft limit {}, hard {}): raise `ulimit -n` or run as root",
        lim.rlim_cur, lim.rlim_max
    );
}

async fn a_kill_racing_setup_still_reaches_the_engine(plane: Under) {
    let s = setup(plane).await;
    let (info, pending) = register(&s);
    // The frontend gives up before the worker has even answered.
    drop(pending);
    let mut tx = match within("connect", s.worker.connect::<Token>(&info)).await {
        Ok(tx) => tx,
        Err(e) => panic!("connect: {e}"),
    };
    let ctx = tx.context();
    // The classic plane may already refuse the connection here; the prologue may fail then.
    let _ = within("prologue", tx.send_prologue(Ok(()))).await;
    s.worker.flush();
    within(
        "the cancellation reaches the engine after the prologue",
        ctx.killed(),
    )
    .await;
    assert_eq!(s.frontend.pending(), 0);
}

async fn a_plane_mismatch_answers_with_an_error_prologue(plane: Under) {
    let other = match plane.plane {
        Plane::Classic => Under {
            plane: Plane::Velo,
            transport: if cfg!(all(feature = "ucx", not(feature = "tcp"))) {
                VeloTransport::Ucx
            } else {
                VeloTransport::Tcp
            },
        },
        Plane::Velo => CLASSIC,
    };
    let tracker = TaskTracker::new();
    let frontend = FrontendPlane::bind(config(plane), tracker.clone())
        .await
        .unwrap();
    if other.plane == Plane::Velo && !cfg!(any(feature = "tcp", feature = "ucx")) {
        // Without a velo transport, a velo worker is a startup error, not a silent fallback.
        let err = WorkerPlane::new(config(other), tracker.clone()).unwrap_err();
        assert!(err.to_string().contains("rebuild"), "{err}");
        return;
    }
    let worker = WorkerPlane::new(config(other), tracker.clone()).unwrap();
    let (info, pending) = frontend
        .register::<Token>(RegisterOptions::default())
        .unwrap();
    let err = within("connect", worker.connect::<Token>(&info))
        .await
        .unwrap_err();
    let msg = format!(
        "response plane mismatch: frontend requested {}, worker configured {}",
        plane.plane.name(),
        other.plane.name()
    );
    assert_eq!(err.to_string(), msg);
    let seen = within("frontend sees it", pending.established())
        .await
        .unwrap_err();
    match seen {
        ResponseError::Refused { cause } => {
            assert_eq!(cause.kind, "ResponsePlaneMismatch");
            assert_eq!(cause.message, msg);
        }
        other => panic!("expected CannotConnect, got {other}"),
    }
    assert_eq!(worker.stats().stream_setup_failures, 1);
}

async fn a_sender_dropped_before_its_prologue_ends_the_pending_disconnected(plane: Under) {
    let s = setup(plane).await;
    let (info, pending) = register(&s);
    let tx = within("connect", s.worker.connect::<Token>(&info))
        .await
        .unwrap();
    // The engine gave up (or the handler panicked) before accepting the request.
    drop(tx);
    s.worker.flush();
    let err = within("established", pending.established())
        .await
        .unwrap_err();
    assert!(matches!(err, ResponseError::Disconnected(_)), "{err}");
    assert!(err.is_retryable() && !err.is_remote());
    if plane.plane == Plane::Velo {
        assert_eq!(err, ResponseError::Disconnected(Disconnect::Abandoned));
    }
    assert_eq!(s.frontend.pending(), 0);
}

async fn an_establish_timeout_bounds_the_wait_and_frees_the_registration(plane: Under) {
    let s = setup(plane).await;
    let after = Duration::from_millis(200);
    let (_info, pending) = s
        .frontend
        .register::<Token>(RegisterOptions {
            establish_timeout: Some(after),
            ..Default::default()
        })
        .unwrap();
    let err = within("timeout", pending.established()).await.unwrap_err();
    assert_eq!(err, ResponseError::ResponseTimeout { after });
    assert!(err.is_retryable());
    assert_eq!(s.frontend.pending(), 0);
    let stats = s.frontend.stats();
    assert_eq!(stats.prologue_timeouts, 1);
    assert_eq!(
        stats.stream_setup_failures, 1,
        "a timeout is a setup failure too"
    );
}

/// A stream whose registration is gone (its pending handle dropped) is refused, and the
/// refusal is counted once in `arrivals_refused`, whichever plane carried it.
async fn a_stream_for_a_dropped_registration_is_refused_and_counted(plane: Under) {
    let s = setup(plane).await;
    let (info, pending) = register(&s);
    drop(pending);
    // The worker learns of the refusal at connect (classic) or after its OPEN (velo).
    if let Ok(mut tx) = within("connect", s.worker.connect::<Token>(&info)).await {
        let _ = tx.send_prologue(Ok(())).await;
        s.worker.flush();
    }
    // Counted by the frontend's task once the stream arrived: poll, bounded.
    within("the refusal is counted", async {
        while s.frontend.stats().arrivals_refused == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let stats = s.frontend.stats();
    assert_eq!(stats.arrivals_refused, 1);
    assert_eq!(stats.arrivals_wrong_worker, 0);
}

async fn dropping_a_pending_handle_removes_all_state(plane: Under) {
    let s = setup(plane).await;
    let handles: Vec<_> = (0..100).map(|_| register(&s)).collect();
    assert_eq!(s.frontend.pending(), 100);
    drop(handles);
    assert_eq!(s.frontend.pending(), 0);
}

async fn registrations_after_shutdown_fail_cleanly(plane: Under) {
    let s = setup(plane).await;
    let (_info, pending) = register(&s);
    within("shutdown", s.frontend.shutdown()).await;
    assert_eq!(
        within("pending ends", pending.established())
            .await
            .unwrap_err(),
        ResponseError::Closed
    );
    assert_eq!(
        s.frontend
            .register::<Token>(RegisterOptions::default())
            .unwrap_err(),
        ResponseError::Closed
    );
}

async fn removing_a_worker_instance_ends_its_pending_streams_and_tombstones_it(plane: Under) {
    let s = setup(plane).await;
    let (_i1, p1) = register(&s);
    let (_i2, p2) = register(&s);
    let (_i3, p3) = register(&s);
    p1.associate(7).unwrap();
    p2.associate(7).unwrap();
    p3.associate(8).unwrap();
    // A registration racing the removal fails at once (associated right after the removal,
    // with nothing to wait for in between: well within `TOMBSTONE_TTL`).
    let (_i4, p4) = register(&s);
    assert_eq!(s.frontend.cancel_instance_streams(7), 2);
    let err = p4.associate(7).unwrap_err();
    assert!(matches!(err, ResponseError::Disconnected { .. }));
    for p in [p1, p2] {
        let err = within("ended", p.established()).await.unwrap_err();
        assert!(
            matches!(
                &err,
                ResponseError::Disconnected(Disconnect::InstanceRemoved { instance: 7 })
            ),
            "{err}"
        );
    }
    // The other instance's stream is untouched.
    assert_eq!(s.frontend.pending(), 2);
    drop(p3);
}

async fn a_re_associated_stream_ends_only_with_its_latest_worker_instance(plane: Under) {
    let s = setup(plane).await;
    let (_info, pending) = register(&s);
    // The request went to instance 1, then was retried on instance 2.
    pending.associate(1).unwrap();
    pending.associate(2).unwrap();
    assert_eq!(s.frontend.cancel_instance_streams(1), 0);
    assert_eq!(s.frontend.pending(), 1);
    assert_eq!(s.frontend.cancel_instance_streams(2), 1);
    let err = within("ended", pending.established()).await.unwrap_err();
    assert!(
        matches!(
            &err,
            ResponseError::Disconnected(Disconnect::InstanceRemoved { instance: 2 })
        ),
        "{err}"
    );
}

macro_rules! contract {
    ($($plane_mod:ident => $plane:expr),*) => {$(
        mod $plane_mod {
            use super::*;
            contract!(@tests $plane;
                prologue_ok_items_arrive_in_order_then_a_clean_end,
                an_error_prologue_is_cannot_connect_with_the_typed_cause,
                the_prologue_is_sent_exactly_once_and_first,
                stop_is_graceful_and_the_stream_ends_quietly,
                a_stop_answered_by_dropping_the_sender_still_ends_quietly,
                kill_reaches_the_engine_and_further_sends_fail,
                dropping_the_receiver_kills_the_stream,
                dropping_the_sender_without_finish_is_an_abnormal_end,
                a_worker_process_gone_mid_stream_is_disconnected,
                a_one_mib_item_arrives_intact,
                ten_thousand_concurrent_streams_all_complete,
                a_kill_racing_setup_still_reaches_the_engine,
                a_plane_mismatch_answers_with_an_error_prologue,
                an_establish_timeout_bounds_the_wait_and_frees_the_registration,
                dropping_a_pending_handle_removes_all_state,
                a_stream_for_a_dropped_registration_is_refused_and_counted,
                registrations_after_shutdown_fail_cleanly,
                removing_a_worker_instance_ends_its_pending_streams_and_tombstones_it,
                a_re_associated_stream_ends_only_with_its_latest_worker_instance,
                a_sender_dropped_before_its_prologue_ends_the_pending_disconnected,
                streams_in_flight_are_counted_until_they_end_and_errors_are_counted
            );
        }
    )*};
    (@tests $plane:expr; $($test:ident),*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            super::$test($plane).await;
        }
    )*};
}

contract!(classic_tcp => CLASSIC);
#[cfg(feature = "tcp")]
contract!(velo_tcp => VELO_TCP);
#[cfg(feature = "ucx")]
contract!(velo_ucx => VELO_UCX);

/// The classic plane by hand: a worker that sends an item after its final one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_data_after_the_final_item_is_an_error() {
    use tokio::io::AsyncWriteExt;
    let s = setup(CLASSIC).await;
    let (info, pending) = register(&s);
    let address: serde_json::Value = serde_json::from_str(&info.info).unwrap();
    let mut raw = tokio::net::TcpStream::connect(address["addr"].as_str().unwrap())
        .await
        .unwrap();
    let message = |kind: u8, payload: &[u8]| {
        let mut m = u32::try_from(payload.len() + 1)
            .unwrap()
            .to_le_bytes()
            .to_vec();
        m.push(kind);
        m.extend_from_slice(payload);
        m
    };
    let handshake =
        serde_json::json!({ "stream": address["ticket"], "token": address["token"] }).to_string();
    let item = rmp_serde::to_vec_named(&token(1)).unwrap();
    let mut bytes = message(0x01, handshake.as_bytes());
    bytes.extend(message(0x02, br#"{"error":null}"#));
    bytes.extend(message(0x03, &item));
    bytes.extend(message(0x04, &[]));
    bytes.extend(message(0x03, &item));
    raw.write_all(&bytes).await.unwrap();
    let mut rx = within("established", pending.established()).await.unwrap();
    assert_eq!(within("item", rx.next()).await, Some(Ok(token(1))));
    let err = within("violation", rx.next()).await.unwrap().unwrap_err();
    assert_eq!(
        err,
        ResponseError::Protocol(ProtocolViolation::DataAfterFinal)
    );
    assert!(err.is_remote());
}

/// A velo worker whose items its frontend cannot decode is told so (the frontend drops the
/// stream as a protocol error): the worker sees its own fault, counted as a stream error,
/// not a cancellation of its work.
#[cfg(feature = "tcp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_the_frontend_cannot_decode_is_the_workers_error_not_a_cancellation() {
    let s = setup(VELO_TCP).await;
    let (info, pending) = register(&s);
    // The frontend reads `Token`s; this worker sends strings.
    let mut tx = within("connect", s.worker.connect::<String>(&info))
        .await
        .unwrap();
    within("prologue", tx.send_prologue(Ok(()))).await.unwrap();
    within("send", tx.send(&"not a token".to_owned()))
        .await
        .unwrap();
    s.worker.flush();
    let mut rx = within("established", pending.established()).await.unwrap();
    let err = within("item", rx.next()).await.unwrap().unwrap_err();
    assert!(matches!(err, ResponseError::Decode(_)), "{err}");
    let err = within("the worker hears of it", async {
        loop {
            match tx.send(&"still not a token".to_owned()).await {
                Ok(()) => tokio::time::sleep(Duration::from_millis(5)).await,
                Err(e) => break e,
            }
        }
    })
    .await;
    assert_eq!(
        err,
        ResponseError::DroppedByFrontend {
            code: response_plane::CancelCode::PROTOCOL_ERROR
        }
    );
    assert!(!err.is_cancelled() && err.is_remote());
    assert_eq!(s.worker.stats().stream_errors, 1);
    // A stream the frontend took is no refusal: it costs its connection nothing of the churn
    // budget (which closes a lane, every stream on it, when spent).
    let mux = s.frontend.stats().mux;
    assert_eq!((mux.streams_refused, mux.churn), (0, 0));
}
