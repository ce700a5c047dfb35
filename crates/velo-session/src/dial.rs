//! The worker's side of connecting one lane: the transport dials, then the v3 handshake,
//! under one deadline (some transports, UCX among them, report an unreachable peer only as
//! the lane failing while the handshake waits).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use velo_mux::handshake::Expect;
use velo_wire::{Hello, WireError};

use crate::ConnectError;
use crate::auth::ClusterSecret;
use crate::handshake::{DialHandshakeError, dial_handshake};
use crate::io::{Dialer, LaneIo, handshaken};
use crate::stats::HandshakeCounters;

/// Dials lanes through a transport and runs their handshakes.
pub(crate) struct Connector {
    pub(crate) dialer: Arc<dyn Dialer>,
    pub(crate) secret: Option<ClusterSecret>,
    pub(crate) handshake_timeout: Duration,
    pub(crate) counters: Arc<HandshakeCounters>,
}

impl Connector {
    /// Connects to `addr`, sends `hello`, reads the frontend's answer and checks it with
    /// `expect`. Returns the frontend's HELLO and the lane's halves.
    pub(crate) async fn connect_lane(
        &self,
        addr: SocketAddr,
        hello: Hello,
        expect: Expect,
    ) -> Result<(Hello, LaneIo), ConnectError> {
        let timeout = self.handshake_timeout;
        let r = tokio::time::timeout(timeout, self.dial(addr, hello, expect))
            .await
            .unwrap_or(Err(ConnectError::Timeout { addr, timeout }));
        match &r {
            Ok(_) => self.counters.lanes_dialed.inc(),
            Err(_) => self.counters.dial_failures.inc(),
        }
        r
    }

    async fn dial(
        &self,
        addr: SocketAddr,
        hello: Hello,
        expect: Expect,
    ) -> Result<(Hello, LaneIo), ConnectError> {
        let io = |source: std::io::Error| ConnectError::Io {
            addr,
            source: Arc::new(source),
        };
        let mut lane = self.dialer.dial(addr).await.map_err(io)?;
        let secret = self.secret.as_ref();
        let (answer, leftover) = dial_handshake(&mut *lane, hello, expect, secret)
            .await
            .map_err(|e| match e {
                DialHandshakeError::Io(e) => io(e),
                DialHandshakeError::Eof => io(std::io::ErrorKind::UnexpectedEof.into()),
                DialHandshakeError::Wire(source) => ConnectError::Wire { addr, source },
                DialHandshakeError::UnexpectedFrame => ConnectError::Wire {
                    addr,
                    source: WireError::InvalidField {
                        field: "handshake",
                        reason: "expected HELLO or CLOSE",
                    },
                },
                DialHandshakeError::Refused(close) => ConnectError::Refused {
                    addr,
                    code: close.code,
                    reason: close.reason,
                },
                DialHandshakeError::Handshake(source) => ConnectError::Handshake { addr, source },
                DialHandshakeError::Unauthenticated(reason) => {
                    ConnectError::Unauthenticated { addr, reason }
                }
            })?;
        Ok((answer, handshaken(lane, leftover, None)))
    }
}
