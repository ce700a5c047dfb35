//! The handshake budget against a flood of silent strangers, on real loopback sockets. A
//! binary of its own: its hundreds of connections would disturb the kernel's connection table
//! that `loopback.rs` reads (a table read while it changes can list an entry twice).

mod common;

use common::Tcp;
use tokio_util::task::TaskTracker;
use velo_session::contract::{self, Frontend};

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
