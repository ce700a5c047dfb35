//! A worker's request plane under a peer that writes requests as fast as it can (a stranger
//! that reached the port, a buggy frontend): the worker holds at most `max_requests`
//! requests and serves at most `max_connections` connections past their handshake (at most
//! `MAX_HANDSHAKES` more in it); the rest wait in the sockets (TCP pushes back on the sender)
//! and go on as places free up.

mod harness;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use response_plane::{Codec, PendingResponse, Plane, RegisterOptions};
use runtime_glue::{ResponseService, Role};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use velo_serve::wire::StreamItem;
use velo_serve::work::auth::{GREETING_LEN, HANDSHAKE_TIMEOUT, MAGIC};
use velo_serve::work::{
    MAX_HANDSHAKES, MAX_HANDSHAKES_PER_SOURCE, RequestAuth, WireEnding, WorkChannel, WorkLimits,
    WorkRequest,
};
use velo_serve::worker::{Worker, WorkerStats};

use harness::BOUND;
use harness::intake::{frame, request_numbered};

/// How often the tests look at a counter while waiting for a condition.
const POLL: Duration = Duration::from_millis(5);

/// A frontend's greeting without a secret (see `velo_serve::work`'s docs): the request
/// plane's handshake with a worker that has none either, written ahead of the requests (the
/// worker's own greeting is left unread).
fn open_greeting() -> [u8; GREETING_LEN] {
    let mut g = [0; GREETING_LEN];
    g[..MAGIC.len()].copy_from_slice(&MAGIC);
    g[MAGIC.len()] = 1; // a frontend
    g[MAGIC.len() + 1] = 0; // no secret: no proof follows
    // Then 8 zero bytes (naming no worker instance) and a nonce (zeros will do).
    g
}

/// Waits for a stream's prologue, reports it with a way to end it, then reads it (a frontend
/// that keeps up) until it is ended: dropping it kills the stream, so its worker's next send
/// fails and the engine frees the request.
async fn follow(pending: PendingResponse<StreamItem>, held: mpsc::Sender<oneshot::Sender<()>>) {
    let Ok(mut stream) = pending.established().await else {
        return;
    };
    let (end, ended) = oneshot::channel();
    if held.send(end).await.is_err() {
        return;
    }
    // Cancel safety: both branches only read or wait.
    tokio::select! {
        () = async { while stream.next().await.is_some() {} } => {}
        _ = ended => {}
    }
}

/// Polls (bounded in time) until `admitted` reaches `want`, checking on every look that the
/// worker never holds more than `max` requests, nor admitted more than `max` plus the
/// streams ended so far.
async fn admitted_reaches(stats: &WorkerStats, want: u64, max: u64, ended: u64) {
    let start = Instant::now();
    loop {
        let running = stats.running.load(Ordering::Acquire);
        let admitted = stats.admitted.load(Ordering::Relaxed);
        assert!(
            running <= max,
            "the worker holds {running} requests; max_requests is {max}"
        );
        assert!(
            admitted <= max + ended,
            "the worker took {admitted} requests while only {ended} of them ended; \
             max_requests is {max}"
        );
        if admitted >= want {
            return;
        }
        assert!(
            start.elapsed() < BOUND,
            "timed out waiting for {want} requests admitted: {:?} (running, admitted, \
             completed, cancelled, refused)",
            stats.snapshot()
        );
        tokio::time::sleep(POLL).await;
    }
}

/// 24 requests that would generate for ever, written at once on one connection to a worker
/// allowed 4: it takes 4, and one more each time one of its streams ends, never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_flooding_a_worker_with_requests_gets_at_most_max_requests_held() {
    const MAX: usize = 4;
    const SENT: u64 = 24;
    let plane = harness::plane(Plane::Velo);
    let frontend = ResponseService::start(harness::service(Role::Frontend, plane.clone()))
        .await
        .expect("the frontend's plane starts");
    let mut config = harness::worker_config(plane, harness::discovery(Duration::from_secs(10)));
    config.engines = 1;
    config.work_limits.max_requests = MAX;
    let worker = Worker::start(config).await.expect("the worker starts");

    let (held_tx, mut held) = mpsc::channel(64);
    let mut frames = BytesMut::new();
    frames.put_slice(&open_greeting());
    for id in 0..SENT {
        let opts = RegisterOptions {
            codec: Codec::Msgpack,
            establish_timeout: Some(BOUND),
        };
        let (info, pending) = frontend
            .register::<StreamItem>(opts)
            .expect("a registered stream");
        tokio::spawn(follow(pending, held_tx.clone()));
        frames.put(frame(&WorkRequest {
            id,
            prompt_tokens: 16,
            output_tokens: 1_000_000,
            ending: WireEnding::Length,
            info,
        }));
    }
    let mut peer = TcpStream::connect(worker.address()).await.unwrap();
    tokio::time::timeout(BOUND, peer.write_all(&frames))
        .await
        .expect("the requests fit in the sockets' buffers")
        .unwrap();

    let stats = worker.stats().clone();
    let max = u64::try_from(MAX).unwrap();
    let mut ended = 0u64;
    loop {
        admitted_reaches(&stats, (max + ended).min(SENT), max, ended).await;
        if max + ended >= SENT {
            break;
        }
        // End one held stream: its place goes to the next request.
        let end = tokio::time::timeout(BOUND, held.recv())
            .await
            .expect("a held stream in time")
            .expect("streams are reported");
        let _ = end.send(());
        ended += 1;
    }
    assert_eq!(stats.admitted.load(Ordering::Relaxed), SENT);
    drop(peer);
    worker.abort();
    let _ = frontend.shutdown().await;
}

