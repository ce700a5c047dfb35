//! The settings of this crate that every transport's configuration carries alike, valid by
//! construction: [`SessionSettings::builder`] checks every value when built.

use std::time::Duration;

use velo_mux::{ConfigError, MuxConfig};

use crate::{
    AcceptSettings, Backoff, ClusterSecret, DEFAULT_ESTABLISH_TIMEOUT, DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_HANDSHAKES, DEFAULT_MAX_HANDSHAKES_PER_SOURCE,
    DEFAULT_READ_BUFFER, FrontendSettings, WorkerSettings,
};

/// Shortest handshake, establish or backoff bound accepted: 1 ms.
const MIN_BOUND: Duration = Duration::from_millis(1);
/// Longest handshake, establish or backoff bound accepted: 1 h (a deadline is computed from
/// it, and nothing legitimate waits longer).
const MAX_BOUND: Duration = Duration::from_secs(3600);
/// Most connections or handshakes a limit may allow: tokio's semaphore limit, which the
/// accept loop's places are (a larger one would panic when the frontend binds).
const MAX_LIMIT: usize = tokio::sync::Semaphore::MAX_PERMITS;
/// Smallest lane reader buffer accepted: 1 KiB (a reader whose buffer fills without room to
/// grow would read nothing and take the lane for closed).
const MIN_READ_BUFFER: usize = 1024;
/// Largest lane reader buffer accepted: 1 GiB (the largest frame).
const MAX_READ_BUFFER: usize = 1 << 30;

/// What a transport's configuration carries for velo-session, the same in every transport:
/// the bounds on a lane's handshake phases, a frontend's connection and handshake limits, each
/// lane reader's buffer, a worker's backoff, the cluster secret and the worker's instance. A
/// transport hands them on as [`FrontendSettings`], [`AcceptSettings`] and [`WorkerSettings`].
///
/// Valid by construction: build it with [`builder`](Self::builder), which checks every
/// value; the getters read it. The default is valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSettings {
    handshake_timeout: Duration,
    establish_timeout: Duration,
    max_connections: usize,
    max_handshakes: usize,
    max_handshakes_per_source: usize,
    secret: Option<ClusterSecret>,
    worker_instance: Option<u64>,
    read_buffer: usize,
    backoff: Backoff,
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
    /// A builder starting from the defaults.
    pub fn builder() -> SessionSettingsBuilder {
        SessionSettingsBuilder(Self::default())
    }

    /// A builder starting from these settings.
    pub fn to_builder(&self) -> SessionSettingsBuilder {
        SessionSettingsBuilder(self.clone())
    }

    /// Bound on the HELLO exchange of one lane (both sides; a worker's includes dialing).
    pub fn handshake_timeout(&self) -> Duration {
        self.handshake_timeout
    }
    /// Bound on a frontend's transport handshake (TLS) of one lane, before its HELLO.
    pub fn establish_timeout(&self) -> Duration {
        self.establish_timeout
    }
    /// Lanes a frontend holds at most; more are refused with CLOSE `limit`.
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }
    /// Connections a frontend has in their handshake at once, in total (apart from lanes).
    pub fn max_handshakes(&self) -> usize {
        self.max_handshakes
    }
    /// Connections a frontend has in their handshake at once from one source address.
    pub fn max_handshakes_per_source(&self) -> usize {
        self.max_handshakes_per_source
    }
    /// The cluster secret proved in every handshake (both sides), if any.
    pub fn secret(&self) -> Option<&ClusterSecret> {
        self.secret.as_ref()
    }
    /// A worker's discovery instance, announced in its HELLOs.
    pub fn worker_instance(&self) -> Option<u64> {
        self.worker_instance
    }
    /// Each lane reader's buffer, in bytes.
    pub fn read_buffer(&self) -> usize {
        self.read_buffer
    }
    /// Backoff between failed preparations of one frontend (worker).
    pub fn backoff(&self) -> Backoff {
        self.backoff
    }

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

/// Builds [`SessionSettings`], starting from the defaults; [`build`](Self::build) checks
/// every value.
#[derive(Debug, Clone)]
pub struct SessionSettingsBuilder(SessionSettings);

