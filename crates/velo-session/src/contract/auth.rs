//! Stories of the cluster secret and the handshake budget: a frontend holding a secret
//! serves only workers that prove it, tells every other peer why before it allocates any
//! stream state, and keeps its handshakes in a budget of their own.

use velo_wire::{Auth, CloseCode, Frame};

use super::{
    Frontend, RawPeer, Transport, Worker, frontend_with, hello_bytes, next_item, open, read_close,
    send_now, take, within, worker_hello, worker_settings,
};
use crate::{ClusterSecret, ConnectError};
use tokio_util::task::TaskTracker;

/// The secret of the stories' cluster.
fn secret() -> ClusterSecret {
    ClusterSecret::new(b"the stories' cluster secret, 32+").expect("a valid secret")
}

/// Another cluster's.
fn other_secret() -> ClusterSecret {
    ClusterSecret::new(b"somebody else's cluster secret!!").expect("a valid secret")
}

/// A worker holding the frontend's secret opens streams as usual.
pub async fn a_worker_proving_the_cluster_secret_is_served<T: Transport>(net: T) {
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) =
        frontend_with(&net, &tracker, |spec| spec.secret = Some(secret())).await;
    let mut settings = worker_settings(|b| b);
    settings.secret = Some(secret());
    let worker = net.worker(settings, &tracker);
    let mut s = open(&worker, &frontend, 1).await;
    send_now(&mut s, b"proved").await;
    let mut r = take(&mut inbox).await;
    assert_eq!(next_item(&mut r).await, &b"proved"[..]);
    // The worker's lanes are up once it has sent its proof; the frontend counts each lane
    // when it has checked that proof, which may be after this stream's item arrived.
    super::eventually("every lane accepted", || {
        frontend.handshake_stats().lanes_accepted == 4
    })
    .await;
    assert_eq!(frontend.handshake_stats().auth_failures, 0);
}

/// Without the secret, or with another one, a worker is refused as `unauthenticated` and
/// says so; the frontend counts it and holds no connection for it.
pub async fn a_worker_without_the_right_secret_is_refused_on_both_sides<T: Transport>(net: T) {
    let tracker = TaskTracker::new();
    let (frontend, _inbox) =
        frontend_with(&net, &tracker, |spec| spec.secret = Some(secret())).await;
    let (addr, instance) = (frontend.addr(), frontend.instance());

    let none = net.worker(worker_settings(|b| b), &tracker);
    let err = within("preparing", none.endpoint().peer(addr, instance))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ConnectError::Refused { code, reason, .. }
            if *code == CloseCode::UNAUTHENTICATED && reason.contains("offers no proof")),
        "{err}"
    );

    let mut settings = worker_settings(|b| b);
    settings.secret = Some(other_secret());
    let wrong = net.worker(settings, &tracker);
    let err = within("preparing", wrong.endpoint().peer(addr, instance))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ConnectError::Unauthenticated { reason, .. }
            if reason.contains("does not match")),
        "{err}"
    );
    super::eventually("both refusals counted", || {
        frontend.handshake_stats().auth_failures >= 2
    })
    .await;
    assert!(
        frontend.endpoint().peers().is_empty(),
        "no connection was made"
    );
    assert_eq!(frontend.handshake_stats().lanes_accepted, 0);
}

/// A worker offering a secret to a frontend that has none is a misconfiguration, reported as
/// such rather than silently served in the clear.
pub async fn a_secret_on_the_worker_only_is_refused_as_a_misconfiguration<T: Transport>(net: T) {
    let tracker = TaskTracker::new();
    let (frontend, _inbox) = frontend_with(&net, &tracker, |_| {}).await;
    let mut settings = worker_settings(|b| b);
    settings.secret = Some(secret());
    let worker = net.worker(settings, &tracker);
    let err = within(
        "preparing",
        worker.endpoint().peer(frontend.addr(), frontend.instance()),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, ConnectError::Refused { code, reason, .. }
            if *code == CloseCode::UNAUTHENTICATED && reason.contains("has none configured")),
        "{err}"
    );
}

