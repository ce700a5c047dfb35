//! The worker's UCX dialer: a UCX endpoint to the frontend's listener, as a raw lane
//! (velo-session runs the handshake; an unreachable frontend shows up as the lane failing
//! while the handshake waits, within its deadline).

use std::io;
use std::net::SocketAddr;

use futures::FutureExt;
use futures::future::BoxFuture;
use velo_session::{Dialer, RawLane};

use crate::driver::{ConnectFailure, Handle};

pub(crate) struct UcxDialer {
    pub(crate) handle: Handle,
}

impl Dialer for UcxDialer {
    fn dial(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<Box<dyn RawLane>>> {
        let handle = self.handle.clone();
        async move {
            match handle.connect(addr).await {
                Ok(lane) => Ok(Box::new(lane) as Box<dyn RawLane>),
                Err(e @ ConnectFailure::Stopped) => {
                    Err(io::Error::new(io::ErrorKind::ConnectionAborted, e))
                }
                Err(e @ ConnectFailure::Ucx { .. }) => {
                    Err(io::Error::new(io::ErrorKind::ConnectionRefused, e))
                }
            }
        }
        .boxed()
    }
}