impl SessionSettingsBuilder {
    /// Bound on the HELLO exchange of one lane, 1 ms..=1 h (default 5 s).
    pub fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.0.handshake_timeout = timeout;
        self
    }
    /// Bound on a frontend's transport handshake (TLS) of one lane, 1 ms..=1 h (default 3 s).
    pub fn establish_timeout(mut self, timeout: Duration) -> Self {
        self.0.establish_timeout = timeout;
        self
    }
    /// Lanes a frontend holds at most, at least 1 (default 4096).
    pub fn max_connections(mut self, max: usize) -> Self {
        self.0.max_connections = max;
        self
    }
    /// Connections a frontend has in their handshake at once, at least 1 (default 256).
    pub fn max_handshakes(mut self, max: usize) -> Self {
        self.0.max_handshakes = max;
        self
    }
    /// Connections in their handshake at once from one source address, at least 1 (default
    /// 64).
    pub fn max_handshakes_per_source(mut self, max: usize) -> Self {
        self.0.max_handshakes_per_source = max;
        self
    }
    /// The bounds of a frontend's accept loop, all five at once.
    pub fn accept(self, accept: AcceptSettings) -> Self {
        self.handshake_timeout(accept.handshake_timeout)
            .establish_timeout(accept.establish_timeout)
            .max_connections(accept.max_connections)
            .max_handshakes(accept.max_handshakes)
            .max_handshakes_per_source(accept.max_handshakes_per_source)
    }
    /// The cluster secret proved in every handshake (default: none).
    pub fn secret(mut self, secret: Option<ClusterSecret>) -> Self {
        self.0.secret = secret;
        self
    }
    /// A worker's discovery instance, announced in its HELLOs (default: none).
    pub fn worker_instance(mut self, instance: Option<u64>) -> Self {
        self.0.worker_instance = instance;
        self
    }
    /// Each lane reader's buffer, 1 KiB..=1 GiB (default 64 KiB).
    pub fn read_buffer(mut self, bytes: usize) -> Self {
        self.0.read_buffer = bytes;
        self
    }
    /// Backoff between failed preparations of one frontend: `min` from 1 ms, `max` from
    /// `min` to 1 h (default 100 ms to 5 s).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.0.backoff = backoff;
        self
    }
    /// What `worker` carries that these settings hold too: its handshake bound, read
    /// buffer, backoff, secret and instance.
    pub fn worker(self, worker: &WorkerSettings) -> Self {
        self.handshake_timeout(worker.handshake_timeout)
            .read_buffer(worker.read_buffer)
            .backoff(worker.backoff)
            .secret(worker.secret.clone())
            .worker_instance(worker.worker_instance)
    }

    /// Checks every value.
    ///
    /// # Errors
    ///
    /// [`ConfigError::OutOfRange`] naming the first setting outside its range, its value and
    /// what is allowed.
    pub fn build(self) -> Result<SessionSettings, ConfigError> {
        let s = self.0;
        let bound = MIN_BOUND..=MAX_BOUND;
        let timeout = "must be from 1 ms to 1 h";
        ConfigError::check_range(
            "handshake_timeout",
            s.handshake_timeout,
            bound.clone(),
            timeout,
        )?;
        ConfigError::check_range("establish_timeout", s.establish_timeout, bound, timeout)?;
        let limit = "must be at least 1 (and below 2^61, tokio's semaphore limit)";
        for (field, value) in [
            ("max_connections", s.max_connections),
            ("max_handshakes", s.max_handshakes),
            ("max_handshakes_per_source", s.max_handshakes_per_source),
        ] {
            ConfigError::check_range(field, value, 1..=MAX_LIMIT, limit)?;
        }
        let buffer = "must be from 1024 bytes to 1 GiB";
        let range = MIN_READ_BUFFER..=MAX_READ_BUFFER;
        ConfigError::check_range("read_buffer", s.read_buffer, range, buffer)?;
        let min = s.backoff.min;
        ConfigError::check_range("backoff.min", min, MIN_BOUND..=MAX_BOUND, timeout)?;
        let allowed = "must be from backoff.min to 1 h";
        ConfigError::check_range("backoff.max", s.backoff.max, min..=MAX_BOUND, allowed)?;
        Ok(s)
    }
}

