//! Stories of a worker's connection cache over a real transport: one preparation per frontend
//! instance, failures backed off and retried, a restarted frontend prepared again.

use std::time::Duration;

use tokio_util::task::TaskTracker;
use velo_mux::StreamEnd;
use velo_wire::{CloseCode, InstanceId};

use super::{
    Frontend, FrontendSpec, PROLOGUE, TOKEN, Transport, Worker, eventually, frontend, next_item,
    send_now, start_frontend, take, within, worker, worker_settings,
};
use crate::{Backoff, ConnectError, OpenStreamError};

/// A frontend that dies and comes back at the same address under a new instance id: the old
/// connection ends, the old id is refused as an identity mismatch, the new one is prepared.
pub async fn a_frontend_restarted_under_a_new_instance_id_is_prepared_again<T: Transport>(net: T) {
    let tracker = TaskTracker::new();
    let (first, mut inbox) = frontend(&net, &tracker).await;
    let (addr, old_id) = (first.addr(), first.instance());
    let worker = worker(&net, &tracker);
    let open = |id, ticket| worker.endpoint().open(addr, id, ticket, &TOKEN, PROLOGUE);
    let mut s = within("opening", open(old_id, 1)).await.unwrap();
    send_now(&mut s, b"before").await;
    let _held = take(&mut inbox).await;
    first.abort();
    drop(first);
    // The same address, a new instance: bound as soon as the transport lets go of the address.
    let new_id = InstanceId::from_u128(0xfeed);
    let (second, mut inbox2) = within("rebinding", async {
        loop {
            let restart = |spec: &mut FrontendSpec| {
                spec.addr = Some(addr);
                spec.instance = new_id;
            };
            match start_frontend(&net, &tracker, restart).await {
                Ok(f) => break f,
                Err(_) => tokio::time::sleep(REBIND_EVERY).await,
            }
        }
    })
    .await;
    // The old stream is gone, and so (each lane notices on its own) is the old connection...
    let end = within("the old stream ending", s.closed()).await;
    assert!(matches!(end, StreamEnd::Lost(_)), "{end:?}");
    within("the old connection ending", s.peer().closed()).await;
    // ...an address that still names the old instance gets a clear refusal, once the address
    // serves the new one (an attempt while it served nothing, such as the worker announcing
    // its lost stream, may have failed otherwise and be backing off)...
    within("a refusal at the old id", async {
        loop {
            match open(old_id, 2).await {
                Err(OpenStreamError::Connect(ConnectError::Refused {
                    code: CloseCode::IDENTITY_MISMATCH,
                    ..
                })) => break,
                Err(_) => tokio::time::sleep(REBIND_EVERY).await,
                Ok(_) => panic!("a stream opened at an instance that is gone"),
            }
        }
    })
    .await;
    // ...and the new instance is prepared afresh.
    let mut s2 = within("opening at the new id", open(new_id, 3))
        .await
        .unwrap();
    send_now(&mut s2, b"after").await;
    let mut r = take(&mut inbox2).await;
    assert_eq!(next_item(&mut r).await, &b"after"[..]);
    drop(second);
}

/// Fifty first requests at once share one preparation: each lane is dialed and accepted once.
pub async fn concurrent_first_requests_share_one_preparation<T: Transport>(net: T) {
    let tracker = TaskTracker::new();
    let (frontend, _inbox) = frontend(&net, &tracker).await;
    let worker = worker(&net, &tracker);
    let (addr, id) = (frontend.addr(), frontend.instance());
    let opens: Vec<_> = (0..50)
        .map(|t| {
            let endpoint = worker.endpoint().clone();
            tokio::spawn(
                async move { endpoint.open(addr, id, t, &TOKEN, PROLOGUE).await.map(drop) },
            )
        })
        .collect();
    for o in opens {
        within("an open", o).await.unwrap().unwrap();
    }
    let lanes = u64::from(velo_mux::DEFAULT_LANES);
    assert_eq!(
        worker.endpoint().handshake_stats().lanes_dialed,
        lanes,
        "one preparation of {lanes} lanes"
    );
    // The frontend counts a lane once attached, just after answering its handshake.
    eventually("every lane accepted", || {
        frontend.handshake_stats().lanes_accepted == lanes
    })
    .await;
}

/// A preparation that fails (nothing listens) is not cached: requests during its backoff fail
/// fast without dialing, and the first one after it dials again.
pub async fn a_failed_preparation_fails_fast_during_its_backoff_then_retries<T: Transport>(net: T) {
    let tracker = TaskTracker::new();
    let nowhere = net.unreachable();
    let (addr, id) = (nowhere.addr, InstanceId::from_u128(9));
    let worker_backing_off = |min: Duration| {
        let settings = crate::WorkerSettings {
            backoff: Backoff { min, max: min },
            ..worker_settings(|b| b)
        };
        net.worker(settings, &tracker)
    };
    let prepare = |w: &T::Worker| {
        let endpoint = w.endpoint().clone();
        async move { endpoint.peer(addr, id).await }
    };
    // A backoff far longer than the story: the second request certainly falls within it.
    let worker = worker_backing_off(Duration::from_secs(60));
    let err = within("preparing", prepare(&worker)).await.unwrap_err();
    // Fast: the transport's own error, not the handshake timeout.
    assert!(matches!(err, ConnectError::Io { .. }), "{err}");
    let failures = worker.endpoint().handshake_stats().dial_failures;
    // Within the backoff: fail fast, no new dial.
    let err = within("preparing again", prepare(&worker))
        .await
        .unwrap_err();
    assert!(matches!(err, ConnectError::BackingOff { .. }), "{err}");
    assert!(err.to_string().contains("next attempt in"), "{err}");
    assert_eq!(worker.endpoint().handshake_stats().dial_failures, failures);
    // After the backoff (1 ms here): a real new attempt.
    let worker = worker_backing_off(Duration::from_millis(1));
    let err = within("preparing", prepare(&worker)).await.unwrap_err();
    assert!(matches!(err, ConnectError::Io { .. }), "{err}");
    let failures = worker.endpoint().handshake_stats().dial_failures;
    let err = within("a new attempt after the backoff", async {
        loop {
            match prepare(&worker).await {
                Err(ConnectError::BackingOff { .. }) => tokio::time::sleep(RETRY_EVERY).await,
                other => break other,
            }
        }
    })
    .await
    .unwrap_err();
    assert!(matches!(err, ConnectError::Io { .. }), "{err}");
    assert!(worker.endpoint().handshake_stats().dial_failures > failures);
}

/// How often a restarted frontend tries to bind its predecessor's address.
const REBIND_EVERY: Duration = Duration::from_millis(20);
/// How often a request is repeated while its backoff lasts.
const RETRY_EVERY: Duration = Duration::from_millis(5);
