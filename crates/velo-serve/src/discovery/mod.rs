//! Finding workers: Dynamo's file-backed discovery (`DYN_DISCOVERY_BACKEND=file`).
//!
//! Layout, as Dynamo's file store keeps it: under the root `DYN_FILE_KV` (default
//! `$TMPDIR/dynamo_store_kv`), the bucket directory `v1/instances` holds one file per worker
//! instance, named by its key `{namespace}/{component}/{endpoint}/{instance_id:x}`
//! percent-encoded (every byte but ASCII letters and digits), holding the instance as JSON
//! (`{"type":"Endpoint","namespace":...,"instance_id":...,"transport":{"tcp":"host:port"}}`).
//! Files are published atomically (written as `.tmp_*`, then renamed).
//!
//! A file's modification time is its lease: its worker touches it every third of the TTL
//! ([`lease`]) and deletes it on a clean exit; readers treat a file older than the TTL as
//! expired, delete it and report the instance removed ([`watch`]). Readers watch the
//! directory with `notify` and also rescan it every third of the TTL, so a removal is seen at
//! once and an expiry within 4/3 of the TTL after the worker's last touch.

pub mod lease;
pub mod watch;

use std::path::{Path, PathBuf};
use std::time::Duration;

use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use serde::{Deserialize, Serialize};

/// `DYN_DISCOVERY_BACKEND`: only `file` is supported (the default here).
pub const ENV_BACKEND: &str = "DYN_DISCOVERY_BACKEND";
/// `DYN_FILE_KV`: the file store's root directory.
pub const ENV_FILE_KV: &str = "DYN_FILE_KV";
/// The bucket of endpoint instances.
pub const INSTANCES_BUCKET: &str = "v1/instances";
/// Prefix of files being written (never read).
pub const TEMP_PREFIX: &str = ".tmp_";
/// Default lease TTL: 10 s, as Dynamo's etcd lease and file store.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// Shortest TTL accepted.
pub const MIN_TTL: Duration = Duration::from_millis(300);
/// Longest TTL accepted.
pub const MAX_TTL: Duration = Duration::from_secs(3600);
/// Largest instance file read, in bytes (one is about 150).
pub const MAX_RECORD_BYTES: u64 = 64 * 1024;

/// Which endpoint's instances, where, and how long a lease lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryConfig {
    /// The store's root directory.
    pub root: PathBuf,
    /// Lease time to live.
    pub ttl: Duration,
    /// Dynamo namespace.
    pub namespace: String,
    /// Dynamo component.
    pub component: String,
    /// Dynamo endpoint.
    pub endpoint: String,
}

/// Why discovery cannot be configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoveryConfigError {
    /// A variable holds a value that is not allowed.
    #[error("invalid {var}={value:?}: {allowed}")]
    InvalidEnv {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is allowed.
        allowed: &'static str,
    },
    /// The TTL is out of range.
    #[error("invalid lease TTL {ttl:?}: must be 300 ms..=1 h")]
    Ttl {
        /// The TTL asked for.
        ttl: Duration,
    },
}

