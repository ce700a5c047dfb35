//! Stories of a lane's first moments: what a frontend does with a peer that speaks another
//! version, names another instance, sends garbage or nothing, goes silent after its handshake,
//! or is still half-open when the frontend shuts down.

use std::time::Duration;

use bytes::BytesMut;
use futures::FutureExt;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use velo_wire::{CloseCode, Frame, InstanceId, Role};

use super::{
    Frontend, RawListener, RawPeer, SLACK, Transport, Worker, frontend, frontend_mux,
    frontend_with, hello_bytes, next_item, open, read_close, read_frame, send_now, take, within,
    worker, worker_hello,
};
use crate::ConnectError;

/// What a peer of version 2 is told, on either side.
const VERSION_2_REFUSED: &str = "unsupported protocol version 2: this side speaks version 3";

/// A worker of version 2 gets a CLOSE naming both versions; a worker talking to a frontend of
/// version 2 fails with the same words.
pub async fn a_version_mismatch_is_refused_with_a_clear_error_on_both_sides<T: Transport>(net: T) {
    let tracker = TaskTracker::new();
    let (frontend, _inbox) = frontend(&net, &tracker).await;
    // A worker of version 2 talking to us. Refused by an answer (a timeout would be
    // BAD_HANDSHAKE).
    let mut lane = dial(&net, frontend.addr()).await;
    let hello = hello_bytes(&worker_hello(frontend.instance()), 2);
    within("the HELLO", lane.write(&hello)).await.unwrap();
    let close = read_close(&mut lane).await;
    assert_eq!(close.code, CloseCode::UNSUPPORTED_VERSION);
    assert_eq!(close.reason, VERSION_2_REFUSED);
    assert_eq!(frontend.handshake_stats().handshake_failures, 1);

    // A frontend of version 2 answering our worker; it holds each lane open (until the story
    // ends) so the worker reads the answer, not the lane's end.
    let mut fake = within("listening", net.listen_raw()).await.unwrap();
    let fake_addr = fake.addr();
    let fake_id = InstanceId::from_u128(5);
    tokio::spawn(async move {
        while let Some(mut lane) = fake.accept().await {
            tokio::spawn(async move {
                let _their_hello = read_frame(&mut lane).await;
                let mut answer = worker_hello(fake_id);
                answer.role = Role::Frontend;
                answer.instance_id = fake_id;
                answer.peer_instance_id = InstanceId::ANY;
                if lane.write(&hello_bytes(&answer, 2)).await.is_ok() {
                    std::future::pending::<()>().await;
                }
            });
        }
    });
    let worker = worker(&net, &tracker);
    let err = within("preparing", worker.endpoint().peer(fake_addr, fake_id))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ConnectError::Wire { .. }), "{msg}");
    assert!(msg.contains(VERSION_2_REFUSED), "{msg}");
}

