//! Dialing a lane: UCX connect, HELLO, answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use futures::FutureExt;
use futures::future::BoxFuture;
use velo_mux::handshake::Expect;
use velo_session::{ConnectError, Connector, LaneIo};
use velo_wire::{Frame, Hello};

use crate::driver::Handle;
use crate::handshake::{ReadError, read_frame, write_hello};
use crate::stats::Counters;

/// The worker's [`Connector`] over UCX.
pub(crate) struct UcxConnector {
    pub(crate) handle: Handle,
    pub(crate) handshake_timeout: Duration,
    pub(crate) counters: Arc<Counters>,
}

impl Connector for UcxConnector {
    fn connect_lane(
        &self,
        addr: SocketAddr,
        hello: Hello,
        expect: Expect,
    ) -> BoxFuture<'static, Result<(Hello, LaneIo), ConnectError>> {
        let handle = self.handle.clone();
        let timeout = self.handshake_timeout;
        let counters = self.counters.clone();
        async move {
            let r = dial(&handle, addr, hello, expect, timeout).await;
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
    handle: &Handle,
    addr: SocketAddr,
    hello: Hello,
    expect: Expect,
    timeout: Duration,
) -> Result<(Hello, LaneIo), ConnectError> {
    let where_ = addr.to_string();
    let transport = |reason: String| ConnectError::Transport {
        addr: where_.clone(),
        reason,
    };
    // UCX connects asynchronously: an unreachable or refusing frontend shows up as the lane
    // failing while we wait for its answer, so one bound covers connect and handshake.
    let handshake = async {
        let mut lane = handle.connect(addr).await.map_err(&transport)?;
        write_hello(&mut lane, hello)
            .await
            .map_err(|e| transport(e.to_string()))?;
        let mut buf = BytesMut::with_capacity(256);
        let frame = read_frame(&mut lane, &mut buf).await.map_err(|e| match e {
            ReadError::Io(e) => transport(e.to_string()),
            ReadError::Wire(source) => ConnectError::Wire {
                addr: where_.clone(),
                source,
            },
            ReadError::Eof => transport("the frontend ended the lane during the handshake".into()),
        })?;
        match frame {
            Frame::Hello(answer) => {
                expect
                    .check(&answer)
                    .map_err(|source| ConnectError::Handshake {
                        addr: where_.clone(),
                        source,
                    })?;
                Ok((answer, lane, buf))
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
    let (answer, lane, leftover) =
        tokio::time::timeout(timeout, handshake)
            .await
            .map_err(|_| ConnectError::Timeout {
                addr: where_.clone(),
                timeout,
            })??;
    Ok((answer, lane.into_io(leftover, None)))
}
