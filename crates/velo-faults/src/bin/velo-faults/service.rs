//! What the frontend and worker roles share: their command line, the service they start, the
//! items they exchange and how they print events.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use runtime_glue::{ENV_GRACE_MS, ResponseService, Role, ServiceConfig};
use serde::{Deserialize, Serialize};
use velo_faults::protocol::{Event, to_line};

/// A role process's settings.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct RoleArgs {
    /// Response plane: `velo` or `tcp`.
    #[arg(long)]
    pub(crate) plane: String,
    /// The velo plane's idle timeout, ms.
    #[arg(long)]
    pub(crate) idle_ms: u64,
    /// Shutdown grace, ms.
    #[arg(long, default_value_t = 4000)]
    pub(crate) grace_ms: u64,
    /// Where a frontend listens and what it advertises.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub(crate) host: IpAddr,
}

impl RoleArgs {
    /// The arguments that reproduce these settings on a child's command line.
    pub(crate) fn to_args(&self) -> Vec<String> {
        vec![
            "--plane".into(),
            self.plane.clone(),
            "--idle-ms".into(),
            self.idle_ms.to_string(),
            "--grace-ms".into(),
            self.grace_ms.to_string(),
            "--host".into(),
            self.host.to_string(),
        ]
    }
}

/// Starts the service for `role` as `args` say; nothing is read from the environment, so a
/// run does not depend on the shell it was started from.
pub(crate) async fn start(role: Role, args: &RoleArgs) -> Result<ResponseService, String> {
    let (plane, host, grace) = (
        args.plane.clone(),
        args.host.to_string(),
        args.grace_ms.to_string(),
    );
    let config = ServiceConfig::from_lookup(role, |var| match var {
        response_plane::ENV_PLANE => Some(plane.clone()),
        response_plane::ENV_HOST => Some(host.clone()),
        ENV_GRACE_MS => Some(grace.clone()),
        _ => None,
    })
    .map_err(|e| e.to_string())?;
    let plane = config
        .response_plane()
        .to_builder()
        .idle_timeout(Duration::from_millis(args.idle_ms))
        .build()
        .map_err(|e| e.to_string())?;
    let config = config
        .to_builder()
        .response_plane(plane)
        .build()
        .map_err(|e| e.to_string())?;
    ResponseService::start(config)
        .await
        .map_err(|e| e.to_string())
}

/// An item as the worker sends it.
#[derive(Debug, Serialize)]
pub(crate) struct ItemOut<'a> {
    /// Position in the stream, from 0.
    pub(crate) seq: u64,
    /// Padding to the configured item size.
    pub(crate) pad: &'a str,
}

/// An item as the frontend reads it (the padding is skipped, not kept).
#[derive(Debug, Deserialize)]
pub(crate) struct ItemIn {
    /// Position in the stream, from 0.
    pub(crate) seq: u64,
    #[allow(dead_code)]
    pad: serde::de::IgnoredAny,
}

/// Prints one event line (stdout is line-buffered; the harness reads every line).
pub(crate) fn emit(event: &Event) {
    println!("{}", to_line(event));
}
