//! The fault harness of the response plane: the pieces that prove it never hangs and never
//! grows without bound when the network or a peer misbehaves.
//!
//! - [`proxy`]: a user-space TCP fault proxy (loopback only, bounded): pass, delay, stall,
//!   stop reading, reset, cut after N bytes, per direction, switchable at run time.
//! - [`netns`]: packet loss between two network namespaces (veth pair plus nftables).
//! - [`protocol`]: the line protocol between the harness and the frontend and worker
//!   processes it runs, and the connection-info rewrites (address, forged tickets).
//!
//! The `velo-faults` binary runs the scenarios (`cargo xtask faults`): fresh frontend and
//! worker processes of itself per scenario and plane, faults injected through the proxy,
//! signals and namespaces, and one table of detection times, hanging streams, sibling
//! delivery and frontend memory. `velo-faults proxy` runs a proxy driven over standard input
//! for the soak (`cargo xtask soak --faults`).
//!
//! # Layer contract
//!
//! Tooling at the top of the workspace: nothing depends on this crate. The library never
//! sends a byte off this machine (the proxy forwards to loopback addresses only; the lossy
//! link exists only between namespaces it made), and every task it starts stops on
//! [`proxy::FaultProxy::shutdown`].
//!
//! # Example
//!
//! ```no_run
//! # async fn demo(frontend: std::net::SocketAddr) -> Result<(), velo_faults::proxy::ProxyError> {
//! use velo_faults::proxy::{Direction, Fault, FaultProxy, ProxyConfig};
//!
//! let proxy = FaultProxy::bind(frontend, ProxyConfig::default()).await?;
//! // ... point a worker at proxy.local_addr() (velo_faults::protocol::rewrite_addr) ...
//! proxy.set(Direction::ToUpstream, Fault::Stall); // the worker's lanes are blackholed
//! proxy.shutdown().await;
//! # Ok(()) }
//! ```

pub mod netns;
pub mod protocol;
pub mod proxy;
