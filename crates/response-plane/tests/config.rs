//! Plane selection from the environment: every bad value stops startup with a message naming
//! the variable, the value and what is allowed; nothing falls back silently.

use std::collections::HashMap;
use std::time::Duration;

use response_plane::{Batching, ConfigError, Plane, ResponsePlaneConfig, VeloTransport};

fn parse(vars: &[(&str, &str)]) -> Result<ResponsePlaneConfig, ConfigError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    ResponsePlaneConfig::from_lookup(|k| map.get(k).cloned())
}

#[test]
fn defaults_are_the_classic_plane_and_a_5_ms_batch() {
    let c = parse(&[]).unwrap();
    assert_eq!(c.plane(), Plane::Classic);
    assert_eq!(c.transport(), VeloTransport::Tcp);
    assert_eq!(c.batching(), Batching::Delay(Duration::from_millis(5)));
    assert_eq!(c.port(), 0);
    assert_eq!(c.max_message_size(), 33_554_432);
    assert_eq!(
        c.compression(),
        response_plane::Compression::Lz4,
        "on TCP lanes"
    );
}

#[test]
fn valid_values_select_what_they_name() {
    let c = parse(&[
        ("DYN_RESPONSE_PLANE", "velo"),
        ("DYN_VELO_RESPONSE_TRANSPORT", "tcp"),
        ("DYN_VELO_RESPONSE_BATCH_MS", "0"),
        ("DYN_TCP_RESPONSE_STREAM_HOST", "127.0.0.1"),
        ("DYN_TCP_RESPONSE_STREAM_PORT", "8123"),
        ("DYN_TCP_MAX_MESSAGE_SIZE", "1048576"),
    ])
    .unwrap();
    assert_eq!(c.plane(), Plane::Velo);
    assert_eq!(c.batching(), Batching::Greedy);
    assert_eq!(c.host(), Some("127.0.0.1".parse().unwrap()));
    assert_eq!(c.port(), 8123);
    assert_eq!(c.max_message_size(), 1_048_576);
    assert_eq!(
        parse(&[("DYN_VELO_RESPONSE_BATCH_MS", "12")])
            .unwrap()
            .batching(),
        Batching::Delay(Duration::from_millis(12))
    );
    assert_eq!(
        parse(&[("DYN_VELO_COMPRESSION", "none")])
            .unwrap()
            .compression(),
        response_plane::Compression::None
    );
    let ucx = ResponsePlaneConfig::builder()
        .transport(VeloTransport::Ucx)
        .build()
        .unwrap();
    assert_eq!(
        ucx.compression(),
        response_plane::Compression::None,
        "on UCX"
    );
    assert_eq!(
        parse(&[("DYN_RESPONSE_PLANE", "tcp")]).unwrap().plane(),
        Plane::Classic
    );
}

#[test]
fn the_liveness_bound_of_both_planes_is_set_in_milliseconds() {
    assert_eq!(
        parse(&[]).unwrap().idle_timeout(),
        Duration::from_secs(10),
        "default"
    );
    for plane in ["tcp", "velo"] {
        let c = parse(&[
            ("DYN_RESPONSE_PLANE", plane),
            ("DYN_VELO_IDLE_TIMEOUT_MS", "2500"),
        ])
        .unwrap();
        assert_eq!(c.idle_timeout(), Duration::from_millis(2500), "{plane}");
    }
}

