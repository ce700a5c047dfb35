//! Counters of a response plane: the plane's own, plus (velo) the mux's and the handshake's,
//! embedded as they are rather than copied field by field.
//!
//! Every plane counter is declared once, in the table inside [`plane_counters!`]: that
//! declares the [`PlaneStats`] field, the live counter the plane increments, the snapshot,
//! and the entry in [`PlaneStats::COUNTERS`] by which runtime-glue exports it (and its tests
//! notice one it does not export). Adding one is a line here and the line that counts.

use std::sync::atomic::{AtomicU64, Ordering};

pub use velo_mux::{BATCH_RECORDS_BUCKETS, Counter, FlushReason, MuxStats};
pub use velo_session::HandshakeStats;

/// Declares [`PlaneStats`]'s own counters from one table (as velo-mux declares `MuxStats`).
macro_rules! plane_counters {
    ($($(#[doc = $doc:literal])+ $field:ident,)*) => {
        /// Counters since the plane started; plain numbers that runtime-glue exports as
        /// metrics. The velo plane's transport counters are [`mux`](Self::mux) and
        /// [`handshake`](Self::handshake) (zero on the classic plane).
        #[non_exhaustive]
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct PlaneStats {
            $($(#[doc = $doc])+ pub $field: u64,)*
            /// Streams handed out (frontend: established; worker: connected) that have not
            /// ended or been dropped yet. A gauge, not a counter.
            pub streams_in_flight: u64,
            /// The velo plane's multiplexers, every connection added up.
            pub mux: MuxStats,
            /// The velo plane's lane handshakes.
            pub handshake: HandshakeStats,
        }

        impl PlaneStats {
            /// The plane's own counters (not the embedded ones), for exporters.
            pub const COUNTERS: &'static [Counter<Self>] = &[$(Counter {
                name: stringify!($field),
                help: plane_counters!(@first $($doc)+),
                read: |s| s.$field,
            },)*];
        }

        /// The live counters behind [`PlaneStats`]'s own, shared by a plane and the tasks
        /// and handles that count.
        #[derive(Debug, Default)]
        pub(crate) struct PlaneCounters {
            $(pub(crate) $field: Count,)*
        }

        impl PlaneCounters {
            /// The counters now; the gauge and the embedded stats are left at zero for the
            /// plane to fill.
            pub(crate) fn snapshot(&self) -> PlaneStats {
                PlaneStats {
                    $($field: self.$field.get(),)*
                    ..PlaneStats::default()
                }
            }
        }
    };
    (@first $first:literal $($rest:literal)*) => { $first };
}

plane_counters! {
    /// Frontend: streams registered.
    streams_registered,
    /// Streams whose prologue was delivered (frontend) or that were set up (worker).
    streams_established,
    /// Streams that failed before their prologue (frontend; shutdown aside) or whose connect
    /// failed (worker).
    stream_setup_failures,
    /// Frontend: registrations whose prologue did not arrive within their establish timeout
    /// (a request lost on its way, or a worker that vanished before answering; also in
    /// `stream_setup_failures`).
    prologue_timeouts,
    /// Frontend: arriving streams the registry refused (unknown ticket, bad token, a pending
    /// handle already dropped), on either plane.
    arrivals_refused,
    /// Frontend: arriving streams refused because they came from another worker than the one
    /// their registration was tied to, whatever token they carried (also in
    /// `arrivals_refused`).
    arrivals_wrong_worker,
    /// Frontend, classic plane: connections refused because their worker spoke plaintext to
    /// this TLS listener, or began TLS with this plaintext one; each was told so in a
    /// plaintext control message (the velo plane counts them in `handshake`).
    classic_tls_mismatches,
    /// Frontend, classic plane: connections closed unread because the handshake budget (of
    /// connections that have not named their stream yet, per source and in all) was spent.
    classic_handshakes_refused,
    /// Frontend, classic plane: connections dropped before naming their stream to make room,
    /// the handshake budget being full, for one from a source holding fewer places.
    classic_handshakes_evicted,
    /// Worker, classic plane: streams the frontend asked to stop or killed, each once.
    classic_cancellations,
    /// Streams that ended with an error after they were set up (cancellations aside).
    stream_errors,
}

impl PlaneStats {
    /// Worker: streams the frontend asked to stop or killed, each counted once, whichever
    /// plane carried them.
    pub fn cancellations(&self) -> u64 {
        self.classic_cancellations + self.mux.remote_cancellations
    }

    /// Streams currently open on the transport (velo).
    pub fn streams_active(&self) -> u64 {
        self.mux.streams_active()
    }

    /// Lanes up right now (velo).
    pub fn lanes_connected(&self) -> u64 {
        self.mux.lanes_up.saturating_sub(self.mux.lanes_closed)
    }
}

/// One live counter.
#[derive(Debug, Default)]
pub(crate) struct Count(AtomicU64);

impl Count {
    pub(crate) fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}
