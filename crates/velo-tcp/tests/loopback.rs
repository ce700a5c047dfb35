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