/// A worker that names an instance the frontend is not is refused with IDENTITY_MISMATCH,
/// and the reason names the instance it asked for.
pub async fn a_worker_holding_another_instance_id_is_refused_as_identity_mismatch<T: Transport>(
    net: T,
) {
    let tracker = TaskTracker::new();
    let (frontend, _inbox) = frontend(&net, &tracker).await;
    let worker = worker(&net, &tracker);
    let stale = InstanceId::from_u128(12345);
    let err = within("preparing", worker.endpoint().peer(frontend.addr(), stale))
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

/// Garbage gets a CLOSE (protocol error), then the lane's orderly end; the frontend goes on
/// serving other workers.
pub async fn garbage_bytes_close_that_lane_and_the_listener_keeps_serving<T: Transport>(net: T) {
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend(&net, &tracker).await;
    let mut junk = dial(&net, frontend.addr()).await;
    within(
        "the garbage",
        junk.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
    )
    .await
    .unwrap();
    let close = read_close(&mut junk).await;
    assert_eq!(close.code, CloseCode::PROTOCOL_ERROR);
    within("the lane's end", async {
        let mut rest = BytesMut::new();
        while junk.read(&mut rest).await.expect("an orderly end") > 0 {}
    })
    .await;
    assert_eq!(frontend.handshake_stats().handshake_failures, 1);
    // Still serving.
    let worker = worker(&net, &tracker);
    let mut s = open(&worker, &frontend, 1).await;
    send_now(&mut s, b"hello").await;
    let mut r = take(&mut inbox).await;
    assert_eq!(next_item(&mut r).await, &b"hello"[..]);
}

/// A peer that connects and says nothing holds its slot until the handshake timeout, then
/// gets a CLOSE (bad handshake); meanwhile another worker is served.
pub async fn a_peer_that_never_speaks_is_dropped_without_stalling_others<T: Transport>(net: T) {
    let tracker = TaskTracker::new();
    // The default handshake bound (5 s), on both sides: far longer than serving another worker
    // takes, so the silent peer certainly still holds its slot meanwhile (and the worker's own
    // lanes never race it).
    let (frontend, mut inbox) = frontend(&net, &tracker).await;
    let timeout = crate::DEFAULT_HANDSHAKE_TIMEOUT;
    // Taken before connecting: certainly before the frontend starts the silent peer's timer
    // (some transports connect asynchronously, so it may start after `dial_raw` returned).
    let t0 = Instant::now();
    let mut silent = dial(&net, frontend.addr()).await;
    let worker = worker(&net, &tracker);
    let mut s = open(&worker, &frontend, 1).await;
    send_now(&mut s, b"not stalled").await;
    let mut r = take(&mut inbox).await;
    assert_eq!(next_item(&mut r).await, &b"not stalled"[..]);
    let mut probe = BytesMut::new();
    let read = silent.read(&mut probe).now_or_never();
    assert!(
        read.is_none(),
        "the other worker was served while the silent peer was still connected: {read:?}"
    );
    assert_eq!(frontend.handshake_stats().handshake_timeouts, 0);
    // The silent one is closed once its handshake timeout passes.
    let close = read_close(&mut silent).await;
    assert_eq!(close.code, CloseCode::BAD_HANDSHAKE);
    assert!(t0.elapsed() >= timeout, "{:?}", t0.elapsed());
    assert_eq!(frontend.handshake_stats().handshake_timeouts, 1);
}

/// Shutting a frontend down, then its worker, ends every task within the transport's bound,
/// though one peer is still mid-handshake and another handshook and then stopped reading.
pub async fn shutdown_ends_every_task_within_its_bound_despite_half_open_connections<
    T: Transport,
>(
    net: T,
) {
    let tracker = TaskTracker::new();
    // Handshake and idle bounds far beyond the story's own: shutdown must not wait for them.
    let (frontend, mut inbox) = frontend_with(&net, &tracker, |spec| {
        spec.mux = frontend_mux(|b| b.idle_timeout(FOREVER));
        spec.accept.handshake_timeout = FOREVER;
    })
    .await;
    // One connection mid-handshake, silent.
    let _silent = dial(&net, frontend.addr()).await;
    // One handshaken lane whose peer then stops reading and never closes.
    let _half = handshaken_by_hand(&net, &frontend).await;
    // And a worker with a stream.
    let worker = worker(&net, &tracker);
    let mut s = open(&worker, &frontend, 1).await;
    send_now(&mut s, b"x").await;
    let _r = take(&mut inbox).await;
    let t0 = Instant::now();
    within("shutdown", frontend.shutdown()).await;
    worker.close();
    tracker.close();
    within("every task ending", tracker.wait()).await;
    let bound = net.shutdown_bound() + SLACK;
    assert!(t0.elapsed() < bound, "{:?} (bound {bound:?})", t0.elapsed());
}

/// A peer that handshakes and then says nothing is closed by the frontend's idle timer: not
/// before it, and not long after.
pub async fn a_peer_silent_after_its_handshake_is_closed_by_the_idle_timer<T: Transport>(net: T) {
    let tracker = TaskTracker::new();
    let idle = Duration::from_millis(500);
    let (frontend, _inbox) = frontend_with(&net, &tracker, |spec| {
        spec.mux = frontend_mux(|b| b.idle_timeout(idle));
    })
    .await;
    // Taken before connecting: certainly before the frontend starts the lane's idle timer.
    let t0 = Instant::now();
    let mut half = handshaken_by_hand(&net, &frontend).await;
    let close = read_close(&mut half).await;
    assert_eq!(close.code, CloseCode::IDLE_TIMEOUT);
    let waited = t0.elapsed();
    assert!(waited >= idle && waited < idle + SLACK, "{waited:?}");
}

/// A raw lane to `frontend` that has sent a worker's HELLO (one lane of one) and read the
/// frontend's answer: a lane the frontend has attached, spoken by hand from now on.
///
/// # Panics
///
/// If the frontend answers otherwise, or not within the bound.
pub async fn handshaken_by_hand<T: Transport>(net: &T, frontend: &T::Frontend) -> T::Raw {
    let mut lane = dial(net, frontend.addr()).await;
    let hello = worker_hello(frontend.instance());
    let hello = hello_bytes(&hello, velo_wire::PROTOCOL_VERSION);
    within("the HELLO", lane.write(&hello)).await.unwrap();
    let answer = read_frame(&mut lane).await;
    assert!(matches!(answer, Some(Frame::Hello(_))), "{answer:?}");
    lane
}

/// A raw lane to `addr` (bounded).
async fn dial<T: Transport>(net: &T, addr: std::net::SocketAddr) -> T::Raw {
    within("a raw lane", net.dial_raw(addr))
        .await
        .expect("a raw lane connects")
}

/// A bound no story waits for: an hour.
const FOREVER: Duration = Duration::from_secs(3600);
