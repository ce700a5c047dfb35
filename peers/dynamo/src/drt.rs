//! The runtime and worker ingress of the arms on a `DistributedRuntime`: dynamo-quic, and
//! dynamo-tcp-drt (the classic plane behind the same request plane, for a like-for-like
//! TCP-versus-QUIC comparison).
//!
//! Dynamo's QUIC plane cannot be read standalone: `QuicResponseServer::register_response`
//! returns a `StreamReceiver` with no public accessor, and the router that reads it is built
//! only by `AddressedPushRouter::from_runtime_provider`. So each process of these arms runs a
//! process-local `DistributedRuntime` (in-memory discovery, no etcd, no NATS) with its
//! response plane set, and requests travel on that runtime's own TCP request plane: the
//! worker registers a `PushWorkHandler` on `drt.request_plane_server()`, which is how a
//! Dynamo worker receives requests.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use dynamo_runtime::component::Endpoint;
use dynamo_runtime::distributed::DistributedConfig;
use dynamo_runtime::pipeline::PipelineError;
use dynamo_runtime::pipeline::network::{PushWorkHandler, ResponsePlaneMode};
use dynamo_runtime::{DistributedRuntime, Runtime};
use velo_bench::roles::WorkerSetup;
use velo_bench::worker::{Engines, Ingress};

use crate::worker::Worker;
use crate::{COMPONENT, ENDPOINT, NAMESPACE};

/// A process-local `DistributedRuntime` on the current tokio runtime, response plane `mode`.
pub(crate) async fn runtime(mode: ResponsePlaneMode) -> Result<DistributedRuntime, String> {
    let runtime = Runtime::from_current().map_err(|e| e.to_string())?;
    let mut config = DistributedConfig::process_local();
    config.response_plane = Some(mode);
    DistributedRuntime::new(runtime, config)
        .await
        .map_err(|e| format!("distributed runtime: {e:#}"))
}

/// A worker taking requests from the runtime's request-plane server. On QUIC, its senders come
/// from the runtime's process-wide QUIC client pool.
pub(crate) async fn worker(
    mode: ResponsePlaneMode,
) -> Result<WorkerSetup<Worker, RequestPlane>, String> {
    let drt = runtime(mode).await?;
    let plane = match mode {
        ResponsePlaneMode::Quic => {
            Worker::quic(drt.quic_response_client_pool().map_err(|e| e.to_string())?)
        }
        ResponsePlaneMode::Tcp => Worker::tcp(),
    };
    Ok(WorkerSetup {
        plane,
        flush_per_pass: false,
        ingress: RequestPlane { drt },
    })
}

/// Dynamo's TCP request plane as the worker's ingress.
pub(crate) struct RequestPlane {
    drt: DistributedRuntime,
}

impl Ingress<Worker> for RequestPlane {
    async fn start(self, engines: Arc<Engines<Worker>>) -> Result<String, String> {
        let server = self
            .drt
            .request_plane_server()
            .await
            .map_err(|e| e.to_string())?;
        let instance_id = u64::from(std::process::id());
        server
            .register_endpoint(
                ENDPOINT.to_owned(),
                Arc::new(Handler {
                    engines,
                    _drt: self.drt.clone(),
                }),
                instance_id,
                NAMESPACE.to_owned(),
                COMPONENT.to_owned(),
                self.drt.system_health(),
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(format!(
            "{}/{instance_id:x}/{NAMESPACE}/{COMPONENT}/{ENDPOINT}",
            server.address()
        ))
    }
}

/// Hands each request the server delivers to the engines. The server acknowledges the
/// request before calling this, and runs it on a task of its own.
struct Handler {
    engines: Arc<Engines<Worker>>,
    /// The runtime lives as long as its server holds this handler: the process's life.
    _drt: DistributedRuntime,
}

#[async_trait]
impl PushWorkHandler for Handler {
    async fn handle_payload(
        &self,
        payload: Bytes,
        _request_id: Option<String>,
    ) -> Result<(), PipelineError> {
        self.engines.serve(payload).await;
        Ok(())
    }

    fn add_metrics(
        &self,
        _endpoint: &Endpoint,
        _metrics_labels: Option<&[(&str, &str)]>,
    ) -> anyhow::Result<()> {
        Ok(())
    }
}
