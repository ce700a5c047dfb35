//! The settings of this crate that every transport's configuration carries alike.

use std::time::Duration;

use velo_mux::MuxConfig;

use crate::{
    AcceptSettings, Backoff, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_READ_BUFFER, FrontendSettings, WorkerSettings,
};

/// What a transport's configuration carries for velo-session, the same in every transport:
/// the bound on a lane's handshake, a frontend's connection limit, each lane reader's buffer
/// and a worker's backoff. A transport hands them on as [`FrontendSettings`],
/// [`AcceptSettings`] and [`WorkerSettings`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSettings {
    /// Bound on the handshake of one lane (both sides), from the transport's connection on.
    pub handshake_timeout: Duration,
    /// Connections a frontend holds at most (lanes plus handshakes in progress); more are
    /// refused with CLOSE `limit`.
    pub max_connections: usize,
    /// Each lane reader's buffer, in bytes.
    pub read_buffer: usize,
    /// Backoff between failed preparations of one frontend (worker).
    pub backoff: Backoff,
}

impl Default for SessionSettings {
    fn default() -> Self {
        Self {
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            read_buffer: DEFAULT_READ_BUFFER,
            backoff: Backoff::default(),
        }
    }
}

impl SessionSettings {
    /// A frontend endpoint's settings with `mux` (a frontend-side configuration).
    pub fn frontend(&self, mux: MuxConfig) -> FrontendSettings {
        FrontendSettings {
            mux,
            read_buffer: self.read_buffer,
        }
    }

    /// The bounds of a frontend's accept loop.
    pub fn accept(&self) -> AcceptSettings {
        AcceptSettings {
            handshake_timeout: self.handshake_timeout,
            max_connections: self.max_connections,
        }
    }

    /// A worker endpoint's settings with `mux` (a worker-side configuration), the rest at
    /// their defaults.
    pub fn worker(&self, mux: MuxConfig) -> WorkerSettings {
        WorkerSettings {
            backoff: self.backoff,
            read_buffer: self.read_buffer,
            handshake_timeout: self.handshake_timeout,
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
