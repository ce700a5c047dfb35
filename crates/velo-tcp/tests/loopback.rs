//! What only TCP shows, on real loopback sockets (the stories every transport shares are the
//! contract suite, `contract.rs`). Every wait is bounded.

mod common;

use common::{Tcp, established_connections};
use tokio_util::task::TaskTracker;
use velo_session::contract::{self, Frontend};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_is_four_established_tcp_connections() {
    let tracker = TaskTracker::new();
    let (frontend, mut inbox) = contract::frontend(&Tcp, &tracker).await;
    let worker = contract::worker(&Tcp, &tracker);
    let mut s = contract::open(&worker, &frontend, 1).await;
    contract::send_now(&mut s, b"item").await;
    let mut r = contract::take(&mut inbox).await;
    assert_eq!(contract::next_item(&mut r).await, &b"item"[..]);
    // The kernel's view: exactly four established connections to the listener, one per lane.
    assert_eq!(established_connections(frontend.addr()), 4);
}

/// Silent strangers from four addresses take every place of the handshake budget (64 each,
/// 256 in all) and keep them: a worker dialing now still gets in, by taking the place of the
/// oldest stranger of a source holding the most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_strangers_from_a_few_addresses_do_not_lock_a_new_worker_out() {
    use std::net::SocketAddr;
    use std::time::Duration;

    let tracker = TaskTracker::new();
    let (frontend, _inbox) = contract::frontend(&Tcp, &tracker).await;
    let mut strangers = Vec::new();
    for source in 2..=5u8 {
        for _ in 0..64 {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket
                .bind(SocketAddr::from(([127, 0, 0, source], 0)))
                .unwrap();
            strangers.push(socket.connect(frontend.addr()).await.unwrap());
        }
    }
    // Bounded polling: the accept loop has taken all 256 into the budget.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while frontend.handshake_stats().connections_accepted < 256 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the strangers are accepted"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let worker = contract::worker(&Tcp, &tracker);
    let opened = tokio::time::timeout(
        Duration::from_secs(30),
        worker.open(
            frontend.addr(),
            frontend.instance(),
            1,
            &contract::TOKEN,
            contract::PROLOGUE,
        ),
    )
    .await
    .expect("the open resolves");
    assert!(
        opened.is_ok(),
        "a new worker is locked out: {:?}",
        opened.err()
    );
    assert!(frontend.handshake_stats().handshakes_evicted >= 1);
    drop(strangers);
}
