//! The handshake counters, kept by velo-session for every transport (the mux counts
//! records, batches and streams; a transport may count its own extras).

use std::sync::atomic::{AtomicU64, Ordering};

/// Declares [`HandshakeStats`] from one table (as velo-mux declares `MuxStats`).
macro_rules! handshake_counters {
    ($($(#[doc = $doc:literal])+ $field:ident,)*) => {
        /// Counters of the lanes a frontend accepted or a worker dialed, since the endpoint
        /// started.
        #[non_exhaustive]
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct HandshakeStats {
            $($(#[doc = $doc])+ pub $field: u64,)*
        }

        impl HandshakeStats {
            /// Every counter, for exporters.
            pub const COUNTERS: &'static [velo_mux::Counter<Self>] = &[$(velo_mux::Counter {
                name: stringify!($field),
                help: handshake_counters!(@first $($doc)+),
                read: |s| s.$field,
            },)*];
        }

        impl std::ops::AddAssign for HandshakeStats {
            fn add_assign(&mut self, other: Self) {
                $(self.$field += other.$field;)*
            }
        }

        /// The live counters behind [`HandshakeStats`], shared by an endpoint's tasks.
        #[derive(Debug, Default)]
        pub(crate) struct HandshakeCounters {
            $(pub(crate) $field: Counter,)*
        }

        impl HandshakeCounters {
            pub(crate) fn snapshot(&self) -> HandshakeStats {
                HandshakeStats {
                    $($field: self.$field.get(),)*
                }
            }
        }
    };
    (@first $first:literal $($rest:literal)*) => { $first };
}

handshake_counters! {
    /// Connections accepted (frontend).
    connections_accepted,
    /// Connections refused at the lane limit (frontend).
    connections_refused,
    /// Connections refused because too many handshakes were in progress, from their source
    /// address or in total (frontend).
    handshakes_refused,
    /// Connections dropped during their handshake to make room, the budget being full, for a
    /// connection from a source holding fewer handshakes (frontend).
    handshakes_evicted,
    /// Connections whose transport handshake (TLS) did not complete in time (frontend).
    establish_timeouts,
    /// Connections whose transport handshake (TLS) failed: a refused certificate, a plaintext
    /// peer on a TLS listener (frontend).
    establish_failures,
    /// Connections refused for not proving the cluster secret (frontend).
    auth_failures,
    /// Accepts that failed (frontend; out of file descriptors and the like).
    accept_errors,
    /// Connections closed because their handshake was invalid, refused or cut short (frontend).
    handshake_failures,
    /// Connections closed because they sent no handshake in time (frontend).
    handshake_timeouts,
    /// Lanes that completed their handshake (frontend).
    lanes_accepted,
    /// Lanes dialed and handshaken (worker).
    lanes_dialed,
    /// Lane dials or handshakes that failed (worker).
    dial_failures,
}

/// One counter.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    pub(crate) fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}
