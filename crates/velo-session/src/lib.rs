//! The async glue every velo transport shares: a connection's mux behind one lock, the
//! stream handles applications hold, the lane tasks that move bytes, and the endpoints that
//! prepare and accept connections.
//!
//! # Layer contract
//!
//! Below: `velo-mux` (the sans-IO state machine) and `velo-wire`. Above: the transports
//! (`velo-tcp`, `velo-ucx`), which only provide lane I/O ([`LaneRead`], [`LaneWrite`]), a
//! [`Connector`] for workers, and an accept path that calls
//! [`FrontendEndpoint::attach_lane`]. This crate never opens a socket or names a transport.
//! It never spawns a task of its own accord: lane tasks go on the [`TaskTracker`] the caller
//! passes in, so the runtime can account for and bound every one of them.
//!
//! # Main types
//!
//! - [`WorkerEndpoint`]: prepares one connection per frontend instance (shared by every
//!   stream to it) and opens [`SendStream`]s.
//! - [`FrontendEndpoint`]: attaches lanes from workers and hands every opened stream to an
//!   [`Acceptor`] as an [`IncomingStream`], which becomes a [`RecvStream`].
//! - [`Peer`]: one connection; [`Peer::flush`] is the once-per-forward-pass hint.
//!
//! [`TaskTracker`]: tokio_util::task::TaskTracker

mod clock;
mod error;
mod frontend;
mod io;
mod peer;
mod pump;
mod recv;
mod send;
mod worker;

pub use error::{ConnectError, StreamError};
pub use frontend::{AttachError, FrontendEndpoint, FrontendSettings, add_stats};
pub use io::{LaneIo, LaneRead, LaneWrite};
pub use peer::{Acceptor, Peer};
pub use pump::CLOSE_GRACE;
pub use recv::{IncomingStream, RecvStream};
pub use send::{SendStream, StreamWatch};
pub use worker::{
    Backoff, Connector, DEFAULT_PREPARE_TIMEOUT, DEFAULT_READ_BUFFER, OpenStreamError,
    WorkerEndpoint, WorkerSettings, open_on, open_when_room,
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
