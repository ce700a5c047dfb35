//! TLS settings reach the service through its configuration (Dynamo's `DYN_TCP_TLS_*`, the
//! velo plane's cluster secret), a half-set one stops startup, and a running service reloads
//! its certificates on demand.

use std::time::Duration;

use futures::StreamExt;
use response_plane::RegisterOptions;
use runtime_glue::{ResponseService, Role, ServiceConfig};
use velo_tls::testing::TestPki;

fn env(pki: &TestPki, plane: &str) -> Vec<(&'static str, String)> {
    let mut vars = pki.mutual_tls_env();
    vars.extend([
        ("DYN_RESPONSE_PLANE", plane.to_owned()),
        ("DYN_TCP_RESPONSE_STREAM_HOST", "127.0.0.1".to_owned()),
        (
            "DYN_VELO_CLUSTER_SECRET_PATH",
            pki.path("secret").display().to_string(),
        ),
    ]);
    vars
}

fn config(vars: Vec<(&'static str, String)>) -> Result<ServiceConfig, response_plane::ConfigError> {
    ServiceConfig::from_lookup(Role::Both, move |v| {
        vars.iter().find(|(k, _)| *k == v).map(|(_, x)| x.clone())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_configured_for_mutual_tls_streams_and_reloads_its_certificates() {
    let pki = TestPki::new();
    std::fs::write(pki.path("secret"), "a secret for the service test....").unwrap();
    let planes: &[&str] = if cfg!(feature = "tcp") {
        &["tcp", "velo"]
    } else {
        &["tcp"]
    };
    for &plane in planes {
        let service = ResponseService::start(config(env(&pki, plane)).unwrap())
            .await
            .unwrap();
        let (info, pending) = service.register::<u32>(RegisterOptions::default()).unwrap();
        let mut tx = service.connect::<u32>(&info).await.unwrap();
        tx.send_prologue(Ok(())).await.unwrap();
        tx.send(&7).await.unwrap();
        let finish = tokio::spawn(async move { tx.finish().await });
        let bounded = Duration::from_secs(20);
        let rx = tokio::time::timeout(bounded, pending.established())
            .await
            .unwrap()
            .unwrap();
        let items: Vec<u32> = tokio::time::timeout(bounded, rx.map(Result::unwrap).collect())
            .await
            .unwrap();
        assert_eq!(items, [7], "{plane}");
        finish.await.unwrap().unwrap();
        service.reload_tls().unwrap();
        std::fs::write(pki.path("server.key"), "not a key").unwrap();
        let err = service.reload_tls().unwrap_err();
        assert!(
            err.to_string().starts_with("DYN_TCP_TLS_KEY_PATH"),
            "{plane}: {err}"
        );
        pki.issue_server("server");
        service.shutdown().await;
    }
}

#[test]
fn a_half_set_tls_environment_stops_the_service_naming_the_variable() {
    let pki = TestPki::new();
    let mut vars = env(&pki, "tcp");
    vars.retain(|(k, _)| *k != "DYN_TCP_TLS_KEY_PATH" && *k != "DYN_VELO_CLUSTER_SECRET_PATH");
    let err = config(vars).unwrap_err().to_string();
    assert!(
        err.contains("DYN_TCP_TLS_CERT_PATH is set but DYN_TCP_TLS_KEY_PATH is not"),
        "{err}"
    );
}
