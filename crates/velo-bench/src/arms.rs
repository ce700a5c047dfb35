//! The arms: which plane, configured how. The list is open: peer arms run binaries built from
//! their own cargo workspaces under `peers/`, which speak the same role protocol
//! ([`crate::roles`]).

use std::net::IpAddr;
use std::time::Duration;

use response_plane::{Batching, Plane, ResponsePlaneConfig, TlsConfig, VeloTransport};

/// Which binary runs an arm's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runner {
    /// This binary.
    Ours,
    /// A peer binary, built from its workspace under `peers/`.
    Peer(PeerBin),
}

/// A peer-arms binary and the cargo workspace it is built in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PeerBin {
    /// The workspace's directory under `peers/`.
    pub workspace: &'static str,
    /// The binary's name.
    pub binary: &'static str,
}

/// Dynamo 1.6.1's planes (dynamo-runtime pins tokio =1.52.4 and needs `--cfg tokio_unstable`).
pub const DYNAMO: PeerBin = PeerBin {
    workspace: "dynamo",
    binary: "velo-bench-dynamo",
};

/// The published velo 0.21 (needs tokio ^1.54, so it cannot share Dynamo's workspace).
pub const VELO_021: PeerBin = PeerBin {
    workspace: "velo021",
    binary: "velo-bench-velo021",
};

/// How an arm's connections are counted at mid-window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conns {
    /// Established TCP connections to the frontend's response port.
    FrontendTcpPort,
    /// UDP sockets of the worker processes (a QUIC client endpoint per connection).
    WorkerUdpSockets,
}

/// One arm of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arm {
    /// Its name in `--arms` and in the report.
    pub name: &'static str,
    /// What it is.
    pub about: &'static str,
    /// Which binary runs it.
    pub runner: Runner,
    /// How its connections are counted.
    pub conns: Conns,
    /// Whether its processes run with TLS (`DYN_TCP_TLS_*` pointing at a PKI generated for
    /// the run: the frontend's certificate and key, the workers' CA).
    pub tls: bool,
}

impl Arm {
    const fn ours(name: &'static str, about: &'static str) -> Self {
        Self {
            name,
            about,
            runner: Runner::Ours,
            conns: Conns::FrontendTcpPort,
            tls: false,
        }
    }

    const fn with_tls(self) -> Self {
        Self { tls: true, ..self }
    }

    const fn peer(name: &'static str, about: &'static str, bin: PeerBin) -> Self {
        Self {
            name,
            about,
            runner: Runner::Peer(bin),
            conns: Conns::FrontendTcpPort,
            tls: false,
        }
    }
}

/// Every arm this build knows, in report order.
pub fn all() -> Vec<Arm> {
    let mut arms = vec![
        Arm::ours(
            "velo-tcp-5ms",
            "velo plane, TCP lanes, 5 ms batching (Dynamo PR #15231's default), LZ4-packed batches",
        ),
        Arm::ours(
            "velo-tcp-greedy",
            "velo plane, TCP lanes, greedy flush (0 ms)",
        ),
        Arm::ours(
            "velo-tcp-pass",
            "velo plane, TCP lanes, flushed once per forward pass (5 ms cap)",
        ),
    ];
    if cfg!(feature = "ucx") {
        arms.push(Arm::ours(
            "velo-ucx",
            "velo plane, UCX lanes, flushed once per forward pass",
        ));
    }
    arms.push(Arm::ours(
        "tcp",
        "classic plane: one TCP connection per stream",
    ));
    arms.push(
        Arm::ours(
            "velo-tcp-5ms-tls",
            "velo-tcp-5ms with TLS on every lane (DYN_TCP_TLS_*)",
        )
        .with_tls(),
    );
    arms.push(
        Arm::ours(
            "tcp-tls",
            "classic plane with TLS on every connection (DYN_TCP_TLS_*)",
        )
        .with_tls(),
    );
    if cfg!(feature = "peers") {
        arms.extend(peer_arms());
    }
    arms
}

