//! velo-serve with Dynamo's TLS settings: the frontend and its workers, configured by
//! `DYN_TCP_TLS_*` for mutual TLS (and, on the velo plane, the cluster secret), serve a
//! streamed chat to the end on both response planes. Certificates are made at test time.

mod harness;

use harness::{Cluster, chat, events, json};
use response_plane::ResponsePlaneConfig;
use velo_tls::testing::TestPki;

/// The plane `name` with mutual TLS and a cluster secret, as the environment would set it.
fn secured(pki: &TestPki, name: &str) -> ResponsePlaneConfig {
    let mut vars = pki.mutual_tls_env();
    vars.extend([
        ("DYN_RESPONSE_PLANE", name.to_owned()),
        ("DYN_TCP_RESPONSE_STREAM_HOST", "127.0.0.1".to_owned()),
        (
            "DYN_VELO_CLUSTER_SECRET_PATH",
            pki.path("secret").display().to_string(),
        ),
    ]);
    ResponsePlaneConfig::from_lookup(|v| vars.iter().find(|(k, _)| *k == v).map(|(_, x)| x.clone()))
        .expect("a valid TLS configuration")
}

async fn a_streamed_chat_completes_over_mutual_tls(name: &str) {
    let pki = TestPki::new();
    std::fs::write(pki.path("secret"), "the velo-serve tests' secret....").unwrap();
    let plane = secured(&pki, name);
    assert!(plane.tls().is_enabled(), "{name}: TLS is on");
    let c = Cluster::start_on(plane, 1, |_| {}).await;
    let (_conn, mut r) = c
        .post(
            "/v1/chat/completions",
            &chat(8, true, serde_json::json!({"ignore_eos": true})),
        )
        .await;
    assert_eq!(r.status, 200, "{name}");
    let events = events(&mut r).await;
    assert_eq!(
        events.len(),
        8 + 1,
        "{name}: 8 tokens, then [DONE]: {events:?}"
    );
    assert_eq!(events[8].data, "[DONE]", "{name}");
    let last = json(&events[7].data);
    assert_eq!(
        last["choices"][0]["finish_reason"], "length",
        "{name}: {last}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_chat_completes_over_mutual_tls_on_the_velo_plane() {
    a_streamed_chat_completes_over_mutual_tls("velo").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_chat_completes_over_mutual_tls_on_the_classic_plane() {
    a_streamed_chat_completes_over_mutual_tls("tcp").await;
}
