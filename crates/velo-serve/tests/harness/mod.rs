//! An in-process velo-serve for the end-to-end tests: a frontend on loopback, workers in this
//! process (or one worker process, to be killed), discovery in a private directory, and a real
//! HTTP client.

#![allow(dead_code, unreachable_pub)]

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use response_plane::{Plane, ResponsePlaneConfig};
use runtime_glue::{Role, ServiceConfig};
use velo_serve::client::{Conn, Response, SseEvent};
use velo_serve::discovery::{DiscoveryConfig, ENV_FILE_KV};
use velo_serve::frontend::admission::AdmissionLimits;
use velo_serve::frontend::{Frontend, FrontendConfig};
use velo_serve::openai::Limits;
use velo_serve::worker::{Worker, WorkerConfig};

pub mod intake;

/// Every wait in these tests is bounded by this.
pub const BOUND: Duration = Duration::from_secs(30);
/// The model name.
pub const MODEL: &str = "velo-mock";

pub struct Cluster {
    pub frontend: Frontend,
    pub workers: Vec<Worker>,
    pub discovery: DiscoveryConfig,
    pub plane: ResponsePlaneConfig,
}

pub fn plane(plane: Plane) -> ResponsePlaneConfig {
    ResponsePlaneConfig::builder()
        .plane(plane)
        .host(Some(Ipv4Addr::LOCALHOST.into()))
        .build()
        .expect("a valid plane configuration")
}

/// A file holding `secret`, private to this test process.
pub fn secret_file(secret: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let path = std::env::temp_dir().join(format!(
        "velo-serve-secret-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, secret).expect("the secret file is written");
    path
}

/// The velo plane on loopback with the cluster secret `secret` (none for `None`).
pub fn plane_with_secret(secret: Option<&str>) -> ResponsePlaneConfig {
    plane(Plane::Velo)
        .to_builder()
        .secret_path(secret.map(secret_file))
        .build()
        .expect("a valid plane configuration")
}

/// A fresh discovery directory.
pub fn discovery(ttl: Duration) -> DiscoveryConfig {
    static N: AtomicU32 = AtomicU32::new(0);
    let root = std::env::temp_dir().join(format!(
        "velo-serve-e2e-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&root);
    let r = root.to_string_lossy().into_owned();
    DiscoveryConfig::from_lookup(move |v| (v == ENV_FILE_KV).then(|| r.clone()), ttl)
        .expect("a valid discovery configuration")
}

pub fn service(role: Role, plane: ResponsePlaneConfig) -> ServiceConfig {
    ServiceConfig::builder(role)
        .response_plane(plane)
        .grace(Duration::from_secs(5))
        .build()
        .expect("a valid service configuration")
}

pub fn frontend_config(plane: ResponsePlaneConfig, discovery: DiscoveryConfig) -> FrontendConfig {
    FrontendConfig {
        http: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        model: MODEL.into(),
        limits: Limits {
            max_tokens: 4096,
            context_tokens: 32768,
        },
        admission: AdmissionLimits {
            max_in_flight: 256,
            max_queued: 256,
            queue_timeout: Duration::from_secs(5),
        },
        establish_timeout: Duration::from_secs(60),
        max_attempts: 3,
        removal_grace: Duration::from_secs(10),
        item_timeout: Duration::from_secs(60),
        max_body_bytes: 1 << 20,
        http_limits: velo_serve::frontend::http::HttpLimits::default(),
        service: service(Role::Frontend, plane),
        plane_thread: false,
        discovery,
    }
}

pub fn worker_config(plane: ResponsePlaneConfig, discovery: DiscoveryConfig) -> WorkerConfig {
    WorkerConfig {
        service: service(Role::Worker, plane),
        discovery,
        engines: 2,
        speedup: 10.0,
        host: Ipv4Addr::LOCALHOST.into(),
        flush_per_pass: false,
        work_limits: velo_serve::work::WorkLimits::default(),
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Best effort: the workers' own files go with them; the directory stays otherwise.
        let _ = std::fs::remove_dir_all(&self.discovery.root);
    }
}

impl Cluster {
    /// A frontend (adjusted by `tweak`) and `workers` in-process workers, all discovered.
    pub async fn start(p: Plane, workers: usize, tweak: impl FnOnce(&mut FrontendConfig)) -> Self {
        Self::start_on(plane(p), workers, tweak).await
    }

    /// As [`start`](Self::start), on a plane configured by the caller (TLS, a secret).
    pub async fn start_on(
        plane: ResponsePlaneConfig,
        workers: usize,
        tweak: impl FnOnce(&mut FrontendConfig),
    ) -> Self {
        let discovery = discovery(Duration::from_secs(10));
        let mut config = frontend_config(plane.clone(), discovery.clone());
        tweak(&mut config);
        let frontend = Frontend::start(config).await.expect("the frontend starts");
        let mut cluster = Self {
            frontend,
            workers: Vec::new(),
            discovery,
            plane,
        };
        for _ in 0..workers {
            cluster.add_worker().await;
        }
        cluster
    }

    pub async fn add_worker(&mut self) {
        let w = Worker::start(worker_config(self.plane.clone(), self.discovery.clone()))
            .await
            .expect("a worker starts");
        let id = w.instance_id();
        self.workers.push(w);
        self.wait_for("the worker to be discovered", |c| {
            c.frontend.state().pool.ids().contains(&id)
        })
        .await;
    }

    pub fn addr(&self) -> SocketAddr {
        self.frontend.address()
    }

    /// Polls `done` (bounded in time) until it holds.
    pub async fn wait_for(&self, what: &str, done: impl Fn(&Self) -> bool) {
        let start = Instant::now();
        while !done(self) {
            assert!(start.elapsed() < BOUND, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub async fn post(&self, path: &str, body: &serde_json::Value) -> (Conn, Response) {
        let mut conn = tokio::time::timeout(BOUND, Conn::open(self.addr()))
            .await
            .expect("connect in time")
            .expect("connect");
        let r = tokio::time::timeout(BOUND, conn.post(path, &body.to_string()))
            .await
            .expect("an answer in time")
            .expect("an answer");
        (conn, r)
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        velo_serve::client::get_text(self.addr(), path, BOUND)
            .await
            .expect("a GET answer")
    }

    pub fn root(&self) -> PathBuf {
        self.discovery.root.clone()
    }
}

/// Every SSE event until the end of the body.
pub async fn events(r: &mut Response) -> Vec<SseEvent> {
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(BOUND, r.next_event()).await {
            Err(_) => panic!("the stream did not end within {BOUND:?}; got {out:?}"),
            Ok(Ok(Some(e))) => out.push(e),
            Ok(Ok(None)) => return out,
            Ok(Err(e)) => panic!("the stream broke: {e}; got {out:?}"),
        }
    }
}

pub async fn next_event(r: &mut Response) -> SseEvent {
    tokio::time::timeout(BOUND, r.next_event())
        .await
        .expect("an event in time")
        .expect("a readable stream")
        .expect("an event")
}

pub fn chat(max_tokens: u32, stream: bool, extra: serde_json::Value) -> serde_json::Value {
    let mut body = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, world!"}],
        "max_tokens": max_tokens,
        "stream": stream,
    });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    body
}

pub fn json(data: &str) -> serde_json::Value {
    serde_json::from_str(data).unwrap_or_else(|e| panic!("not JSON ({e}): {data}"))
}