impl DiscoveryConfig {
    /// Reads `DYN_DISCOVERY_BACKEND` and `DYN_FILE_KV` through `lookup`, for Dynamo's default
    /// endpoint `dynamo/backend/generate`.
    ///
    /// # Errors
    ///
    /// A backend other than `file`, an empty root, a TTL out of range.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
        ttl: Duration,
    ) -> Result<Self, DiscoveryConfigError> {
        if let Some(b) = lookup(ENV_BACKEND).filter(|b| b != "file") {
            return Err(DiscoveryConfigError::InvalidEnv {
                var: ENV_BACKEND,
                value: b,
                allowed: "expected `file` (velo-serve supports Dynamo's file-backed discovery only)",
            });
        }
        let root = match lookup(ENV_FILE_KV) {
            Some(v) if v.is_empty() => {
                return Err(DiscoveryConfigError::InvalidEnv {
                    var: ENV_FILE_KV,
                    value: v,
                    allowed: "expected a directory path",
                });
            }
            Some(v) => PathBuf::from(v),
            None => std::env::temp_dir().join("dynamo_store_kv"),
        };
        if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
            return Err(DiscoveryConfigError::Ttl { ttl });
        }
        Ok(Self {
            root,
            ttl,
            namespace: "dynamo".into(),
            component: "backend".into(),
            endpoint: "generate".into(),
        })
    }

    /// The bucket directory.
    pub fn dir(&self) -> PathBuf {
        self.root.join(INSTANCES_BUCKET)
    }

    /// The key of `instance_id`: `{namespace}/{component}/{endpoint}/{instance_id:x}`.
    pub fn key(&self, instance_id: u64) -> String {
        format!(
            "{}/{}/{}/{instance_id:x}",
            self.namespace, self.component, self.endpoint
        )
    }

    /// The file of `instance_id`.
    pub fn path(&self, instance_id: u64) -> PathBuf {
        let key = self.key(instance_id);
        self.dir()
            .join(utf8_percent_encode(&key, NON_ALPHANUMERIC).to_string())
    }

    /// How often a lease is refreshed and readers rescan: a third of the TTL.
    pub fn refresh_interval(&self) -> Duration {
        self.ttl / 3
    }

    fn matches(&self, i: &Instance) -> bool {
        i.namespace == self.namespace
            && i.component == self.component
            && i.endpoint == self.endpoint
    }
}

/// A worker instance, as its discovery record says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    /// Dynamo namespace.
    pub namespace: String,
    /// Dynamo component.
    pub component: String,
    /// Dynamo endpoint.
    pub endpoint: String,
    /// The instance's id.
    pub instance_id: u64,
    /// Where its request plane listens.
    pub transport: Transport,
}

/// How to reach an instance's request plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// A TCP address, `host:port`.
    Tcp(String),
}

/// A record in the instances bucket (Dynamo's `DiscoveryInstance`, endpoint variant).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
enum Record {
    Endpoint(Instance),
}

impl Instance {
    /// The record's JSON.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(&Record::Endpoint(self.clone())).unwrap_or_default()
    }

    /// Parses a record.
    ///
    /// # Errors
    ///
    /// The JSON error (another record type included).
    pub fn from_json(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        let Record::Endpoint(i) = serde_json::from_slice(bytes)?;
        Ok(i)
    }

    /// The request plane's address.
    pub fn address(&self) -> Option<std::net::SocketAddr> {
        match &self.transport {
            Transport::Tcp(a) => a.parse().ok(),
        }
    }
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, then a rename.
fn publish(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let temp = dir.join(format!("{TEMP_PREFIX}{:016x}", rand::random::<u64>()));
    std::fs::write(&temp, bytes)?;
    std::fs::rename(&temp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&temp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_live_under_dynamos_key_layout_percent_encoded() {
        let c = DiscoveryConfig::from_lookup(
            |v| (v == ENV_FILE_KV).then(|| "/kv".to_owned()),
            DEFAULT_TTL,
        )
        .unwrap();
        assert_eq!(c.key(0x1a2b), "dynamo/backend/generate/1a2b");
        assert_eq!(
            c.path(0x1a2b),
            PathBuf::from("/kv/v1/instances/dynamo%2Fbackend%2Fgenerate%2F1a2b")
        );
        let i = Instance {
            namespace: "dynamo".into(),
            component: "backend".into(),
            endpoint: "generate".into(),
            instance_id: 7,
            transport: Transport::Tcp("127.0.0.1:9".into()),
        };
        let json: serde_json::Value = serde_json::from_slice(&i.to_json()).unwrap();
        assert_eq!(json["type"], "Endpoint");
        assert_eq!(json["transport"]["tcp"], "127.0.0.1:9");
        assert_eq!(Instance::from_json(&i.to_json()).unwrap(), i);
    }

    #[test]
    fn only_the_file_backend_is_accepted() {
        let e = DiscoveryConfig::from_lookup(
            |v| (v == ENV_BACKEND).then(|| "etcd".to_owned()),
            DEFAULT_TTL,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("invalid DYN_DISCOVERY_BACKEND=\"etcd\""),
            "{e}"
        );
        let e = DiscoveryConfig::from_lookup(|_| None, Duration::from_millis(1)).unwrap_err();
        assert!(matches!(e, DiscoveryConfigError::Ttl { .. }));
    }
}
