//! The async glue every velo transport shares: a connection's mux behind one lock, the
//! stream handles applications hold, the lane tasks that move bytes, the v3 handshake, and
//! the endpoints that dial, accept and prepare connections.
//!
//! # Layer contract
//!
//! Below: `velo-mux` (the sans-IO state machine) and `velo-wire`. Above: the transports
//! (`velo-tcp`, `velo-ucx`), which provide only bytes: a [`RawLane`] (one connection, read
//! and written poll by poll), a [`LaneListener`] that yields them to a frontend and a
//! [`Dialer`] that opens them for a worker ([`StreamLane`] makes any tokio byte stream a
//! lane), and carry [`SessionSettings`] in their configuration. Everything else is here, once
//! for every transport: the HELLO/CLOSE exchange and its checks, the accept loop with its connection
//! limit and handshake deadline, dialing a connection's lanes, the handshake counters, the
//! pumps and the timers. This crate never opens a socket or names a transport. It never
//! spawns a task of its own accord: every task goes on the [`TaskTracker`] the caller passes
//! in, so the runtime can account for and bound every one of them.
//!
//! # Main types
//!
//! - [`WorkerEndpoint`]: prepares one connection per frontend (shared by every stream to it)
//!   and opens [`SendStream`]s.
//! - [`FrontendEndpoint`]: accepts lanes ([`FrontendEndpoint::accept`]) and hands every
//!   stream they open to an [`Acceptor`] as an [`IncomingStream`], which becomes a
//!   [`RecvStream`].
//! - [`ListeningFrontend`]: a frontend endpoint serving the lanes of one transport's
//!   [`LaneListener`], with the address workers reach; every transport's frontend is one.
//! - [`Peer`]: one connection; [`Peer::flush`] is the once-per-forward-pass hint.
//!
//! [`TaskTracker`]: tokio_util::task::TaskTracker

mod accept;
mod auth;
#[cfg(feature = "__bench")]
#[doc(hidden)]
pub mod bench;
mod budget;
mod builder;
mod clock;
#[cfg(feature = "__contract")]
#[doc(hidden)]
pub mod contract;
mod dial;
mod error;
mod frontend;
#[cfg(feature = "__fuzz")]
#[doc(hidden)]
pub mod fuzzing;
mod handshake;
mod io;
mod listening;
mod mailbox;
mod peer;
mod pump;
mod recv;
mod send;
mod settings;
mod stats;
mod stream;
mod wake_list;
mod worker;

pub use accept::{
    AcceptSettings, Accepting, DEFAULT_ESTABLISH_TIMEOUT, DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_HANDSHAKES, DEFAULT_MAX_HANDSHAKES_PER_SOURCE,
};
pub use auth::{ClusterSecret, MAX_SECRET_LEN, MIN_SECRET_LEN, SecretError};
pub use budget::{Exhausted, HandshakeBudget, HandshakeTicket};
pub use error::{ConnectError, StreamError};
pub use frontend::{ATTACH_ATTEMPTS, AttachError, FrontendEndpoint, FrontendSettings};
pub use handshake::{HANDSHAKE_MAX_FRAME, REFUSE_TIMEOUT};
pub use io::{
    Dialer, EstablishError, LaneIo, LaneListener, LaneRead, LaneWrite, RawLane, TLS_REQUIRED_REASON,
};
pub use listening::{FrontendParts, ListeningFrontend, TransportControl};
pub use peer::{Acceptor, Peer};
pub use pump::CLOSE_GRACE;
pub use recv::{IncomingStream, RecvStream};
pub use send::{SendStream, StreamWatch};
pub use settings::{SessionSettings, SessionSettingsBuilder};
pub use stats::HandshakeStats;
pub use stream::{StreamLane, poll_write_chunks};
/// What a configuration builder of this crate (and of the transports above it) refuses.
pub use velo_mux::ConfigError;
pub use worker::{
    Backoff, DEFAULT_PREPARE_TIMEOUT, DEFAULT_READ_BUFFER, OpenStreamError, WorkerEndpoint,
    WorkerSettings, open_on, open_when_room,
};

/// A fresh random instance id (never zero).
pub fn new_instance_id() -> velo_wire::InstanceId {
    loop {
        let v: u128 = rand::random();
        if v != 0 {
            return velo_wire::InstanceId::from_u128(v);
        }
    }
}
