//! The classic plane, as Dynamo ships it by default: one TCP connection per response stream,
//! dialed by the worker, one write per item, a sentinel at the end.
//!
//! It is the baseline every benchmark compares against, so it is built honestly: correct,
//! `TCP_NODELAY` like the original, no batching, no pooling, nothing the classic design does
//! not do, except that nothing here waits for ever: every connection gives up on a vanished
//! peer within the plane's liveness bound (`socket.rs`), and the worker's watcher tasks end
//! when the plane closes or a while after their stream did.

mod conn;
pub(crate) mod frame;
mod frontend;
mod mismatch;
mod socket;
mod worker;

pub(crate) use frontend::{
    Accept, CLASSIC_HANDSHAKES, CLASSIC_HANDSHAKES_PER_SOURCE, ClassicFrontend, ClassicReader,
    Incoming,
};
pub(crate) use worker::{ClassicControl, ClassicDialer, ClassicWriter};
