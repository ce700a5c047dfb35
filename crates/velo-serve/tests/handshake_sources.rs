//! A worker's request plane under a stranger who opens silent connections from one address:
//! that address holds at most `MAX_HANDSHAKES_PER_SOURCE` handshake places, the rest of its
//! connections are closed at once, and a frontend connecting from another address passes its
//! handshake without waiting for the stranger's to time out.
//!
//! Linux loopback answers on all of 127/8, so a client socket bound to 127.0.0.2 is another
//! source address than one bound to 127.0.0.1.

mod harness;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use velo_serve::work::auth::{GREETING_LEN, HANDSHAKE_TIMEOUT};
use velo_serve::work::{
    IntakeStats, MAX_HANDSHAKES, MAX_HANDSHAKES_PER_SOURCE, RequestAuth, WorkLimits, WorkRequest,
};

use harness::BOUND;
use harness::intake::{frame, greeting, request_numbered};

/// The stranger's address.
const STRANGER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
/// The frontend's address.
const FRONTEND: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// "Promptly": well within a handshake's bound, which is how long a frontend would otherwise
/// wait behind a silent connection.
const PROMPTLY: Duration = HANDSHAKE_TIMEOUT.saturating_sub(Duration::from_secs(3));

/// A worker's request plane without a secret: its counters, and the numbers of the requests
/// it delivered.
struct Intake {
    addr: SocketAddr,
    stats: Arc<IntakeStats>,
    delivered: mpsc::Receiver<u64>,
    stop: CancellationToken,
}

impl Intake {
    fn serve() -> Self {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let (tx, delivered) = mpsc::channel(16);
        let deliver = move |raw: Bytes| {
            let id = WorkRequest::decode(&raw).map_or(u64::MAX, |r| r.id);
            let _ = tx.try_send(id);
        };
        let (stats, stop) = (Arc::new(IntakeStats::default()), CancellationToken::new());
        tokio::spawn(velo_serve::work::serve(
            listener,
            WorkLimits::default(),
            RequestAuth::open(),
            stats.clone(),
            TaskTracker::new(),
            stop.clone(),
            deliver,
        ));
        Self {
            addr,
            stats,
            delivered,
            stop,
        }
    }

    /// A connection to the worker from `source`, saying nothing.
    async fn connect_from(&self, source: Ipv4Addr) -> TcpStream {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind((source, 0).into()).unwrap();
        tokio::time::timeout(BOUND, socket.connect(self.addr))
            .await
            .expect("the worker's kernel takes the connection")
            .unwrap()
    }

    /// A frontend from `source`: greets, reads the worker's greeting (both without a secret:
    /// the handshake is done), then sends request `id` and waits until it is delivered.
    async fn frontend_from(&mut self, source: Ipv4Addr, id: u64) -> TcpStream {
        let mut conn = self.connect_from(source).await;
        conn.write_all(&greeting(1, 0)).await.unwrap();
        let mut theirs = [0; GREETING_LEN];
        conn.read_exact(&mut theirs).await.unwrap();
        conn.write_all(&frame(&request_numbered(id))).await.unwrap();
        assert_eq!(self.delivered.recv().await, Some(id));
        conn
    }
}

/// The worker started the handshake of `conn`: its greeting (written first) arrives.
async fn handshake_started(conn: &mut TcpStream) {
    let mut theirs = [0; GREETING_LEN];
    tokio::time::timeout(BOUND, conn.read_exact(&mut theirs))
        .await
        .expect("the worker greets a connection holding a handshake place")
        .unwrap();
}

/// One address's silent connections hold at most its share of the handshake places: the next
/// is closed at once, unread and without a greeting, and counted; another address is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_past_its_handshake_share_is_closed_at_once_and_another_is_served() {
    let mut intake = Intake::serve();
    let mut held = Vec::new();
    for _ in 0..MAX_HANDSHAKES_PER_SOURCE {
        let mut conn = intake.connect_from(STRANGER).await;
        handshake_started(&mut conn).await;
        held.push(conn);
    }
    let mut extra = intake.connect_from(STRANGER).await;
    let mut byte = [0; 1];
    let end = tokio::time::timeout(PROMPTLY, extra.read(&mut byte))
        .await
        .expect("the connection past its source's share is closed at once, not held");
    assert!(
        matches!(end, Ok(0) | Err(_)),
        "the worker began a handshake past the source's share: {end:?}"
    );
    // The accept loop counts the refusal before it closes the socket.
    assert_eq!(
        intake
            .stats
            .handshakes_refused_per_source
            .load(Ordering::Relaxed),
        1
    );
    assert_eq!(intake.stats.handshakes_refused.load(Ordering::Relaxed), 1);
    let served = tokio::time::timeout(PROMPTLY, intake.frontend_from(FRONTEND, 7))
        .await
        .expect("a frontend from another address passes its handshake at once");
    drop((served, held));
    intake.stop.cancel();
}

/// A stranger opening as many silent connections as the worker has handshake places, all
/// from one address, no longer makes a frontend from another address wait for them to time
/// out: the address holds only its share, the rest are closed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_from_one_address_do_not_delay_a_frontend_from_another() {
    let mut intake = Intake::serve();
    let mut silent = Vec::new();
    for _ in 0..MAX_HANDSHAKES {
        silent.push(intake.connect_from(STRANGER).await);
    }
    let served = tokio::time::timeout(PROMPTLY, intake.frontend_from(FRONTEND, 9))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the frontend's handshake did not pass within {PROMPTLY:?}: it waited behind \
                 the {} silent connections of one address",
                silent.len()
            )
        });
    drop((served, silent));
    intake.stop.cancel();
}
