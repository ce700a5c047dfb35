//! Socket options, applied before data flows.

use std::io;
use std::net::SocketAddr;

use tokio::net::TcpSocket;

use crate::TcpConfig;

/// A socket for `addr`'s family with the configured buffer sizes, ready to connect or bind.
pub(crate) fn socket(addr: SocketAddr, cfg: &TcpConfig) -> io::Result<TcpSocket> {
    let sock = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(n) = cfg.send_buffer {
        sock.set_send_buffer_size(n)?;
    }
    if let Some(n) = cfg.recv_buffer {
        sock.set_recv_buffer_size(n)?;
    }
    sock.set_nodelay(true)?;
    Ok(sock)
}
