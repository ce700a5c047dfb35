//! The worker's TCP dialer: a socket with its options set before `connect`, under the
//! connect timeout (velo-session runs the handshake).

use std::io;
use std::net::SocketAddr;

use futures::FutureExt;
use futures::future::BoxFuture;
use velo_session::{Dialer, RawLane};

use crate::lane::tcp_lane;
use crate::{TcpConfig, socket};

pub(crate) struct TcpDialer {
    pub(crate) cfg: TcpConfig,
}

impl Dialer for TcpDialer {
    fn dial(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<Box<dyn RawLane>>> {
        let cfg = self.cfg.clone();
        async move {
            let sock = socket::socket(addr, &cfg)?;
            let stream = tokio::time::timeout(cfg.connect_timeout, sock.connect(addr))
                .await
                .map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no TCP connection within {:?}", cfg.connect_timeout),
                    )
                })??;
            Ok(Box::new(tcp_lane(stream)) as Box<dyn RawLane>)
        }
        .boxed()
    }
}
