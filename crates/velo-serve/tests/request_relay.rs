//! The request plane binds the worker a frontend means: the frontend's greeting names the
//! worker's discovery instance id, and a worker refuses a greeting naming another. So a stale
//! or forged discovery entry pointing at another live worker (someone who took a dead worker's
//! port, or wrote discovery, relaying between the frontend and that worker) gets no request
//! run, secret or not. Real sockets on loopback.

mod harness;

use std::time::Duration;

use harness::intake::{closed_before_any_engine_saw_it, refusals_reach};
use harness::{Cluster, chat};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::task::TaskTracker;
use velo_serve::discovery::lease::Lease;
use velo_serve::discovery::{Instance, Transport};
use velo_serve::work::auth::MAGIC;
use velo_serve::work::{ConnectError, HandshakeError, RequestAuth, WorkChannel};
use velo_serve::worker::Worker;

/// The cluster's secret.
const SECRET: &str = "the velo-serve tests' secret....";

async fn worker_with_secret() -> Worker {
    let config = harness::worker_config(
        harness::plane_with_secret(Some(SECRET)),
        harness::discovery(Duration::from_secs(10)),
    );
    Worker::start(config).await.expect("the worker starts")
}

/// A frontend with the secret that means instance A and reaches worker B, which holds the
/// same secret: both refuse, B counts it and no request reaches B's engines; meaning B, or
/// naming no instance, it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontend_meaning_another_instance_is_refused_by_the_worker() {
    let worker = worker_with_secret().await;
    let b = worker.instance_id();
    let a = b ^ 1;
    let secret = RequestAuth::with_secret(SECRET.as_bytes()).unwrap();
    let tracker = TaskTracker::new();
    let r =
        WorkChannel::connect(worker.address(), &secret.clone().with_instance(a), &tracker).await;
    match r {
        Err(ConnectError::Handshake(HandshakeError::WrongInstance { meant, actual, .. })) => {
            assert_eq!((meant, actual), (a, b));
        }
        other => panic!("not refused for the instance: {other:?}"),
    }
    refusals_reach(worker.intake_stats(), 1).await;
    let [running, admitted, completed, cancelled, refused] = worker.stats().snapshot();
    assert_eq!(running + admitted + completed + cancelled + refused, 0);
    for auth in [secret.clone().with_instance(b), secret] {
        let channel = WorkChannel::connect(worker.address(), &auth, &tracker).await;
        channel
            .expect("the worker meant (or any, unnamed) serves")
            .close();
    }
    worker.abort();
}

/// The worker checks by itself, secret or not: a greeting naming another instance, with a
/// request written right behind it, is closed unread, here by a worker without a secret
/// (where nothing else would have refused it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_greeting_for_another_instance_gets_no_request_run() {
    let (worker, frontend, request) = harness::intake::worker_and_request(None).await;
    let mut g = harness::intake::greeting(1, 0);
    let other = worker.instance_id() ^ 1;
    g[MAGIC.len() + 2..MAGIC.len() + 10].copy_from_slice(&other.to_be_bytes());
    let mut conn = TcpStream::connect(worker.address()).await.unwrap();
    let mut bytes = g.to_vec();
    bytes.extend_from_slice(&request);
    // The worker may have closed already: the write may fail; what matters is what it ran.
    let _ = conn.write_all(&bytes).await;
    closed_before_any_engine_saw_it(&mut conn, &worker, 1).await;
    worker.abort();
    let _ = frontend.shutdown().await;
}

/// A stale discovery entry (instance A, long gone) whose address is now another live worker
/// B's, all with one secret: the frontend connects, B refuses it, nothing is routed there (a
/// request gets 503) and no request reaches B's engines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_discovery_entry_pointing_at_another_worker_is_never_routed_to() {
    let c = Cluster::start_on(harness::plane_with_secret(Some(SECRET)), 0, |_| {}).await;
    // B registers in a discovery of its own: this frontend knows it only by A's entry.
    let b = worker_with_secret().await;
    let d = &c.discovery;
    let stale = Instance {
        namespace: d.namespace.clone(),
        component: d.component.clone(),
        endpoint: d.endpoint.clone(),
        instance_id: b.instance_id() ^ 1,
        transport: Transport::Tcp(b.address().to_string()),
    };
    let lease = Lease::publish(d, &stale).unwrap();
    refusals_reach(b.intake_stats(), 1).await;
    assert!(
        c.frontend.state().pool.is_empty(),
        "routed to the wrong worker"
    );
    let (_conn, r) = c
        .post(
            "/v1/chat/completions",
            &chat(4, false, serde_json::json!({})),
        )
        .await;
    assert_eq!(r.status, 503);
    let [running, admitted, completed, cancelled, refused] = b.stats().snapshot();
    assert_eq!(running + admitted + completed + cancelled + refused, 0);
    lease.close();
    b.abort();
}
