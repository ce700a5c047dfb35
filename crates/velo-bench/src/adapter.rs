//! What a response plane must provide to be benchmarked: four small traits, used with static
//! dispatch so the harness adds no per-token allocation or indirection. Our planes implement
//! them here; the peer arms (`peers/`) implement them for Dynamo's planes and Velo 0.21.
//!
//! A plane owns the request's way to its worker as well as the response's way back, because
//! some planes build the request themselves (Dynamo's router wraps it in its own envelope).
//! Where a plane allows it, the request travels on our request channel ([`crate::reqplane`]).

use std::future::Future;

use bytes::Bytes;

use crate::item::EngineOutput;
use crate::reqplane::Request;

/// The frontend side of a plane.
pub trait BenchFrontend: Send + Sync + 'static {
    /// A stream being received.
    type Stream: BenchStream;

    /// Sends `request` to worker process number `process` (its index in the frontend's worker
    /// list) and resolves on its response stream's prologue.
    fn request(
        &self,
        process: usize,
        request: Request,
    ) -> impl Future<Output = Result<Self::Stream, String>> + Send;

    /// The TCP port whose established connections the harness counts as the plane's
    /// connections (0 when the plane has no TCP listener on the frontend).
    fn port(&self) -> u16;
}

/// A response stream on the frontend.
pub trait BenchStream: Send + 'static {
    /// The next item; `None` at the clean end.
    fn next_item(&mut self) -> impl Future<Output = Option<Result<EngineOutput, String>>> + Send;
}

/// The worker side of a plane.
pub trait BenchWorker: Send + Sync + 'static {
    /// A stream being sent.
    type Sink: BenchSink;

    /// Reads one request, as the plane's frontend put it on the wire, opens its response
    /// stream and sends the prologue.
    fn open(
        &self,
        request: Bytes,
    ) -> impl Future<Output = Result<(Request, Self::Sink), String>> + Send;

    /// The once-per-forward-pass flush hint (a no-op where the plane has none).
    fn flush(&self);
}

/// A response stream on the worker.
pub trait BenchSink: Send + 'static {
    /// Sends one item.
    fn send(&mut self, item: &EngineOutput) -> impl Future<Output = Result<(), String>> + Send;
    /// Ends the stream cleanly.
    fn finish(self) -> impl Future<Output = Result<(), String>> + Send;
}

/// Our planes, through the public `response-plane` API.
pub mod ours {
    use bytes::Bytes;
    use futures::StreamExt;
    use response_plane::{
        FrontendPlane, PendingResponse, RegisterOptions, ResponseSender, ResponseStream,
        WorkerPlane,
    };

    use super::{BenchFrontend, BenchSink, BenchStream, BenchWorker, EngineOutput};
    use crate::reqplane::{Request, RequestSender};

    /// A frontend on our plane, sending requests on our request channel.
    pub struct Frontend {
        plane: FrontendPlane,
        requests: Vec<RequestSender>,
    }

    impl Frontend {
        /// A frontend that sends to worker process `i` on `requests[i]`.
        pub fn new(plane: FrontendPlane, requests: Vec<RequestSender>) -> Self {
            Self { plane, requests }
        }
    }

    impl BenchFrontend for Frontend {
        type Stream = ResponseStream<EngineOutput>;

        async fn request(
            &self,
            process: usize,
            mut request: Request,
        ) -> Result<Self::Stream, String> {
            let (info, pending): (_, PendingResponse<EngineOutput>) = self
                .plane
                .register(RegisterOptions::default())
                .map_err(|e| e.to_string())?;
            request.info = serde_json::to_string(&info).map_err(|e| e.to_string())?;
            let to = self
                .requests
                .get(process)
                .ok_or_else(|| format!("no worker process {process}"))?;
            to.send(&request).await?;
            pending.established().await.map_err(|e| e.to_string())
        }

        fn port(&self) -> u16 {
            self.plane.address().port()
        }
    }

    impl BenchStream for ResponseStream<EngineOutput> {
        async fn next_item(&mut self) -> Option<Result<EngineOutput, String>> {
            self.next().await.map(|r| r.map_err(|e| e.to_string()))
        }
    }

    /// A worker on our plane.
    pub struct Worker(pub WorkerPlane);

    impl BenchWorker for Worker {
        type Sink = ResponseSender<EngineOutput>;

        async fn open(&self, request: Bytes) -> Result<(Request, Self::Sink), String> {
            let request = Request::decode(&request)?;
            let info = serde_json::from_str(&request.info).map_err(|e| e.to_string())?;
            let mut sender = self
                .0
                .connect::<EngineOutput>(&info)
                .await
                .map_err(|e| e.to_string())?;
            sender
                .send_prologue(Ok(()))
                .await
                .map_err(|e| e.to_string())?;
            Ok((request, sender))
        }

        fn flush(&self) {
            self.0.flush();
        }
    }

    impl BenchSink for ResponseSender<EngineOutput> {
        async fn send(&mut self, item: &EngineOutput) -> Result<(), String> {
            Self::send(self, item).await.map_err(|e| e.to_string())
        }

        async fn finish(self) -> Result<(), String> {
            Self::finish(self).await.map_err(|e| e.to_string())
        }
    }
}
