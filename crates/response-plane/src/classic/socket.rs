//! Socket options of classic connections, on both sides.

use std::io;
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpStream;

/// Unanswered keepalive probes after which the kernel gives up on a connection.
const KEEPALIVE_PROBES: u32 = 3;

/// Bounds how long the kernel keeps a classic connection whose peer vanished (no FIN, no
/// RST: a host that lost power, a partition): unacknowledged data for longer than `bound`
/// resets it (`TCP_USER_TIMEOUT`), and so does an idle connection whose keepalive probes,
/// sent from a third of `bound` on, go unanswered. A peer that is alive but quiet (a long
/// prefill) answers the probes and is never cut. `TCP_USER_TIMEOUT` also ends a connection
/// whose peer keeps its window closed for `bound`: a frontend application that stops reading
/// a classic stream for longer than the bound loses it (`Disconnected` on both sides), the
/// price of noticing a vanished frontend within the bound while its worker sends.
///
/// The velo plane's lanes get the same bound (the plane's `idle_timeout`) from velo-tcp.
pub(crate) fn set_liveness(stream: &TcpStream, bound: Duration) -> io::Result<()> {
    let sock = SockRef::from(stream);
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

/// Asserts that `stream` gives up on a vanished peer within `bound`.
#[cfg(test)]
pub(crate) fn assert_liveness(stream: &TcpStream, bound: Duration) {
    let s = SockRef::from(stream);
    assert_eq!(s.tcp_user_timeout().unwrap(), Some(bound));
    assert!(s.keepalive().unwrap(), "keepalive is on");
    let idle = (bound / 3).max(Duration::from_secs(1));
    assert_eq!(s.tcp_keepalive_time().unwrap().as_secs(), idle.as_secs());
    assert_eq!(s.tcp_keepalive_retries().unwrap(), KEEPALIVE_PROBES);
}
