//! The arms: which plane, configured how. The list is open: peer arms run a separate binary
//! (`peers/`) that speaks the same role protocol.

use std::time::Duration;

use response_plane::{Batching, Plane, ResponsePlaneConfig, VeloTransport};

/// Which binary runs an arm's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runner {
    /// This binary.
    Ours,
    /// The peer-arms binary built from `peers/`.
    Peers,
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
}

/// Every arm this build knows, in report order.
pub fn all() -> Vec<Arm> {
    let mut arms = vec![
        Arm {
            name: "velo-tcp-5ms",
            about: "velo plane, TCP lanes, 5 ms batching (Dynamo PR #15231's default)",
            runner: Runner::Ours,
        },
        Arm {
            name: "velo-tcp-greedy",
            about: "velo plane, TCP lanes, greedy flush (0 ms)",
            runner: Runner::Ours,
        },
        Arm {
            name: "velo-tcp-pass",
            about: "velo plane, TCP lanes, flushed once per forward pass (5 ms cap)",
            runner: Runner::Ours,
        },
    ];
    if cfg!(feature = "ucx") {
        arms.push(Arm {
            name: "velo-ucx",
            about: "velo plane, UCX lanes, flushed once per forward pass",
            runner: Runner::Ours,
        });
    }
    arms.push(Arm {
        name: "tcp",
        about: "classic plane: one TCP connection per stream",
        runner: Runner::Ours,
    });
    if cfg!(feature = "peers") {
        arms.push(Arm {
            name: "dynamo-tcp",
            about: "Dynamo 1.6.1's classic TCP plane (dynamo-runtime)",
            runner: Runner::Peers,
        });
        arms.push(Arm {
            name: "dynamo-quic",
            about: "Dynamo 1.6.1's QUIC plane (dynamo-runtime)",
            runner: Runner::Peers,
        });
        arms.push(Arm {
            name: "velo-0.21",
            about: "the published velo 0.21 as Dynamo configures it",
            runner: Runner::Peers,
        });
    }
    arms
}

/// The arms named in `spec` (comma-separated, or `all`).
///
/// # Errors
///
/// A message naming an unknown arm and listing the known ones.
pub fn select(spec: &str) -> Result<Vec<Arm>, String> {
    let known = all();
    if spec == "all" {
        return Ok(known);
    }
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

/// Our plane's configuration for arm `name`, and whether its engines flush once per pass.
///
/// # Errors
///
/// For a name that is not one of our arms.
pub fn our_config(name: &str) -> Result<(ResponsePlaneConfig, bool), String> {
    let mut c = ResponsePlaneConfig::default();
    c.host = Some("127.0.0.1".parse().expect("a valid address"));
    let five = Batching::Delay(Duration::from_millis(5));
    let flush = match name {
        "velo-tcp-5ms" => {
            (c.plane, c.batching) = (Plane::Velo, five);
            false
        }
        "velo-tcp-greedy" => {
            (c.plane, c.batching) = (Plane::Velo, Batching::Greedy);
            false
        }
        "velo-tcp-pass" => {
            (c.plane, c.batching) = (Plane::Velo, five);
            true
        }
        "velo-ucx" => {
            (c.plane, c.transport, c.batching) = (Plane::Velo, VeloTransport::Ucx, five);
            true
        }
        "tcp" => false,
        other => return Err(format!("{other:?} is not one of this binary's arms")),
    };
    Ok((c, flush))
}