/// A peer that answers the frontend's challenge with a forged proof is closed
/// `unauthenticated`; its lane never joins a connection.
pub async fn a_forged_proof_is_refused_before_any_stream_state<T: Transport>(net: T) {
    let tracker = TaskTracker::new();
    let (frontend, _inbox) =
        frontend_with(&net, &tracker, |spec| spec.secret = Some(secret())).await;
    let mut lane = within("dialing", net.dial_raw(frontend.addr()))
        .await
        .unwrap();
    let mut hello = worker_hello(frontend.instance());
    hello.auth_nonce = Some([7; 32]);
    within("the HELLO", lane.write(&hello_bytes(&hello, 3)))
        .await
        .unwrap();
    let frames = read_frames(&mut lane, 2).await;
    assert!(
        matches!(frames.first(), Some(Frame::Hello(h)) if h.auth_nonce.is_some()),
        "{frames:?}"
    );
    assert!(matches!(frames.get(1), Some(Frame::Auth(_))), "{frames:?}");
    let mut forged = Vec::new();
    Frame::Auth(Auth { mac: [0xab; 32] }).encode(&mut forged);
    within("the forged proof", lane.write(&forged))
        .await
        .unwrap();
    let close = read_close(&mut lane).await;
    assert_eq!(close.code, CloseCode::UNAUTHENTICATED);
    assert_eq!(frontend.handshake_stats().auth_failures, 1);
    assert!(frontend.endpoint().peers().is_empty());
}

/// Connections stuck in their handshake are refused at their own budget (CLOSE `limit`),
/// while a worker that completed its handshake keeps being served; the budget frees up as
/// they go.
pub async fn silent_handshakes_past_their_budget_are_refused_and_workers_still_served<
    T: Transport,
>(
    net: T,
) {
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = frontend_with(&net, &tracker, |spec| {
        // A worker dials its 4 lanes at once: the budget lets exactly that many in.
        spec.accept.max_handshakes = 4;
        spec.accept.max_handshakes_per_source = 4;
    })
    .await;
    let worker = super::worker(&net, &tracker);
    let mut s = open(&worker, &frontend, 1).await;
    let mut r = take(&mut inbox).await;
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(
            within("dialing", net.dial_raw(frontend.addr()))
                .await
                .unwrap(),
        );
    }
    // A worker arriving now is refused with a CLOSE `limit` (a transport with a handshake of
    // its own, TLS, reads it in place of the answer it expected and says so).
    let late = super::worker(&net, &tracker);
    let err = within(
        "preparing",
        late.endpoint().peer(frontend.addr(), frontend.instance()),
    )
    .await
    .unwrap_err();
    let refused = matches!(&err, ConnectError::Refused { code, .. } if *code == CloseCode::LIMIT)
        || err.to_string().contains("(limit): too many handshakes");
    assert!(refused, "{err}");
    assert!(frontend.handshake_stats().handshakes_refused >= 1);
    send_now(&mut s, b"still served").await;
    assert_eq!(next_item(&mut r).await, &b"still served"[..]);
    // The silent ones leave; a new worker gets in. Which connections the budget refused
    // depends on the order they reached the frontend (a silent one may have been refused and
    // one of the late worker's lanes let in), so wait for every handshake to have concluded:
    // accepted, refused, failed (a dropped peer) or timed out (a transport that does not tell
    // a dropped peer, UCX).
    drop(silent);
    super::eventually("every handshake concluded", || {
        let s = frontend.handshake_stats();
        s.lanes_accepted + s.handshakes_refused + s.handshake_failures + s.handshake_timeouts
            >= s.connections_accepted
    })
    .await;
    let other = super::worker(&net, &tracker);
    let _s2 = open(&other, &frontend, 2).await;
    let _r2 = take(&mut inbox).await;
}

/// The next `n` frames from `lane` (bounded).
async fn read_frames(lane: &mut impl RawPeer, n: usize) -> Vec<Frame> {
    let mut buf = bytes::BytesMut::new();
    let mut decoder = velo_wire::FrameDecoder::new(velo_wire::MIN_MAX_FRAME_LEN);
    let mut frames = Vec::new();
    while frames.len() < n {
        while let Some(frame) = decoder.decode(&mut buf).expect("a valid frame") {
            frames.push(frame);
        }
        if frames.len() >= n {
            break;
        }
        let read = within("a frame", lane.read(&mut buf)).await;
        if !read.is_ok_and(|r| r > 0) {
            break;
        }
    }
    frames
}
