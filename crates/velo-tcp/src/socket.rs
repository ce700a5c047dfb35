//! Socket options, applied before data flows.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpSocket;

use crate::TcpConfig;

/// Unanswered keepalive probes after which the kernel gives up on a connection.
const KEEPALIVE_PROBES: u32 = 3;

/// A socket for `addr`'s family with the configured buffer sizes and liveness bound, ready
/// to connect or bind.
pub(crate) fn socket(addr: SocketAddr, cfg: &TcpConfig) -> io::Result<TcpSocket> {
    let sock = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(n) = cfg.send_buffer() {
        sock.set_send_buffer_size(n)?;
    }
    if let Some(n) = cfg.recv_buffer() {
        sock.set_recv_buffer_size(n)?;
    }
    sock.set_nodelay(true)?;
    set_liveness(SockRef::from(&sock), cfg.liveness())?;
    Ok(sock)
}

/// Bounds how long the kernel keeps a connection whose peer vanished: unacknowledged data
/// for longer than `bound` resets it (`TCP_USER_TIMEOUT`), and so does an idle connection
/// whose keepalive probes, sent from a third of `bound` on, go unanswered. The mux's own
/// idle and write-stall timeouts catch the same faults above TCP; this makes the socket give
/// up too instead of retransmitting for ~15 minutes.
pub(crate) fn set_liveness(sock: SockRef<'_>, bound: Option<Duration>) -> io::Result<()> {
    let Some(bound) = bound else {
        return Ok(());
    };
    // Keepalive times are whole seconds in the kernel.
    let idle = (bound / 3).max(Duration::from_secs(1));
    let interval = (bound / (3 * KEEPALIVE_PROBES)).max(Duration::from_secs(1));
    sock.set_tcp_keepalive(
        &TcpKeepalive::new()
            .with_time(idle)
            .with_interval(interval)
            .with_retries(KEEPALIVE_PROBES),
    )?;
    sock.set_tcp_user_timeout(Some(bound))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_sockets_give_up_on_a_vanished_peer_within_the_liveness_bound() {
        let cfg = TcpConfig::builder()
            .liveness(Some(Duration::from_secs(10)))
            .build()
            .unwrap();
        let sock = socket("127.0.0.1:0".parse().unwrap(), &cfg).unwrap();
        let s = SockRef::from(&sock);
        assert_eq!(s.tcp_user_timeout().unwrap(), Some(Duration::from_secs(10)));
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), Duration::from_secs(3));
        assert_eq!(s.tcp_keepalive_retries().unwrap(), KEEPALIVE_PROBES);

        let off = TcpConfig::builder().liveness(None).build().unwrap();
        let sock = socket("127.0.0.1:0".parse().unwrap(), &off).unwrap();
        assert_eq!(SockRef::from(&sock).tcp_user_timeout().unwrap(), None);
    }
}
