//! The worker side of both Dynamo arms, as Dynamo's own worker (`Ingress::handle_payload`)
//! does it: decode the request envelope, open the response stream the frontend advertised
//! (classic TCP: `TcpClient::create_response_stream`; QUIC: the process's
//! `QuicResponseClientPool`), send the prologue, then one `NetworkStreamWrapper` item per
//! token encoded with the request's payload codec, a `complete_final` item, and the
//! transport's end (TCP: drop, which writes the sentinel; QUIC: `finish`).
//!
//! What is left out of Dynamo's worker: its engine pump task between engine and publisher
//! (our mock engine sends on the publisher directly, as it does for every arm), its metrics
//! and its tracing spans. All of them cost worker CPU, so Dynamo's worker figures here are a
//! lower bound.

use std::sync::Arc;

use bytes::Bytes;
use dynamo_runtime::engine::AsyncEngineContextProvider;
use dynamo_runtime::pipeline::Context;
use dynamo_runtime::pipeline::network::codec::{TwoPartCodec, TwoPartMessageType};
use dynamo_runtime::pipeline::network::quic_response::{
    QuicResponseClientPool, QuicResponseSender,
};
use dynamo_runtime::pipeline::network::tcp::client::TcpClient;
use dynamo_runtime::pipeline::network::{
    ConnectionInfo, NetworkStreamWrapper, RequestPlanePayloadCodec, ResponsePlaneMode, StreamSender,
};
use dynamo_runtime::protocols::annotated::Annotated;
use serde::Deserialize;
use velo_bench::adapter::{BenchSink, BenchWorker};
use velo_bench::item::EngineOutput;
use velo_bench::reqplane::Request;

/// A worker process of either Dynamo arm.
pub(crate) struct Worker {
    /// The process's QUIC client pool (the QUIC arm only): one bundle of connections per
    /// frontend, shared by every stream to it.
    quic: Option<Arc<QuicResponseClientPool>>,
}

impl Worker {
    /// A worker that opens classic TCP response streams only.
    pub(crate) fn tcp() -> Self {
        Self { quic: None }
    }

    /// A worker that also opens QUIC response streams, from `pool`.
    pub(crate) fn quic(pool: Arc<QuicResponseClientPool>) -> Self {
        Self { quic: Some(pool) }
    }
}

/// The fields of Dynamo's request envelope header (`RequestControlMessage`, JSON) a worker
/// needs. That type is crate-private, so its documented JSON fields are read here.
#[derive(Deserialize)]
struct Envelope {
    id: String,
    connection_info: ConnectionInfo,
    #[serde(default)]
    payload_codec: RequestPlanePayloadCodec,
}

/// Splits Dynamo's two-part request (header: control JSON; data: codec-encoded request).
fn decode_envelope(payload: Bytes) -> Result<(Envelope, Request), String> {
    let msg = TwoPartCodec::default()
        .decode_message(payload)
        .map_err(|e| format!("request envelope: {e}"))?
        .into_message_type();
    let TwoPartMessageType::HeaderAndData(header, data) = msg else {
        return Err("request envelope without a header and a request".into());
    };
    let env: Envelope =
        serde_json::from_slice(&header).map_err(|e| format!("request header: {e}"))?;
    let request = env
        .payload_codec
        .decode(&data)
        .map_err(|e| format!("request body: {e}"))?;
    Ok((env, request))
}

impl BenchWorker for Worker {
    type Sink = Sink;

    async fn open(&self, raw: Bytes) -> Result<(Request, Sink), String> {
        let (env, request) = decode_envelope(raw)?;
        // Both senders check that the context's id is the request's.
        let ctx = Context::with_id_and_metadata((), env.id, Default::default()).context();
        let mode = ResponsePlaneMode::from_transport_name(&env.connection_info.transport)
            .map_err(|e| e.to_string())?;
        let out = match mode {
            ResponsePlaneMode::Tcp => {
                let mut s = TcpClient::create_response_stream(ctx, env.connection_info, None)
                    .await
                    .map_err(|e| format!("tcp response stream: {e}"))?;
                s.send_prologue(None).await?;
                Out::Tcp(s)
            }
            ResponsePlaneMode::Quic => {
                let pool = self
                    .quic
                    .as_ref()
                    .ok_or("a QUIC stream to a TCP-only worker")?;
                let mut s = pool
                    .sender(ctx, env.connection_info)
                    .await
                    .map_err(|e| format!("quic response stream: {e}"))?;
                s.send_prologue(None).await?;
                Out::Quic(s)
            }
        };
        Ok((
            request,
            Sink {
                out,
                codec: env.payload_codec,
            },
        ))
    }

    fn flush(&self) {}
}

/// One response stream of a Dynamo worker.
pub(crate) struct Sink {
    out: Out,
    codec: RequestPlanePayloadCodec,
}

enum Out {
    Tcp(StreamSender),
    Quic(QuicResponseSender),
}

impl Sink {
    async fn send_wrapper(
        &self,
        w: &NetworkStreamWrapper<Annotated<&EngineOutput>>,
    ) -> Result<(), String> {
        let bytes = Bytes::from(self.codec.encode(w).map_err(|e| e.to_string())?);
        let sent = match &self.out {
            Out::Tcp(s) => s.send(bytes).await,
            Out::Quic(s) => s.send(bytes).await,
        };
        sent.map_err(|e| e.to_string())
    }
}

impl BenchSink for Sink {
    async fn send(&mut self, item: &EngineOutput) -> Result<(), String> {
        self.send_wrapper(&NetworkStreamWrapper {
            data: Some(Annotated::from_data(item)),
            complete_final: false,
        })
        .await
    }

    async fn finish(self) -> Result<(), String> {
        self.send_wrapper(&NetworkStreamWrapper {
            data: None,
            complete_final: true,
        })
        .await?;
        match self.out {
            // Dropping the sender closes its writer's channel: it writes the sentinel and
            // closes the socket.
            Out::Tcp(s) => drop(s),
            Out::Quic(mut s) => s.finish().await.map_err(|e| e.to_string())?,
        }
        Ok(())
    }
}
