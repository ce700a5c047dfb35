//! The worker's UCX dialer: a UCX endpoint to the frontend's listener, as a raw lane
//! (velo-session runs the handshake; an unreachable frontend shows up as the lane failing
//! while the handshake waits, within its deadline).

use std::io;
use std::net::SocketAddr;

use velo_session::RawLane;

use crate::driver::{ConnectFailure, Handle};

/// Connects one lane to `addr` through the driver behind `handle`.
pub(crate) async fn dial(handle: Handle, addr: SocketAddr) -> io::Result<Box<dyn RawLane>> {
    match handle.connect(addr).await {
        Ok(lane) => Ok(Box::new(lane)),
        Err(e @ ConnectFailure::Stopped) => {
            Err(io::Error::new(io::ErrorKind::ConnectionAborted, e))
        }
        Err(e @ ConnectFailure::Ucx { .. }) => {
            Err(io::Error::new(io::ErrorKind::ConnectionRefused, e))
        }
    }
}
