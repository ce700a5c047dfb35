//! A service with TLS reloads its certificate files on SIGHUP. Its own test binary: the
//! handler is process-wide, and a process without it would be ended by the signal.
//!
//! The rotated files keep the size and modification time of the old ones, so the plane's
//! own file watch cannot tell they changed: only the signal reloads them.

use std::path::Path;
use std::time::{Duration, SystemTime};

use response_plane::{RegisterOptions, ResponsePlaneConfig, WorkerPlane};
use runtime_glue::{ResponseService, Role, ServiceConfig};
use tokio_util::task::TaskTracker;
use velo_tls::testing::TestPki;

/// A bound on every wait of this story.
const BOUND: Duration = Duration::from_secs(20);
/// Every certificate and key file is padded to this size (PEM readers skip blank lines).
const FILE_SIZE: u64 = 8192;

/// Pads `path` with newlines to [`FILE_SIZE`] bytes.
fn pad(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let size = usize::try_from(FILE_SIZE).unwrap();
    assert!(bytes.len() < size, "{path:?} is larger than the padding");
    bytes.resize(size, b'\n');
    std::fs::write(path, bytes).unwrap();
}

/// Replaces `to` with `from`, keeping `to`'s size (both padded) and modification time.
fn replace_unseen(from: &Path, to: &Path) {
    let modified: SystemTime = std::fs::metadata(to).unwrap().modified().unwrap();
    std::fs::copy(from, to).unwrap();
    let file = std::fs::File::options().write(true).open(to).unwrap();
    file.set_modified(modified).unwrap();
    assert_eq!(file.metadata().unwrap().len(), FILE_SIZE);
}

/// Whether `worker` gets a stream through to `service` (its TLS handshake succeeds).
async fn served(service: &ResponseService, worker: &WorkerPlane) -> bool {
    let (info, _pending) = service.register::<u32>(RegisterOptions::default()).unwrap();
    let sent = tokio::time::timeout(BOUND, async {
        let mut tx = worker.connect::<u32>(&info).await?;
        tx.send_prologue(Ok(())).await?;
        tx.finish().await
    });
    matches!(sent.await, Ok(Ok(())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_with_tls_serves_its_rotated_certificate_after_sighup() {
    let pki = TestPki::new();
    pki.foreign("next");
    for name in [
        "server.pem",
        "server.key",
        "next-server.pem",
        "next-server.key",
    ] {
        pad(&pki.path(name));
    }
    let p = |name: &str| pki.path(name).display().to_string();
    let frontend = [
        ("DYN_RESPONSE_PLANE", "tcp".to_owned()),
        ("DYN_TCP_RESPONSE_STREAM_HOST", "127.0.0.1".to_owned()),
        ("DYN_TCP_TLS_CERT_PATH", p("server.pem")),
        ("DYN_TCP_TLS_KEY_PATH", p("server.key")),
    ];
    let config = ServiceConfig::from_lookup(Role::Frontend, |v| {
        frontend
            .iter()
            .find(|(k, _)| *k == v)
            .map(|(_, x)| x.clone())
    })
    .unwrap();
    let service = ResponseService::start(config).await.unwrap();
    // A worker that trusts only the next CA.
    let next = [
        ("DYN_RESPONSE_PLANE", "tcp".to_owned()),
        ("DYN_TCP_RESPONSE_STREAM_HOST", "127.0.0.1".to_owned()),
        ("DYN_TCP_TLS_CA_CERT_PATH", p("next-ca.pem")),
    ];
    let next = ResponsePlaneConfig::from_lookup(|v| {
        next.iter().find(|(k, _)| *k == v).map(|(_, x)| x.clone())
    })
    .unwrap();
    let worker = WorkerPlane::new(next, TaskTracker::new()).unwrap();
    assert!(
        !served(&service, &worker).await,
        "the old certificate is served"
    );

    replace_unseen(&pki.path("next-server.pem"), &pki.path("server.pem"));
    replace_unseen(&pki.path("next-server.key"), &pki.path("server.key"));
    // SAFETY: raising a signal in this process, whose handler the service installed.
    assert_eq!(unsafe { libc::raise(libc::SIGHUP) }, 0);

    // The reload runs in the service's task: poll, bounded, for the first stream served.
    let deadline = tokio::time::Instant::now() + BOUND;
    while !served(&service, &worker).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rotated certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.close();
    service.shutdown().await;
}
