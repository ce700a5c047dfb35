//! Dialing a lane: connect, HELLO, answer.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::BytesMut;
use futures::FutureExt;
use futures::future::BoxFuture;
use velo_mux::handshake::Expect;
use velo_session::{ConnectError, Connector, LaneIo};
use velo_wire::{Frame, Hello};

use crate::handshake::{ReadError, read_frame, write_hello};
use crate::stats::Counters;
use crate::{TcpConfig, io, socket};

/// The worker's [`Connector`] over TCP.
pub(crate) struct TcpConnector {
    pub(crate) cfg: TcpConfig,
    pub(crate) counters: Arc<Counters>,
}

impl Connector for TcpConnector {
    fn connect_lane(
        &self,
        addr: SocketAddr,
        hello: Hello,
        expect: Expect,
    ) -> BoxFuture<'static, Result<(Hello, LaneIo), ConnectError>> {
        let cfg = self.cfg.clone();
        let counters = self.counters.clone();
        async move {
            let r = dial(addr, hello, expect, &cfg).await;
            match &r {
                Ok(_) => counters.lanes_dialed.inc(),
                Err(_) => counters.dial_failures.inc(),
            }
            r
        }
        .boxed()
    }
}

async fn dial(
    addr: SocketAddr,
    hello: Hello,
    expect: Expect,
    cfg: &TcpConfig,
) -> Result<(Hello, LaneIo), ConnectError> {
    let where_ = addr.to_string();
    let io_err = |e: std::io::Error| ConnectError::Io {
        addr: where_.clone(),
        source: Arc::new(e),
    };
    let sock = socket::socket(addr, cfg).map_err(io_err)?;
    let mut stream = tokio::time::timeout(cfg.connect_timeout, sock.connect(addr))
        .await
        .map_err(|_| ConnectError::Timeout {
            addr: where_.clone(),
            timeout: cfg.connect_timeout,
        })?
        .map_err(io_err)?;
    let handshake = async {
        write_hello(&mut stream, hello).await.map_err(io_err)?;
        let mut buf = BytesMut::with_capacity(256);
        let frame = read_frame(&mut stream, &mut buf)
            .await
            .map_err(|e| match e {
                ReadError::Io(e) => io_err(e),
                ReadError::Wire(source) => ConnectError::Wire {
                    addr: where_.clone(),
                    source,
                },
                ReadError::Eof => io_err(std::io::ErrorKind::UnexpectedEof.into()),
            })?;
        match frame {
            Frame::Hello(answer) => {
                expect
                    .check(&answer)
                    .map_err(|source| ConnectError::Handshake {
                        addr: where_.clone(),
                        source,
                    })?;
                Ok((answer, buf))
            }
            Frame::Close(close) => Err(ConnectError::Refused {
                addr: where_.clone(),
                code: close.code,
                reason: close.reason,
            }),
            Frame::Batch(_) => Err(ConnectError::Wire {
                addr: where_.clone(),
                source: velo_wire::WireError::InvalidField {
                    field: "handshake",
                    reason: "expected HELLO or CLOSE",
                },
            }),
        }
    };
    let (answer, leftover) = tokio::time::timeout(cfg.handshake_timeout, handshake)
        .await
        .map_err(|_| ConnectError::Timeout {
            addr: where_.clone(),
            timeout: cfg.handshake_timeout,
        })??;
    Ok((answer, io::lane_io(stream, leftover, None)))
}
