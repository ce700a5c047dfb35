//! The frontend side of both Dynamo arms: Dynamo's `AddressedPushRouter`, the only public
//! reader of a Dynamo response stream (`StreamReceiver` has no public accessor). Per request
//! it registers the response stream, wraps the request in Dynamo's two-part envelope, hands
//! it to its request-plane client, awaits the prologue and decodes every item; all of that
//! is the frontend cost measured.
//!
//! - dynamo-tcp: `AddressedPushRouter::new` with a standalone `TcpStreamServer` and, as the
//!   request-plane client, our request channel ([`ReqChannel`]).
//! - dynamo-quic and dynamo-tcp-drt: `AddressedPushRouter::from_runtime_provider` on a
//!   process-local `DistributedRuntime` (the QUIC router's constructor is private), whose
//!   request plane is Dynamo's own TCP request plane.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use dynamo_runtime::DistributedRuntime;
use dynamo_runtime::component::{Instance, TransportType};
use dynamo_runtime::pipeline::network::egress::unified_client::{Headers, RequestPlaneClient};
use dynamo_runtime::pipeline::network::tcp::server::{ServerOptions, TcpStreamServer};
use dynamo_runtime::pipeline::network::{RequestPlanePayloadCodec, ResponsePlaneMode};
use dynamo_runtime::pipeline::{
    AddressedPushRouter, AddressedRequest, AsyncEngine, Context, Error, ManyOut, SingleIn,
};
use dynamo_runtime::protocols::annotated::Annotated;
use futures::StreamExt;
use velo_bench::adapter::{BenchFrontend, BenchStream};
use velo_bench::item::EngineOutput;
use velo_bench::reqplane::{Request, RequestSender};

use crate::{COMPONENT, ENDPOINT, NAMESPACE, env_or};

/// What a Dynamo frontend decodes per item (Dynamo's LLM items are `Annotated<_>` too).
type Item = Annotated<EngineOutput>;

/// A frontend of either Dynamo arm.
pub(crate) struct Frontend {
    router: Arc<AddressedPushRouter>,
    /// Worker process `i` as the router addresses it.
    instances: Vec<Instance>,
    port: u16,
    /// Keeps the runtime of the arms on one (and its servers) alive.
    _drt: Option<DistributedRuntime>,
}

impl Frontend {
    /// dynamo-tcp: the classic plane's listener (`DYN_TCP_RESPONSE_STREAM_HOST` /
    /// `_PORT`, as Dynamo's runtime reads them) and our request channel to `workers`.
    pub(crate) async fn tcp(workers: &[String]) -> Result<Self, String> {
        let port = env_or("DYN_TCP_RESPONSE_STREAM_PORT", "0")
            .parse()
            .map_err(|e| format!("DYN_TCP_RESPONSE_STREAM_PORT: {e}"))?;
        let server = TcpStreamServer::new(ServerOptions {
            port,
            interface: std::env::var("DYN_TCP_RESPONSE_STREAM_HOST").ok(),
        })
        .await
        .map_err(|e| e.to_string())?;
        let port = server.local_address().map_err(|e| e.to_string())?.port();
        let senders = RequestSender::connect_all(workers).await?;
        let by_address = workers.iter().cloned().zip(senders).collect();
        let router = AddressedPushRouter::new(Arc::new(ReqChannel { by_address }), server)
            .map_err(|e| e.to_string())?;
        let instances = workers
            .iter()
            .zip(1..)
            .map(|(w, id)| instance(w, id))
            .collect();
        Ok(Self {
            router,
            instances,
            port,
            _drt: None,
        })
    }

    /// dynamo-quic and dynamo-tcp-drt: a router on `drt` (whose response plane the arm
    /// chose) to the request-plane endpoints `workers` announced
    /// (`tcp://host:port/<instance id, hex>/ns/component/ep`).
    pub(crate) async fn drt(drt: DistributedRuntime, workers: &[String]) -> Result<Self, String> {
        let router = AddressedPushRouter::from_runtime_provider(&drt)
            .await
            .map_err(|e| e.to_string())?;
        // The classic plane's listener (the runtime's, shared with the router); QUIC's
        // connections are counted on the workers' UDP sockets instead.
        let port = match drt.response_plane() {
            ResponsePlaneMode::Tcp => drt
                .tcp_server()
                .await
                .and_then(|s| s.local_address())
                .map_err(|e| e.to_string())?
                .port(),
            ResponsePlaneMode::Quic => 0,
        };
        let instances = workers
            .iter()
            .map(|w| {
                let id = w
                    .split('/')
                    .nth(3)
                    .and_then(|h| u64::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("no instance id in {w:?}"))?;
                Ok(instance(w, id))
            })
            .collect::<Result<_, String>>()?;
        Ok(Self {
            router,
            instances,
            port,
            _drt: Some(drt),
        })
    }
}

/// Worker process `id` at `address`, accepting Dynamo's default payload codec (msgpack).
fn instance(address: &str, id: u64) -> Instance {
    Instance {
        component: COMPONENT.into(),
        endpoint: ENDPOINT.into(),
        namespace: NAMESPACE.into(),
        instance_id: id,
        transport: TransportType::Tcp(address.to_owned()),
        device_type: None,
        request_plane_codec: Some(RequestPlanePayloadCodec::Msgpack),
    }
}

impl BenchFrontend for Frontend {
    type Stream = Stream;

    async fn request(&self, process: usize, request: Request) -> Result<Stream, String> {
        let instance = self
            .instances
            .get(process)
            .ok_or_else(|| format!("no worker process {process}"))?
            .clone();
        let request: SingleIn<AddressedRequest<Request>> =
            Context::new(AddressedRequest::for_instance(request, instance));
        let stream = <AddressedPushRouter as AsyncEngine<_, ManyOut<Item>, Error>>::generate(
            &self.router,
            request,
        )
        .await
        .map_err(|e| format!("{e:#}"))?;
        Ok(Stream(stream))
    }

    fn port(&self) -> u16 {
        self.port
    }
}

/// A Dynamo response stream, as the router decodes it.
pub(crate) struct Stream(ManyOut<Item>);

impl BenchStream for Stream {
    async fn next_item(&mut self) -> Option<Result<EngineOutput, String>> {
        let item = self.0.next().await?;
        if let Some(e) = item.error {
            return Some(Err(e.to_string()));
        }
        Some(item.data.ok_or_else(|| "an item without data".to_owned()))
    }
}

/// Our request channel as Dynamo's request-plane client: the router's envelope is one frame
/// to the worker process at `address`. Like our channel for every other arm, it does not wait
/// for the worker's acknowledgement (Dynamo's TCP request plane does: one round trip before
/// the router awaits the prologue); the empty ACK it returns means "accepted".
struct ReqChannel {
    by_address: HashMap<String, RequestSender>,
}

#[async_trait]
impl RequestPlaneClient for ReqChannel {
    async fn send_request(
        &self,
        address: String,
        payload: Bytes,
        _headers: Headers,
    ) -> anyhow::Result<Bytes> {
        let to = self
            .by_address
            .get(&address)
            .ok_or_else(|| anyhow::anyhow!("no worker process at {address}"))?;
        to.send_frame(payload).await.map_err(Error::msg)?;
        Ok(Bytes::new())
    }

    fn transport_name(&self) -> &'static str {
        "velo-bench-reqplane"
    }

    fn is_healthy(&self) -> bool {
        true
    }
}
