//! The worker side: prepare each frontend node once, then open every stream from its ticket
//! (no round trip), send the prologue, the items, the `complete_final` item and velo's
//! terminal record (`finalize`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::OnceCell;
use velo::streaming::{MESSENGER_MUX_KEY, StreamSender};
use velo::{InstanceId, PeerInfo, Velo};
use velo_bench::adapter::{BenchSink, BenchWorker};
use velo_bench::item::EngineOutput;
use velo_bench::reqplane::Request;

use crate::frame::{self, Prologue, ResponseAddress, ResponseFrame};

/// How long a frontend's `_hello` exchange may take (Dynamo's bound).
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// The handler whose presence says a peer's control plane is up.
const READY_HANDLER: &str = "_stream_stop";

/// A velo 0.21 worker.
pub(crate) struct Worker {
    node: Velo,
    /// Frontend nodes prepared, or being prepared (concurrent first streams share it; a
    /// failure is retried by the next stream).
    peers: Mutex<HashMap<InstanceId, Arc<OnceCell<()>>>>,
}

impl Worker {
    pub(crate) fn new(node: Velo) -> Self {
        Self {
            node,
            peers: Mutex::new(HashMap::new()),
        }
    }

    /// Registers frontend `peer` and waits for its control plane, once per frontend.
    async fn prepare(&self, peer: PeerInfo) -> Result<(), String> {
        let id = peer.instance_id();
        let cell = self
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(id)
            .or_default()
            .clone();
        cell.get_or_try_init(|| async {
            self.node.register_peer(peer).map_err(|e| e.to_string())?;
            tokio::time::timeout(HELLO_TIMEOUT, self.node.wait_for_handler(id, READY_HANDLER))
                .await
                .map_err(|_| format!("frontend {id} did not answer in {HELLO_TIMEOUT:?}"))?
                .map_err(|e| e.to_string())
        })
        .await
        .map(|_| ())
    }
}

impl BenchWorker for Worker {
    type Sink = Sink;

    async fn open(&self, raw: Bytes) -> Result<(Request, Sink), String> {
        let request = Request::decode(&raw)?;
        let addr: ResponseAddress =
            serde_json::from_str(&request.info).map_err(|e| format!("connection info: {e}"))?;
        if addr.ticket.streaming_transport_key.as_str() != MESSENGER_MUX_KEY {
            return Err("the ticket is not for the messenger mux".into());
        }
        if addr.anchor.unpack().0 != addr.peer.worker_id() {
            return Err("the anchor is not on the node the request names".into());
        }
        self.prepare(addr.peer).await?;
        let sender = self
            .node
            .open_anchor_stream::<ResponseFrame>(addr.anchor, addr.ticket)
            .await
            .map_err(|e| format!("open from ticket: {e}"))?;
        sender
            .send(ResponseFrame::Prologue(Prologue { error: None }))
            .await
            .map_err(|e| e.to_string())?;
        Ok((request, Sink(sender)))
    }

    fn flush(&self) {
        self.node.flush_batch();
    }
}

/// One velo 0.21 response stream.
pub(crate) struct Sink(StreamSender<ResponseFrame>);

impl BenchSink for Sink {
    async fn send(&mut self, item: &EngineOutput) -> Result<(), String> {
        let data = frame::encode_item(item)?;
        self.0
            .send(ResponseFrame::Data(data))
            .await
            .map_err(|e| e.to_string())
    }

    async fn finish(self) -> Result<(), String> {
        self.0
            .send(ResponseFrame::Data(frame::encode_final()?))
            .await
            .map_err(|e| e.to_string())?;
        self.0.finalize().map_err(|e| e.to_string())
    }
}
