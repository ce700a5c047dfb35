//! The frontend side: per request, a fresh anchor, pre-bound so the worker can open it from a
//! ticket; its address goes in the request on our channel; the stream is ready at its
//! prologue and ends cleanly at velo's `Finalized` after the `complete_final` item.

use futures::StreamExt;
use velo::streaming::{StreamAnchor, StreamFrame};
use velo::{PeerInfo, Velo};
use velo_bench::adapter::{BenchFrontend, BenchStream};
use velo_bench::item::EngineOutput;
use velo_bench::reqplane::{Request, RequestSender};

use crate::frame::{self, ADDRESS_VERSION, Decoded, Prologue, ResponseAddress, ResponseFrame};

/// A velo 0.21 frontend.
pub(crate) struct Frontend {
    node: Velo,
    /// This node as workers reach it (fixed for the node's life).
    peer: PeerInfo,
    port: u16,
    requests: Vec<RequestSender>,
}

impl Frontend {
    /// A frontend on `node` (listening on `port`), sending to worker process `i` on
    /// `requests[i]`.
    pub(crate) fn new(node: Velo, port: u16, requests: Vec<RequestSender>) -> Self {
        let peer = node.peer_info();
        Self {
            node,
            peer,
            port,
            requests,
        }
    }
}

impl BenchFrontend for Frontend {
    type Stream = Stream;

    async fn request(&self, process: usize, mut request: Request) -> Result<Stream, String> {
        let mut anchor = self.node.create_anchor::<ResponseFrame>();
        let ticket = self
            .node
            .prebind_anchor(anchor.handle())
            .ok_or("the node has no mux to pre-bind on")?;
        request.info = serde_json::to_string(&ResponseAddress {
            version: ADDRESS_VERSION,
            peer: self.peer.clone(),
            anchor: anchor.handle(),
            ticket,
        })
        .map_err(|e| e.to_string())?;
        let to = self
            .requests
            .get(process)
            .ok_or_else(|| format!("no worker process {process}"))?;
        to.send(&request).await?;
        match anchor.next().await {
            Some(Ok(StreamFrame::Item(ResponseFrame::Prologue(Prologue { error: None })))) => {
                Ok(Stream {
                    anchor,
                    ended: false,
                })
            }
            Some(Ok(StreamFrame::Item(ResponseFrame::Prologue(Prologue { error: Some(e) })))) => {
                Err(format!("worker refused: {e}"))
            }
            other => Err(format!("stream ended before a valid prologue: {other:?}")),
        }
    }

    fn port(&self) -> u16 {
        self.port
    }
}

/// A velo 0.21 response stream.
pub(crate) struct Stream {
    anchor: StreamAnchor<ResponseFrame>,
    /// The `complete_final` item has arrived.
    ended: bool,
}

impl BenchStream for Stream {
    async fn next_item(&mut self) -> Option<Result<EngineOutput, String>> {
        loop {
            let frame = match self.anchor.next().await {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => return Some(Err(e.to_string())),
                None if self.ended => return None,
                None => return Some(Err("stream closed before generation completed".into())),
            };
            match frame {
                StreamFrame::Item(ResponseFrame::Data(bytes)) if !self.ended => {
                    match frame::decode(&bytes) {
                        Ok(Decoded::Item(item)) => return Some(Ok(item)),
                        Ok(Decoded::Final) => self.ended = true,
                        Err(e) => return Some(Err(e)),
                    }
                }
                StreamFrame::Finalized if self.ended => return None,
                other => return Some(Err(format!("unexpected {other:?}"))),
            }
        }
    }
}
