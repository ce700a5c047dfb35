//! The transport contract (feature `__contract`; test-only, never for users): the stories every
//! transport must pass, written once against this crate's seam and run by each transport's
//! tests, as response-plane's contract suite is for planes.
//!
//! A transport's tests implement [`Transport`]: make a frontend and a worker from velo-session's
//! settings, speak raw bytes to an address (a peer of another version, garbage, a silent or
//! half-open peer), listen for raw lanes (a frontend of another version), and name an address
//! where nothing listens. Then one line expands a `#[tokio::test]` per story:
//!
//! ```ignore
//! velo_session::transport_contract!(tcp => Tcp);
//! ```
//!
//! Every story is a plain `pub async fn` taking the transport, so a transport that must run
//! one elsewhere (in a process of its own) calls it there and leaves it out of the macro with a
//! reason.
//!
//! # Timing
//!
//! Stories run in real time on a multi-thread runtime (real sockets cannot run on a paused
//! clock). No story sleeps to synchronise: every wait is for an event, bounded by [`BOUND`], or
//! a bounded poll of a condition. An upper bound on elapsed time is a configured bound plus
//! [`SLACK`] (a loaded machine runs late, never early); a lower bound is measured from before
//! the frontend could have started its timer.

mod auth;
mod connections;
mod delivery;
mod handshake;
mod harness;
mod raw;
mod streams;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::TaskTracker;
use velo_mux::MuxConfig;
use velo_wire::{InstanceId, Token};

use crate::{
    AcceptSettings, Acceptor, CLOSE_GRACE, FrontendEndpoint, HandshakeStats, WorkerEndpoint,
    WorkerSettings,
};

pub use auth::{
    a_forged_proof_is_refused_before_any_stream_state,
    a_secret_on_the_worker_only_is_refused_as_a_misconfiguration,
    a_worker_proving_the_cluster_secret_is_served,
    a_worker_without_the_right_secret_is_refused_on_both_sides,
    silent_handshakes_past_their_budget_are_refused_and_workers_still_served,
};
pub use connections::{
    a_failed_preparation_fails_fast_during_its_backoff_then_retries,
    a_frontend_restarted_under_a_new_instance_id_is_prepared_again,
    concurrent_first_requests_share_one_preparation,
};
pub use delivery::{
    a_finish_succeeds_once_taken_and_fails_when_refused,
    a_finish_the_frontend_never_took_fails_when_the_frontend_dies,
    a_stream_lost_before_the_frontend_took_it_is_announced_again,
};
pub use handshake::{
    a_peer_silent_after_its_handshake_is_closed_by_the_idle_timer,
    a_peer_that_never_speaks_is_dropped_without_stalling_others,
    a_version_mismatch_is_refused_with_a_clear_error_on_both_sides,
    a_worker_holding_another_instance_id_is_refused_as_identity_mismatch,
    garbage_bytes_close_that_lane_and_the_listener_keeps_serving, handshaken_by_hand,
    shutdown_ends_every_task_within_its_bound_despite_half_open_connections,
};
pub use harness::{
    Inbox, eventually, frontend, frontend_mux, frontend_with, next_item, open, send_now,
    start_frontend, take, within, worker, worker_settings,
};
pub use raw::{IoLane, RawListener, RawPeer, hello_bytes, read_close, read_frame, worker_hello};
pub use streams::{
    a_frontend_that_aborts_ends_the_worker_streams_as_lost_exactly_once,
    a_handle_that_read_a_burst_and_the_end_keeps_little_buffer,
    a_thousand_streams_of_a_hundred_items_arrive_in_order,
    a_worker_that_dies_mid_stream_ends_its_streams_as_lost_exactly_once,
    large_items_keep_their_order_among_small_ones, responses_use_four_lanes,
};

/// Every wait in a story is bounded by this much time; a story that waits longer fails.
pub const BOUND: Duration = Duration::from_secs(20);

/// Added to a configured bound when a story checks that something happened within it: a
/// loaded machine may run a story late, never early.
pub const SLACK: Duration = Duration::from_secs(5);

