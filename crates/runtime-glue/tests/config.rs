//! Startup fails fast, naming its cause; the command line overrides the environment.

use std::collections::HashMap;
use std::time::Duration;

use response_plane::Plane;
use runtime_glue::{ResponseService, Role, ServiceArgs, ServiceConfig, StartupError};

fn parse(vars: &[(&str, &str)]) -> Result<ServiceConfig, StartupError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Ok(ServiceConfig::from_lookup(Role::Both, |k| {
        map.get(k).cloned()
    })?)
}

#[test]
fn every_invalid_value_fails_startup_with_its_message() {
    let cases: &[(&str, &str)] = &[
        ("DYN_RESPONSE_PLANE", "quic"),
        ("DYN_RESPONSE_PLANE", ""),
        ("DYN_VELO_RESPONSE_TRANSPORT", "rdma"),
        ("DYN_VELO_RESPONSE_BATCH_MS", "-5"),
        ("DYN_VELO_RESPONSE_BATCH_MS", "1.5"),
        ("DYN_VELO_RESPONSE_BATCH_MS", ""),
        ("DYN_TCP_RESPONSE_STREAM_PORT", "http"),
        ("DYN_TCP_RESPONSE_STREAM_HOST", "example"),
        ("DYN_TCP_MAX_MESSAGE_SIZE", "1"),
        ("DYN_VELO_METRICS_ADDR", "9090"),
        ("DYN_VELO_METRICS_ADDR", ""),
        ("DYN_VELO_SHUTDOWN_GRACE_MS", "soon"),
        ("DYN_VELO_SHUTDOWN_GRACE_MS", "-1"),
        ("DYN_VELO_TEARDOWN_TIMEOUT_MS", "10s"),
        ("DYN_VELO_TEARDOWN_TIMEOUT_MS", "99999999999"),
    ];
    for (var, value) in cases {
        let msg = parse(&[(var, value)])
            .expect_err(&format!("{var}={value:?} must fail"))
            .to_string();
        assert!(
            msg.contains(var) && msg.contains(&format!("{value:?}")),
            "{msg}"
        );
        assert!(msg.contains("expected"), "{msg} says what is allowed");
    }
}

#[test]
fn defaults_and_valid_values() {
    let c = parse(&[]).unwrap();
    assert_eq!(c.response_plane().plane(), Plane::Classic);
    assert_eq!(c.metrics_addr(), None);
    assert_eq!(c.grace(), Duration::from_secs(5));
    assert_eq!(c.teardown_timeout(), Duration::from_secs(10));
    let c = parse(&[
        ("DYN_VELO_METRICS_ADDR", "127.0.0.1:0"),
        ("DYN_VELO_TEARDOWN_TIMEOUT_MS", "2500"),
    ])
    .unwrap();
    assert_eq!(c.metrics_addr(), Some("127.0.0.1:0".parse().unwrap()));
    assert_eq!(c.teardown_timeout(), Duration::from_millis(2500));
}

#[test]
fn the_command_line_overrides_the_environment() {
    let args = ServiceArgs {
        response_plane: Some("velo".into()),
        velo_batch_ms: Some("0".into()),
        ..Default::default()
    };
    let c = ServiceConfig::from_args(Role::Worker, &args).unwrap();
    assert_eq!(c.response_plane().plane(), Plane::Velo);
    assert_eq!(
        c.response_plane().batching(),
        response_plane::Batching::Greedy
    );
    let bad = ServiceArgs {
        response_plane: Some("nope".into()),
        ..Default::default()
    };
    let msg = ServiceConfig::from_args(Role::Worker, &bad)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("DYN_RESPONSE_PLANE") && msg.contains("\"nope\""),
        "{msg}"
    );
}

#[tokio::test]
async fn the_selected_plane_is_the_one_that_runs() {
    for (name, plane) in [("tcp", Plane::Classic), ("velo", Plane::Velo)] {
        let config = parse(&[
            ("DYN_RESPONSE_PLANE", name),
            ("DYN_TCP_RESPONSE_STREAM_HOST", "127.0.0.1"),
        ])
        .unwrap();
        if plane == Plane::Velo && !cfg!(feature = "tcp") {
            // Built without the velo transport: selecting it stops startup, saying why.
            let err = ResponseService::start(config).await.unwrap_err();
            assert!(err.to_string().contains("rebuild"), "{err}");
            continue;
        }
        let service = ResponseService::start(config).await.unwrap();
        assert_eq!(service.frontend().unwrap().plane(), plane);
        assert_eq!(service.worker().unwrap().plane(), plane);
        let (info, _pending) = service.register::<String>(Default::default()).unwrap();
        assert_eq!(
            info.transport,
            if plane == Plane::Classic {
                "tcp"
            } else {
                "velo-tcp"
            }
        );
        service.shutdown().await;
    }
}

#[tokio::test]
async fn a_listener_that_cannot_bind_fails_startup() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let config = parse(&[
        ("DYN_TCP_RESPONSE_STREAM_HOST", "127.0.0.1"),
        ("DYN_TCP_RESPONSE_STREAM_PORT", &port),
    ])
    .unwrap();
    let err = ResponseService::start(config).await.unwrap_err();
    assert!(matches!(err, StartupError::Plane(_)), "{err}");
    assert!(
        err.to_string().contains("cannot listen on 127.0.0.1"),
        "{err}"
    );
    let metrics_taken = parse(&[
        ("DYN_TCP_RESPONSE_STREAM_HOST", "127.0.0.1"),
        ("DYN_VELO_METRICS_ADDR", &format!("127.0.0.1:{port}")),
    ])
    .unwrap();
    let err = ResponseService::start(metrics_taken).await.unwrap_err();
    assert!(err.to_string().contains("cannot serve metrics"), "{err}");
}

#[test]
fn ucx_without_the_feature_is_a_startup_error_saying_to_rebuild() {
    let r = parse(&[
        ("DYN_RESPONSE_PLANE", "velo"),
        ("DYN_VELO_RESPONSE_TRANSPORT", "ucx"),
    ]);
    if cfg!(feature = "ucx") {
        assert!(r.is_ok());
    } else {
        assert!(
            r.unwrap_err()
                .to_string()
                .contains("rebuild with the `ucx` cargo feature")
        );
    }
}