/// Arms run only when named in `--arms`, never by `all`: `velo-tcp-5ms-lazy` and
/// `velo-tcp-5ms-lazy-end`, which show what eager edges and eager ends change,
/// `velo-tcp-5ms-raw`, which shows what packing batches changes, and
/// `dynamo-tcp-tls` (feature `peers`), Dynamo's classic plane with its
/// own TLS, which CI's peer smoke run does not cover.
fn named_only() -> Vec<Arm> {
    let mut arms = vec![
        Arm::ours(
            "velo-tcp-5ms-lazy",
            "diagnostic: velo-tcp-5ms without eager edges (prologue, first item and end wait for the batch)",
        ),
        Arm::ours(
            "velo-tcp-5ms-eager-open",
            "diagnostic: velo-tcp-5ms whose prologues go at once too (not with the first item or the batch)",
        ),
        Arm::ours(
            "velo-tcp-5ms-raw",
            "diagnostic: velo-tcp-5ms sending its batches unpacked (DYN_VELO_COMPRESSION=none)",
        ),
        Arm::ours(
            "velo-tcp-5ms-lazy-end",
            "diagnostic: velo-tcp-5ms whose ends wait for the batch (prologue and first item still go at once)",
        ),
    ];
    if cfg!(feature = "peers") {
        arms.push(
            Arm::peer(
                "dynamo-tcp-tls",
                "dynamo-tcp with Dynamo's own TLS switched on by its DYN_TCP_TLS_* variables",
                DYNAMO,
            )
            .with_tls(),
        );
    }
    arms
}

/// The peer arms (feature `peers`).
fn peer_arms() -> [Arm; 6] {
    [
        Arm::peer(
            "dynamo-tcp",
            "Dynamo 1.6.1's classic TCP plane (dynamo-runtime), our request channel",
            DYNAMO,
        ),
        Arm::peer(
            "dynamo-tcp-drt",
            "Dynamo 1.6.1's classic TCP plane, Dynamo's TCP request plane (as dynamo-quic)",
            DYNAMO,
        ),
        Arm {
            conns: Conns::WorkerUdpSockets,
            ..Arm::peer(
                "dynamo-quic",
                "Dynamo 1.6.1's QUIC plane (dynamo-runtime), Dynamo's TCP request plane",
                DYNAMO,
            )
        },
        Arm::peer(
            "velo-0.21",
            "the published velo 0.21 as Dynamo configures it: mux only, credit 32, 4 lanes, greedy flush",
            VELO_021,
        ),
        Arm::peer(
            "velo-0.21-5ms",
            "velo 0.21 tuned: as velo-0.21 with a 5 ms linger (as velo-tcp-5ms)",
            VELO_021,
        ),
        Arm::peer(
            "velo-0.21-pass",
            "velo 0.21 tuned: as velo-0.21-5ms, flushed once per forward pass (as velo-tcp-pass)",
            VELO_021,
        ),
    ]
}

/// The arms named in `spec` (comma-separated, or `all`).
///
/// # Errors
///
/// A message naming an unknown arm and listing the known ones.
pub fn select(spec: &str) -> Result<Vec<Arm>, String> {
    let mut known = all();
    if spec == "all" {
        return Ok(known);
    }
    known.extend(named_only());
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|name| {
            known
                .iter()
                .find(|a| a.name == name)
                .copied()
                .ok_or_else(|| {
                    let names: Vec<_> = known.iter().map(|a| a.name).collect();
                    format!("unknown arm {name:?}; this build has: {}", names.join(", "))
                })
        })
        .collect()
}

/// Our plane's configuration for arm `name` on loopback, and whether its engines flush once
/// per pass.
///
/// # Errors
///
/// For a name that is not one of our arms.
pub fn our_config(name: &str) -> Result<(ResponsePlaneConfig, bool), String> {
    our_config_at(name, std::net::Ipv4Addr::LOCALHOST.into())
}

