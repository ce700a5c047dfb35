//! The settings of this crate that every transport's configuration carries alike.

use std::time::Duration;

use velo_mux::MuxConfig;

use crate::{
    AcceptSettings, Backoff, ClusterSecret, DEFAULT_ESTABLISH_TIMEOUT, DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_HANDSHAKES, DEFAULT_MAX_HANDSHAKES_PER_SOURCE,
    DEFAULT_READ_BUFFER, FrontendSettings, WorkerSettings,
};

/// What a transport's configuration carries for velo-session, the same in every transport:
/// the bounds on a lane's handshake phases, a frontend's connection and handshake limits, each
/// lane reader's buffer, a worker's backoff, the cluster secret and the worker's instance. A transport hands them on as [`FrontendSettings`],
/// [`AcceptSettings`] and [`WorkerSettings`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSettings {
    /// Bound on the HELLO exchange of one lane (both sides; a worker's includes dialing).
    pub handshake_timeout: Duration,
    /// Bound on a frontend's transport handshake (TLS) of one lane, before its HELLO.
    pub establish_timeout: Duration,
    /// Lanes a frontend holds at most; more are refused with CLOSE `limit`.
    pub max_connections: usize,
    /// Connections a frontend has in their handshake at once, in total (apart from lanes).
    pub max_handshakes: usize,
    /// Connections a frontend has in their handshake at once from one source address.
    pub max_handshakes_per_source: usize,
    /// The cluster secret proved in every handshake (both sides); `None` for none.
    pub secret: Option<ClusterSecret>,
    /// A worker's discovery instance, announced in its HELLOs.
    pub worker_instance: Option<u64>,
    /// Each lane reader's buffer, in bytes.
    pub read_buffer: usize,
    /// Backoff between failed preparations of one frontend (worker).
    pub backoff: Backoff,
}

impl Default for SessionSettings {
    fn default() -> Self {
        Self {
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            establish_timeout: DEFAULT_ESTABLISH_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_handshakes: DEFAULT_MAX_HANDSHAKES,
            max_handshakes_per_source: DEFAULT_MAX_HANDSHAKES_PER_SOURCE,
            read_buffer: DEFAULT_READ_BUFFER,
            backoff: Backoff::default(),
            secret: None,
            worker_instance: None,
        }
    }
}

impl SessionSettings {
    /// A frontend endpoint's settings with `mux` (a frontend-side configuration).
    pub fn frontend(&self, mux: MuxConfig) -> FrontendSettings {
        FrontendSettings {
            mux,
            read_buffer: self.read_buffer,
            secret: self.secret.clone(),
        }
    }

    /// The bounds of a frontend's accept loop.
    pub fn accept(&self) -> AcceptSettings {
        AcceptSettings {
            establish_timeout: self.establish_timeout,
            handshake_timeout: self.handshake_timeout,
            max_connections: self.max_connections,
            max_handshakes: self.max_handshakes,
            max_handshakes_per_source: self.max_handshakes_per_source,
        }
    }

    /// A worker endpoint's settings with `mux` (a worker-side configuration), the rest at
    /// their defaults.
    pub fn worker(&self, mux: MuxConfig) -> WorkerSettings {
        WorkerSettings {
            backoff: self.backoff,
            read_buffer: self.read_buffer,
            handshake_timeout: self.handshake_timeout,
            secret: self.secret.clone(),
            worker_instance: self.worker_instance,
            ..WorkerSettings::new(mux)
        }
    }
}

impl WorkerSettings {
    /// The session settings these carry, the frontend's connection limit at its default: what
    /// a transport's configuration holds for a worker.
    pub fn session(&self) -> SessionSettings {
        SessionSettings {
            handshake_timeout: self.handshake_timeout,
            read_buffer: self.read_buffer,
            backoff: self.backoff,
            secret: self.secret.clone(),
            worker_instance: self.worker_instance,
            ..SessionSettings::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use velo_mux::Side;

    use super::*;

    #[test]
    fn a_worker_keeps_the_session_settings_it_was_made_from() {
        let session = SessionSettings {
            handshake_timeout: Duration::from_millis(1234),
            read_buffer: 4321,
            backoff: Backoff {
                min: Duration::from_millis(7),
                max: Duration::from_millis(70),
            },
            ..SessionSettings::default()
        };
        let mux = MuxConfig::builder(Side::Worker).build().unwrap();
        assert_eq!(session.worker(mux).session(), session);
    }
}