/// The prologue of every stream a story opens.
pub const PROLOGUE: &[u8] = br#"{"error":null}"#;

/// The stream address secret of every stream a story opens (the inbox takes every stream).
pub const TOKEN: Token = Token([0; 16]);

/// A transport as the contract drives it. One value per story ([`Default`]); cloned into the
/// tasks and runtimes a story starts.
pub trait Transport: Clone + Default + Send + Sync + 'static {
    /// A running frontend.
    type Frontend: Frontend;
    /// A worker.
    type Worker: Worker;
    /// A lane this side speaks by hand, without velo's handshake.
    type Raw: RawPeer;
    /// A listener for raw lanes (a frontend played by hand).
    type RawListener: RawListener<Lane = Self::Raw>;

    /// Starts a frontend as `spec` says (its mux, accept bounds, secret), accepting on
    /// `spec.tracker`.
    ///
    /// # Errors
    ///
    /// Binding failed (a story restarting a frontend retries while its address is taken).
    fn frontend(
        &self,
        spec: FrontendSpec,
    ) -> impl Future<Output = io::Result<Self::Frontend>> + Send;

    /// A worker with `settings` (a transport applies at least the mux configuration, backoff,
    /// read buffer, handshake timeout, secret and worker instance), running its tasks on
    /// `tracker`.
    fn worker(&self, settings: WorkerSettings, tracker: &TaskTracker) -> Self::Worker;

    /// Opens a raw lane to `addr`. Whatever the transport runs for it stays off the story's
    /// trackers, so a story can hold raw lanes open while it waits for its own tasks to end.
    ///
    /// # Errors
    ///
    /// The transport's, when it fails at once (most failures arrive later, on the lane).
    fn dial_raw(&self, addr: SocketAddr) -> impl Future<Output = io::Result<Self::Raw>> + Send;

    /// Listens for raw lanes at an address of the transport's choosing.
    ///
    /// # Errors
    ///
    /// The transport could not listen.
    fn listen_raw(&self) -> impl Future<Output = io::Result<Self::RawListener>> + Send;

    /// An address where nothing listens, for as long as the result is held.
    fn unreachable(&self) -> Unreachable;

    /// How long shutting a frontend down, closing a worker and every task of theirs ending may
    /// take by configuration (the story adds [`SLACK`]). Velo-session's own bound by default:
    /// a closing lane's writer gets [`CLOSE_GRACE`].
    fn shutdown_bound(&self) -> Duration {
        CLOSE_GRACE
    }
}

/// A running frontend, as the stories use it.
pub trait Frontend: Send + Sync + 'static {
    /// Its endpoint.
    fn endpoint(&self) -> &FrontendEndpoint;

    /// Where workers reach it.
    fn addr(&self) -> SocketAddr;

    /// The handshake counters of its accept loop.
    fn handshake_stats(&self) -> HandshakeStats;

    /// Stops accepting and closes every lane gracefully (the transport's shutdown).
    fn shutdown(&self) -> impl Future<Output = ()> + Send;

    /// Stops everything at once (the transport's abort).
    fn abort(&self);

    /// Its instance id.
    fn instance(&self) -> InstanceId {
        self.endpoint().instance()
    }
}

/// A worker, as the stories use it.
pub trait Worker: Clone + Send + Sync + 'static {
    /// Its endpoint.
    fn endpoint(&self) -> &WorkerEndpoint;

    /// Closes every connection and lets whatever the transport runs for the worker end.
    fn close(&self);
}

/// A worker that is velo-session's endpoint and nothing more.
impl Worker for WorkerEndpoint {
    fn endpoint(&self) -> &WorkerEndpoint {
        self
    }

    fn close(&self) {
        Self::close(self);
    }
}