/// As [`our_config`], the frontend listening on (and giving workers) `host`.
///
/// # Errors
///
/// For a name that is not one of our arms.
pub fn our_config_at(name: &str, host: IpAddr) -> Result<(ResponsePlaneConfig, bool), String> {
    let five = Batching::Delay(Duration::from_millis(5));
    let velo = |transport, batching| {
        ResponsePlaneConfig::builder()
            .plane(Plane::Velo)
            .transport(transport)
            .batching(batching)
    };
    let (builder, flush) = match name {
        "velo-tcp-5ms" => (velo(VeloTransport::Tcp, five), false),
        "velo-tcp-greedy" => (velo(VeloTransport::Tcp, Batching::Greedy), false),
        "velo-tcp-pass" => (velo(VeloTransport::Tcp, five), true),
        "velo-tcp-5ms-lazy" => (velo(VeloTransport::Tcp, five).eager_edges(false), false),
        "velo-tcp-5ms-lazy-end" => (velo(VeloTransport::Tcp, five).eager_ends(false), false),
        "velo-tcp-5ms-eager-open" => (velo(VeloTransport::Tcp, five).eager_opens(true), false),
        "velo-ucx" => (velo(VeloTransport::Ucx, five), true),
        "tcp" => (ResponsePlaneConfig::builder().plane(Plane::Classic), false),
        "velo-tcp-5ms-tls" => (velo(VeloTransport::Tcp, five).tls(tls_from_env()), false),
        "velo-tcp-5ms-raw" => (
            velo(VeloTransport::Tcp, five).compression(response_plane::Compression::None),
            false,
        ),
        "tcp-tls" => (
            ResponsePlaneConfig::builder()
                .plane(Plane::Classic)
                .tls(tls_from_env()),
            false,
        ),
        other => return Err(format!("{other:?} is not one of this binary's arms")),
    };
    let config = builder
        .host(Some(host))
        .build()
        .map_err(|e| format!("arm {name:?}: {e}"))?;
    Ok((config, flush))
}

/// The TLS settings the orchestrator hands a TLS arm's processes ([`tls_env`]).
fn tls_from_env() -> TlsConfig {
    let path = |var| std::env::var_os(var).map(std::path::PathBuf::from);
    TlsConfig {
        cert: path(response_plane::ENV_TLS_CERT_PATH),
        key: path(response_plane::ENV_TLS_KEY_PATH),
        ca: path(response_plane::ENV_TLS_CA_CERT_PATH),
        ..TlsConfig::default()
    }
}

/// Whether arm `name` runs with TLS.
pub fn is_tls(name: &str) -> bool {
    all()
        .into_iter()
        .chain(named_only())
        .any(|a| a.name == name && a.tls)
}

/// The environment of a TLS arm's processes: Dynamo's variables pointing at `pki`'s files
/// (the frontend serves `server.pem`, workers verify it against `ca.pem`). Every process of
/// the arm gets all of them, as a cluster would; our planes and Dynamo's read the same ones.
pub fn tls_env(pki: &velo_tls::testing::TestPki) -> Vec<(&'static str, String)> {
    let p = |n: &str| pki.path(n).display().to_string();
    vec![
        (response_plane::ENV_TLS_CERT_PATH, p("server.pem")),
        (response_plane::ENV_TLS_KEY_PATH, p("server.key")),
        (response_plane::ENV_TLS_CA_CERT_PATH, p("ca.pem")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_arm_of_ours_without_tls_has_a_configuration_and_lazy_edges_only_by_name() {
        let mut arms = all();
        arms.extend(named_only());
        for arm in arms
            .iter()
            .filter(|a| a.runner == Runner::Ours && !a.tls && a.name != "velo-ucx")
        {
            assert!(
                our_config(arm.name).is_ok(),
                "{}: no configuration",
                arm.name
            );
        }
        let (lazy, _) = our_config("velo-tcp-5ms-lazy").unwrap();
        assert!(!lazy.eager_edges());
        let (lazy_end, _) = our_config("velo-tcp-5ms-lazy-end").unwrap();
        assert!(lazy_end.eager_edges() && !lazy_end.eager_ends());
        let (raw, _) = our_config("velo-tcp-5ms-raw").unwrap();
        assert_eq!(raw.compression(), response_plane::Compression::None);
        assert_eq!(
            our_config("velo-tcp-5ms").unwrap().0.compression(),
            response_plane::Compression::Lz4
        );
        assert!(all().iter().all(|a| a.name != "velo-tcp-5ms-lazy"));
        assert_eq!(select("velo-tcp-5ms-lazy").unwrap().len(), 1);
    }
}