#[test]
fn every_bad_value_fails_with_its_variable_value_and_what_is_allowed() {
    let cases: &[(&str, &str, &str)] = &[
        ("DYN_RESPONSE_PLANE", "", "`tcp` (the default) or `velo`"),
        (
            "DYN_RESPONSE_PLANE",
            "quic",
            "`tcp` (the default) or `velo`",
        ),
        (
            "DYN_RESPONSE_PLANE",
            "VELO",
            "`tcp` (the default) or `velo`",
        ),
        (
            "DYN_RESPONSE_PLANE",
            " velo",
            "`tcp` (the default) or `velo`",
        ),
        (
            "DYN_VELO_RESPONSE_TRANSPORT",
            "",
            "`tcp` (the default) or `ucx`",
        ),
        (
            "DYN_VELO_RESPONSE_TRANSPORT",
            "rdma",
            "`tcp` (the default) or `ucx`",
        ),
        (
            "DYN_VELO_COMPRESSION",
            "",
            "`lz4` (the default on TCP lanes) or `none`",
        ),
        (
            "DYN_VELO_COMPRESSION",
            "zstd",
            "`lz4` (the default on TCP lanes) or `none`",
        ),
        (
            "DYN_VELO_COMPRESSION",
            "LZ4",
            "`lz4` (the default on TCP lanes) or `none`",
        ),
        ("DYN_VELO_RESPONSE_BATCH_MS", "", "positive integer"),
        ("DYN_VELO_RESPONSE_BATCH_MS", "-1", "positive integer"),
        ("DYN_VELO_RESPONSE_BATCH_MS", "2.5", "positive integer"),
        ("DYN_VELO_RESPONSE_BATCH_MS", "five", "positive integer"),
        ("DYN_VELO_RESPONSE_BATCH_MS", "+5", "positive integer"),
        ("DYN_VELO_RESPONSE_BATCH_MS", " 5", "positive integer"),
        ("DYN_VELO_RESPONSE_BATCH_MS", "10001", "up to 10000"),
        (
            "DYN_VELO_RESPONSE_BATCH_MS",
            "99999999999999999999999",
            "up to 10000",
        ),
        ("DYN_VELO_IDLE_TIMEOUT_MS", "", "100 to 3600000"),
        ("DYN_VELO_IDLE_TIMEOUT_MS", "1", "100 to 3600000"),
        ("DYN_VELO_IDLE_TIMEOUT_MS", "3600001", "100 to 3600000"),
        ("DYN_VELO_IDLE_TIMEOUT_MS", "10s", "100 to 3600000"),
        ("DYN_TCP_RESPONSE_STREAM_HOST", "", "IPv4 or IPv6"),
        ("DYN_TCP_RESPONSE_STREAM_HOST", "not-an-ip", "IPv4 or IPv6"),
        ("DYN_TCP_RESPONSE_STREAM_PORT", "", "0..=65535"),
        ("DYN_TCP_RESPONSE_STREAM_PORT", "70000", "0..=65535"),
        ("DYN_TCP_RESPONSE_STREAM_PORT", "-1", "0..=65535"),
        ("DYN_TCP_MAX_MESSAGE_SIZE", "", "4096 to 1073741824"),
        ("DYN_TCP_MAX_MESSAGE_SIZE", "100", "4096 to 1073741824"),
        ("DYN_TCP_MAX_MESSAGE_SIZE", "lots", "4096 to 1073741824"),
    ];
    for (var, value, allowed) in cases {
        let err = parse(&[(var, value)]).expect_err(&format!("{var}={value:?} must be refused"));
        let msg = err.to_string();
        assert!(matches!(err, ConfigError::InvalidEnv { .. }), "{msg}");
        assert!(msg.contains(var), "{msg} names the variable");
        assert!(msg.contains(&format!("{value:?}")), "{msg} names the value");
        assert!(msg.contains(allowed), "{msg} says what is allowed");
    }
}

#[test]
fn ucx_without_the_feature_says_to_rebuild_with_it() {
    let r = parse(&[
        ("DYN_RESPONSE_PLANE", "velo"),
        ("DYN_VELO_RESPONSE_TRANSPORT", "ucx"),
    ]);
    if cfg!(feature = "ucx") {
        assert!(r.is_ok());
    } else {
        let msg = r.unwrap_err().to_string();
        assert!(
            msg.contains("ucx") && msg.contains("rebuild with the `ucx` cargo feature"),
            "{msg}"
        );
    }
}