/// What a story asks of a frontend.
pub struct FrontendSpec {
    /// The mux configuration (frontend side).
    pub mux: MuxConfig,
    /// The accept loop's bounds.
    pub accept: AcceptSettings,
    /// Where incoming streams go.
    pub acceptor: Arc<dyn Acceptor>,
    /// Where its tasks run.
    pub tracker: TaskTracker,
    /// Its instance id.
    pub instance: InstanceId,
    /// Where to listen: `None` for any free address, `Some` for that one (a restart).
    pub addr: Option<SocketAddr>,
    /// The cluster secret workers must prove, if any.
    pub secret: Option<crate::ClusterSecret>,
}

/// An address where nothing listens while this is held.
pub struct Unreachable {
    /// The address.
    pub addr: SocketAddr,
    /// Whatever keeps the address unused (dropped with this).
    pub guard: Box<dyn std::any::Any + Send>,
}

impl Unreachable {
    /// A loopback TCP port that is bound (without `SO_REUSEADDR`) and never listens, so no
    /// other test can take it and every connection to it is refused.
    ///
    /// # Panics
    ///
    /// If no socket can be bound on loopback.
    pub fn loopback_port() -> Self {
        let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
        socket
            .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .expect("a loopback port");
        let addr = socket.local_addr().expect("a bound socket's address");
        Self {
            addr,
            guard: Box::new(socket),
        }
    }
}

/// Expands one `#[tokio::test]` per contract story for a transport, in module `$module`:
/// `transport_contract!(tcp => Tcp)`. Stories a transport must run elsewhere are left out by
/// name, each with its reason (the name is checked):
/// `transport_contract!(ucx => Ucx; except { a_story: "why" })`.
///
/// The calling crate needs tokio with `macros` and `rt-multi-thread`.
#[doc(hidden)]
#[macro_export]
macro_rules! transport_contract {
    ($module:ident => $transport:ty) => {
        $crate::transport_contract!($module => $transport; except {});
    };
    ($module:ident => $transport:ty; except { $($skipped:ident: $why:literal),* $(,)? }) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;

            macro_rules! story {
                $(($skipped) => {
                    const _: () = {
                        let _run_elsewhere = $crate::contract::$skipped::<$transport>;
                        let _because: &str = $why;
                    };
                };)*
                ($story:ident) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $story() {
                        $crate::contract::$story(<$transport as ::core::default::Default>::default())
                            .await;
                    }
                };
            }

            story!(responses_use_four_lanes);
            story!(a_version_mismatch_is_refused_with_a_clear_error_on_both_sides);
            story!(a_worker_holding_another_instance_id_is_refused_as_identity_mismatch);
            story!(garbage_bytes_close_that_lane_and_the_listener_keeps_serving);
            story!(a_peer_that_never_speaks_is_dropped_without_stalling_others);
            story!(a_worker_that_dies_mid_stream_ends_its_streams_as_lost_exactly_once);
            story!(a_frontend_that_aborts_ends_the_worker_streams_as_lost_exactly_once);
            story!(a_frontend_restarted_under_a_new_instance_id_is_prepared_again);
            story!(concurrent_first_requests_share_one_preparation);
            story!(a_failed_preparation_fails_fast_during_its_backoff_then_retries);
            story!(shutdown_ends_every_task_within_its_bound_despite_half_open_connections);
            story!(a_peer_silent_after_its_handshake_is_closed_by_the_idle_timer);
            story!(a_thousand_streams_of_a_hundred_items_arrive_in_order);
            story!(large_items_keep_their_order_among_small_ones);
            story!(a_handle_that_read_a_burst_and_the_end_keeps_little_buffer);
            story!(a_finish_the_frontend_never_took_fails_when_the_frontend_dies);
            story!(a_finish_succeeds_once_taken_and_fails_when_refused);
            story!(a_stream_lost_before_the_frontend_took_it_is_announced_again);
            story!(a_worker_proving_the_cluster_secret_is_served);
            story!(a_worker_without_the_right_secret_is_refused_on_both_sides);
            story!(a_secret_on_the_worker_only_is_refused_as_a_misconfiguration);
            story!(a_forged_proof_is_refused_before_any_stream_state);
            story!(silent_handshakes_past_their_budget_are_refused_and_workers_still_served);
        }
    };
}
