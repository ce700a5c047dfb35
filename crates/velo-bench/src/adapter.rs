//! What a response plane must provide to be benchmarked: four small traits, used with static
//! dispatch so the harness adds no per-token allocation or indirection. Our planes implement
//! them here; the peer arms (`peers/`) implement them for Dynamo's planes and Velo 0.21.

use std::future::Future;

use crate::item::EngineOutput;

/// The frontend side of a plane.
pub trait BenchFrontend: Send + Sync + 'static {
    /// A stream being received.
    type Stream: BenchStream;
    /// Resolves on the stream's prologue.
    type Pending: Future<Output = Result<Self::Stream, String>> + Send + 'static;

    /// Registers a stream: its address (carried in the request) and its pending handle.
    ///
    /// # Errors
    ///
    /// The plane's refusal, as text.
    fn register(&self) -> Result<(String, Self::Pending), String>;

    /// Established connections the plane holds right now, if it can tell (else the harness
    /// counts sockets itself).
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

    /// Opens the response stream addressed by `info` and sends its prologue.
    fn open(&self, info: &str) -> impl Future<Output = Result<Self::Sink, String>> + Send;

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
    use futures::StreamExt;
    use response_plane::{
        FrontendPlane, PendingResponse, RegisterOptions, ResponseSender, ResponseStream,
        WorkerPlane,
    };

    use super::{BenchFrontend, BenchSink, BenchStream, BenchWorker, EngineOutput};

    /// A frontend on our plane.
    pub struct Frontend(pub FrontendPlane);

    impl BenchFrontend for Frontend {
        type Stream = ResponseStream<EngineOutput>;
        type Pending = futures::future::BoxFuture<'static, Result<Self::Stream, String>>;

        fn register(&self) -> Result<(String, Self::Pending), String> {
            let (info, pending): (_, PendingResponse<EngineOutput>) = self
                .0
                .register(RegisterOptions::default())
                .map_err(|e| e.to_string())?;
            let info = serde_json::to_string(&info).map_err(|e| e.to_string())?;
            let pending =
                Box::pin(async move { pending.established().await.map_err(|e| e.to_string()) });
            Ok((info, pending))
        }

        fn port(&self) -> u16 {
            self.0.address().port()
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

        async fn open(&self, info: &str) -> Result<Self::Sink, String> {
            let info = serde_json::from_str(info).map_err(|e| e.to_string())?;
            let mut sender = self
                .0
                .connect::<EngineOutput>(&info)
                .await
                .map_err(|e| e.to_string())?;
            sender
                .send_prologue(Ok(()))
                .await
                .map_err(|e| e.to_string())?;
            Ok(sender)
        }

        fn flush(&self) {
            self.0.flush();
        }
    }

    impl BenchSink for ResponseSender<EngineOutput> {
        async fn send(&mut self, item: &EngineOutput) -> Result<(), String> {
            Self::send(self, item)
                .await
                .map_err(|e| e.to_string())
        }

        async fn finish(self) -> Result<(), String> {
            Self::finish(self)
                .await
                .map_err(|e| e.to_string())
        }
    }
}
