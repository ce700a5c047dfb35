//! The worker's TCP dialer: a socket with its options set before `connect`, under the
//! connect timeout (velo-session runs the handshake).

use std::io;
use std::net::SocketAddr;

use velo_session::RawLane;

use crate::lane::tcp_lane;
use crate::{TcpConfig, socket, tls};

/// Connects one lane to `addr` as `cfg` says.
pub(crate) async fn dial(cfg: TcpConfig, addr: SocketAddr) -> io::Result<Box<dyn RawLane>> {
    let sock = socket::socket(addr, &cfg)?;
    let stream = tokio::time::timeout(cfg.connect_timeout(), sock.connect(addr))
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no TCP connection within {:?}", cfg.connect_timeout()),
            )
        })??;
    match cfg.tls_client() {
        None => Ok(Box::new(tcp_lane(stream))),
        Some(tls) => Ok(Box::new(tls::connect(stream, addr, tls).await?)),
    }
}
