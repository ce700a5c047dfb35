//! The velo-rs benchmark: a mock LLM serving fleet (Dynamo's mocker timing model), closed- and
//! open-loop loads, and a side-by-side report of response planes.
//!
//! The binary runs as an orchestrator that spawns, for every run of every arm, fresh frontend
//! and worker processes of itself (hidden `frontend` and `worker` roles), so that CPU time is
//! attributed per process from `/proc/<pid>/stat` and nothing carries over between runs.
//! The roles are generic over the [`adapter`] traits, and their command line ([`roles`]) is
//! shared, so the peer arms reuse the same fleet, load and measurement with Dynamo's planes and
//! the published Velo: each peer is a binary of its own cargo workspace under `peers/`
//! (feature `peers`), which the orchestrator builds before its first run ([`peers`]).

#![allow(clippy::cast_precision_loss)] // figures are reported as f64; counts stay far below 2^52

pub mod adapter;
pub mod arms;
pub mod engine_stats;
pub mod frontend;
pub mod hostile;
pub mod item;
pub mod mocker;
pub mod netns;
pub mod open_loop;
pub mod orchestrate;
pub mod peers;
pub mod plots;
pub mod procfs;
pub mod protocol;
pub mod report;
pub mod reqplane;
pub mod roles;
pub mod suite;
pub mod worker;