/// One `serve` with `max_connections` whose delivered frames go to a channel (dropping one
/// gives its request's place back).
fn serve_connections(
    max_connections: usize,
    stop: &CancellationToken,
) -> (std::net::SocketAddr, mpsc::Receiver<u64>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let (tx, rx) = mpsc::channel(16);
    let limits = WorkLimits {
        max_requests: 16,
        max_connections,
    };
    let deliver = move |raw: Bytes| {
        let id = WorkRequest::decode(&raw).map_or(u64::MAX, |r| r.id);
        let _ = tx.try_send(id);
    };
    let serve = velo_serve::work::serve(
        listener,
        limits,
        RequestAuth::open(),
        std::sync::Arc::default(),
        TaskTracker::new(),
        stop.clone(),
        deliver,
    );
    tokio::spawn(serve);
    (addr, rx)
}

/// Writes a request numbered `id` on `conn` (its stream address is never used).
async fn send(conn: &mut TcpStream, id: u64) {
    let request = request_numbered(id);
    conn.write_all(&frame(&request)).await.unwrap();
}

async fn next_delivered(rx: &mut mpsc::Receiver<u64>) -> u64 {
    tokio::time::timeout(BOUND, rx.recv())
        .await
        .expect("a request delivered in time")
        .expect("the server runs")
}

/// Three connections to a worker serving two: the third, past its handshake, waits for a
/// slot (reading nothing) and is served once one of the first two ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_serves_at_most_max_connections_and_the_next_once_one_ends() {
    let stop = CancellationToken::new();
    let (addr, mut delivered) = serve_connections(2, &stop);
    let mut first = TcpStream::connect(addr).await.unwrap();
    let mut second = TcpStream::connect(addr).await.unwrap();
    for (id, conn) in [(1, &mut first), (2, &mut second)] {
        conn.write_all(&open_greeting()).await.unwrap();
        send(conn, id).await;
    }
    let mut seen = vec![
        next_delivered(&mut delivered).await,
        next_delivered(&mut delivered).await,
    ];
    seen.sort_unstable();
    assert_eq!(seen, [1, 2], "the first two connections are served");
    let mut third = TcpStream::connect(addr).await.unwrap();
    third.write_all(&open_greeting()).await.unwrap();
    send(&mut third, 3).await;
    let early = tokio::time::timeout(Duration::from_millis(200), delivered.recv()).await;
    assert!(early.is_err(), "a third connection was served: {early:?}");
    drop(first);
    assert_eq!(next_delivered(&mut delivered).await, 3);
    drop((second, third));
    stop.cancel();
}

/// Strangers who connect and say nothing hold handshake places, not connection slots: with
/// one slot, a frontend is served at once, not once their handshakes time out. (They and the
/// frontend share an address, so they stay within its share of the handshake places.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_strangers_do_not_hold_the_connection_slots() {
    let stop = CancellationToken::new();
    let (addr, mut delivered) = serve_connections(1, &stop);
    let mut silent = Vec::new();
    for _ in 0..MAX_HANDSHAKES_PER_SOURCE - 1 {
        silent.push(TcpStream::connect(addr).await.unwrap());
    }
    let start = Instant::now();
    let tracker = TaskTracker::new();
    let channel = WorkChannel::connect(addr, &RequestAuth::open(), &tracker)
        .await
        .expect("the frontend passes the handshake");
    let request = request_numbered(9);
    channel.send(&request).await.unwrap();
    assert_eq!(next_delivered(&mut delivered).await, 9);
    let took = start.elapsed();
    assert!(
        took < HANDSHAKE_TIMEOUT,
        "served after {took:?}: the silent strangers held the slot"
    );
    assert!(MAX_HANDSHAKES > silent.len() + 1);
    channel.close();
    drop(silent);
    stop.cancel();
}

/// Requests refused before they hold an engine slot (here: not JSON) give their place back
/// at once: with one place, every one of them is still read and refused in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_give_their_place_back() {
    const SENT: u64 = 3;
    let plane = harness::plane(Plane::Velo);
    let mut config = harness::worker_config(plane, harness::discovery(Duration::from_secs(10)));
    config.work_limits.max_requests = 1;
    let worker = Worker::start(config).await.expect("the worker starts");
    let mut peer = TcpStream::connect(worker.address()).await.unwrap();
    peer.write_all(&open_greeting()).await.unwrap();
    for _ in 0..SENT {
        peer.write_all(&[0, 0, 0, 3, b'n', b'o', b'!'])
            .await
            .unwrap();
    }
    let stats = worker.stats().clone();
    let start = Instant::now();
    while stats.refused.load(Ordering::Relaxed) < SENT {
        assert!(
            start.elapsed() < BOUND,
            "timed out waiting for {SENT} refusals: {:?} (running, admitted, completed, \
             cancelled, refused)",
            stats.snapshot()
        );
        tokio::time::sleep(POLL).await;
    }
    worker.abort();
}

/// A bound of zero would stop the worker taking any request: it is a start-up error naming
/// the bound and its range.
#[tokio::test]
async fn a_worker_allowed_no_requests_is_a_startup_error() {
    let plane = harness::plane(Plane::Velo);
    let mut config = harness::worker_config(plane, harness::discovery(Duration::from_secs(10)));
    config.work_limits.max_requests = 0;
    let err = Worker::start(config).await.expect_err("a start-up error");
    let text = err.to_string();
    assert!(
        text.contains("max_requests") && text.contains("between 1 and"),
        "{text}"
    );
}