impl WorkerSettings {
    /// The session settings these carry, the frontend's limits at their defaults: what a
    /// transport's configuration holds for a worker.
    ///
    /// # Errors
    ///
    /// [`ConfigError::OutOfRange`] when a value these carry is outside its range.
    pub fn session(&self) -> Result<SessionSettings, ConfigError> {
        SessionSettings::builder().worker(self).build()
    }
}

#[cfg(test)]
mod tests {
    use velo_mux::Side;

    use super::*;

    #[test]
    fn a_worker_keeps_the_session_settings_it_was_made_from() {
        let session = SessionSettings::builder()
            .handshake_timeout(Duration::from_millis(1234))
            .read_buffer(4321)
            .backoff(Backoff {
                min: Duration::from_millis(7),
                max: Duration::from_millis(70),
            })
            .build()
            .unwrap();
        let mux = MuxConfig::builder(Side::Worker).build().unwrap();
        assert_eq!(session.worker(mux).session().unwrap(), session);
    }

    #[test]
    fn the_defaults_are_valid() {
        let built = SessionSettings::builder().build().unwrap();
        assert_eq!(built, SessionSettings::default());
    }

    /// What building with one setting changed says, as text.
    fn refusal(change: impl FnOnce(SessionSettingsBuilder) -> SessionSettingsBuilder) -> String {
        change(SessionSettings::builder())
            .build()
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn a_zero_or_endless_handshake_bound_is_refused_naming_it() {
        let zero = refusal(|b| b.handshake_timeout(Duration::ZERO));
        assert_eq!(
            zero,
            "invalid handshake_timeout 0ns: must be from 1 ms to 1 h"
        );
        let endless = refusal(|b| b.handshake_timeout(Duration::MAX));
        assert!(
            endless.starts_with("invalid handshake_timeout"),
            "{endless}"
        );
        let zero = refusal(|b| b.establish_timeout(Duration::ZERO));
        assert!(zero.starts_with("invalid establish_timeout 0ns"), "{zero}");
    }

    #[test]
    fn a_limit_of_zero_is_refused_naming_it() {
        let c = refusal(|b| b.max_connections(0));
        assert!(
            c.starts_with("invalid max_connections 0: must be at least 1"),
            "{c}"
        );
        let h = refusal(|b| b.max_handshakes(0));
        assert!(h.starts_with("invalid max_handshakes 0"), "{h}");
        let p = refusal(|b| b.max_handshakes_per_source(0));
        assert!(p.starts_with("invalid max_handshakes_per_source 0"), "{p}");
    }

    #[test]
    fn a_limit_past_the_semaphore_limit_is_refused_instead_of_panicking_at_bind() {
        let c = refusal(|b| b.max_connections(usize::MAX));
        assert!(c.starts_with("invalid max_connections"), "{c}");
        let h = refusal(|b| b.max_handshakes(usize::MAX));
        assert!(h.starts_with("invalid max_handshakes"), "{h}");
    }

    #[test]
    fn a_read_buffer_too_small_to_read_into_is_refused() {
        let r = refusal(|b| b.read_buffer(0));
        assert_eq!(r, "invalid read_buffer 0: must be from 1024 bytes to 1 GiB");
        let r = refusal(|b| b.read_buffer(usize::MAX));
        assert!(r.starts_with("invalid read_buffer"), "{r}");
    }

    #[test]
    fn a_backoff_that_spins_or_runs_backwards_is_refused() {
        let spin = refusal(|b| {
            b.backoff(Backoff {
                min: Duration::ZERO,
                max: Duration::from_secs(1),
            })
        });
        assert!(spin.starts_with("invalid backoff.min 0ns"), "{spin}");
        let backwards = refusal(|b| {
            b.backoff(Backoff {
                min: Duration::from_secs(2),
                max: Duration::from_secs(1),
            })
        });
        assert_eq!(
            backwards,
            "invalid backoff.max 1s: must be from backoff.min to 1 h"
        );
        // Past 1 h, `retry_at + max` could overflow the clock.
        let endless = refusal(|b| {
            b.backoff(Backoff {
                min: Duration::from_secs(1),
                max: Duration::MAX,
            })
        });
        assert!(endless.starts_with("invalid backoff.max"), "{endless}");
    }
}
