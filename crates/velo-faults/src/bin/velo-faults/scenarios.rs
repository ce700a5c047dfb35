//! The scenarios, as data: where the processes run, which streams each carries, what fault is
//! injected when, which side must notice, and against what bound.

use std::time::Duration;

use velo_faults::protocol::ReadMode;
use velo_faults::proxy::{Fault, Faults};

/// Pause between a sibling's items (and most victims'): 20 ms, a slow token rate that keeps
/// a 2-core machine far from saturation, so ITL reflects the plane and not the load.
pub(crate) const INTERVAL_MS: u64 = 20;
/// Items of a sibling stream: 3 s at [`INTERVAL_MS`].
pub(crate) const SIBLING_ITEMS: u64 = 150;
/// Items of a stream meant to outlive the scenario (a victim the fault must end).
pub(crate) const ENDLESS: u64 = 1_000_000;
/// Padding of a small item, bytes (a token is 50-200 bytes).
pub(crate) const SMALL_ITEM: u32 = 100;
/// Padding of a bulk item, bytes: victims that must fill their send buffers quickly.
pub(crate) const BULK_ITEM: u32 = 32 * 1024;
/// Default time from the first streams to the fault.
const WARMUP: Duration = Duration::from_secs(1);

/// Where a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// This machine's loopback.
    Host,
    /// Network namespace A (the lossy link's frontend end).
    NsA,
    /// Network namespace B (across the lossy link).
    NsB,
}

/// A stream's part in the scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Hit by the fault: must end exactly once on each observed side, within the bound.
    Victim,
    /// Not hit: must deliver every item (its ITL is reported).
    Sibling,
}

/// When a group's streams open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// At the start.
    Start,
    /// Right after the fault (a restarted frontend's first streams).
    AfterFault,
}

/// A set of like streams.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub(crate) role: Role,
    pub(crate) count: u64,
    pub(crate) frontend: usize,
    pub(crate) worker: usize,
    /// Through the fault proxy (else straight to the frontend).
    pub(crate) proxied: bool,
    pub(crate) items: u64,
    pub(crate) interval_ms: u64,
    pub(crate) item_bytes: u32,
    /// The worker waits this long before opening the stream.
    pub(crate) delay_ms: u64,
    pub(crate) mode: ReadMode,
    pub(crate) phase: Phase,
    /// A victim that must still deliver every item (loss, drain).
    pub(crate) complete: bool,
    /// Forged streams of a flood (opened by the fault, not at the start).
    pub(crate) forged: bool,
}

impl Group {
    /// Siblings: frontend 0 to `worker`, straight, read promptly.
    pub(crate) fn siblings(worker: usize, count: u64) -> Self {
        Self {
            role: Role::Sibling,
            count,
            frontend: 0,
            worker,
            proxied: false,
            items: SIBLING_ITEMS,
            interval_ms: INTERVAL_MS,
            item_bytes: SMALL_ITEM,
            delay_ms: 0,
            mode: ReadMode::Read,
            phase: Phase::Start,
            complete: true,
            forged: false,
        }
    }

    /// Victims: frontend 0 to worker 0 through the proxy, endless, read promptly.
    pub(crate) fn victims(count: u64) -> Self {
        Self {
            role: Role::Victim,
            proxied: true,
            items: ENDLESS,
            complete: false,
            ..Self::siblings(0, count)
        }
    }
}

/// The fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inject {
    /// None (the baseline; packet loss is there from the start).
    Nothing,
    /// SIGKILL worker n.
    KillWorker(usize),
    /// SIGKILL frontend n.
    KillFrontend(usize),
    /// Switch the proxy.
    Proxy(Faults),
    /// The frontend drops every victim stream (the slow consumers).
    DropVictims,
    /// Worker n opens the victims as forged streams, this many at a time.
    Flood { worker: usize, concurrency: u64 },
    /// SIGKILL frontend 0 and start a new instance behind the same proxy address.
    RestartFrontend,
    /// Frontend 0 shuts down (go-away, then its grace period).
    Shutdown,
    /// The namespaces' links drop this share of their packets from now on.
    Loss(u8),
}

/// What a scenario's detection is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bound {
    /// The plane's idle timeout plus slack.
    Idle,
    /// The shutdown grace period.
    Grace,
    /// No detection (nothing must end).
    None,
}

/// Which sides must see a victim end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Observe {
    pub(crate) frontend: bool,
    pub(crate) worker: bool,
}

impl Observe {
    pub(crate) const FRONTEND: Self = Self {
        frontend: true,
        worker: false,
    };
    pub(crate) const WORKER: Self = Self {
        frontend: false,
        worker: true,
    };
    pub(crate) const BOTH: Self = Self {
        frontend: true,
        worker: true,
    };
}

/// One scenario.
#[derive(Debug, Clone)]
pub(crate) struct Scenario {
    pub(crate) name: &'static str,
    pub(crate) frontends: Vec<Place>,
    pub(crate) workers: Vec<Place>,
    pub(crate) groups: Vec<Group>,
    pub(crate) inject: Inject,
    pub(crate) warmup: Duration,
    pub(crate) observe: Observe,
    pub(crate) bound: Bound,
    /// Peak frontend RSS may exceed the plane's baseline by at most this much, MiB.
    pub(crate) rss_margin_mib: Option<u64>,
    /// Packet loss between the namespaces, percent (namespaces are made only when set).
    pub(crate) loss_percent: Option<u8>,
}

impl Scenario {
    fn new(name: &'static str, groups: Vec<Group>, inject: Inject, observe: Observe) -> Self {
        Self {
            name,
            frontends: vec![Place::Host],
            workers: vec![Place::Host, Place::Host],
            groups,
            inject,
            warmup: WARMUP,
            observe,
            bound: Bound::Idle,
            rss_margin_mib: None,
            loss_percent: None,
        }
    }
}

/// Every scenario, the baseline first (the others' ITL is compared with it).
pub(crate) fn all() -> Vec<Scenario> {
    let sib = || Group::siblings(1, 32);
    let bulk = Group {
        item_bytes: BULK_ITEM,
        interval_ms: 5,
        ..Group::victims(16)
    };
    let both = |fault| Faults {
        to_upstream: fault,
        to_client: fault,
    };
    let zero_window = Faults {
        to_upstream: Fault::StopReading,
        to_client: Fault::Pass,
    };
    vec![
        Scenario {
            bound: Bound::None,
            ..Scenario::new("baseline", vec![sib()], Inject::Nothing, Observe::BOTH)
        },
        Scenario::new(
            "worker-sigkill",
            vec![Group::victims(32), sib()],
            Inject::KillWorker(0),
            Observe::FRONTEND,
        ),
        frontend_sigkill(),
        Scenario::new(
            "blackhole-full-sndbuf",
            vec![bulk.clone(), sib()],
            Inject::Proxy(both(Fault::Stall)),
            Observe::BOTH,
        ),
        blackhole_new_streams(),
        Scenario::new(
            "zero-window-frontend",
            vec![bulk, sib()],
            Inject::Proxy(zero_window),
            Observe::BOTH,
        ),
        slow_consumer(),
        open_flood(),
        packet_loss(),
        link_blackhole(),
        frontend_restart(),
        go_away_drain(),
    ]
}

/// Frontend 0 (the victims' frontend) dies; frontend 1's streams from the same worker go on.
fn frontend_sigkill() -> Scenario {
    let siblings = Group {
        frontend: 1,
        worker: 0,
        ..Group::siblings(0, 32)
    };
    Scenario {
        frontends: vec![Place::Host, Place::Host],
        workers: vec![Place::Host],
        ..Scenario::new(
            "frontend-sigkill",
            vec![Group::victims(32), siblings],
            Inject::KillFrontend(0),
            Observe::WORKER,
        )
    }
}

/// Streams opened just after the worker's lanes were blackholed: each is short (within its
/// credit window, so the worker finishes it at once) and never reaches the frontend. Both
/// sides must still end it within the bound: the worker's lanes fail after the idle timeout.
fn blackhole_new_streams() -> Scenario {
    let short = Group {
        items: 10,
        interval_ms: 0,
        phase: Phase::AfterFault,
        ..Group::victims(16)
    };
    let stall = Faults {
        to_upstream: Fault::Stall,
        to_client: Fault::Stall,
    };
    // Short streams through the proxy before the fault, so the worker's connection is up.
    let primer = Group {
        proxied: true,
        items: 5,
        ..Group::siblings(0, 4)
    };
    Scenario::new(
        "blackhole-new-streams",
        vec![primer, short, Group::siblings(1, 32)],
        Inject::Proxy(stall),
        Observe::BOTH,
    )
}

/// One stream never read (bulk items, as fast as credit allows) among 1,000 read promptly;
/// then the frontend drops it and the worker must see that.
fn slow_consumer() -> Scenario {
    let slow = Group {
        items: 4_000,
        interval_ms: 0,
        item_bytes: 64 * 1024,
        mode: ReadMode::NoRead,
        ..Group::victims(1)
    };
    let siblings = Group {
        items: 50,
        ..Group::siblings(1, 1_000)
    };
    Scenario {
        warmup: Duration::from_secs(2),
        rss_margin_mib: Some(64),
        ..Scenario::new(
            "slow-consumer",
            vec![slow, siblings],
            Inject::DropVictims,
            Observe::BOTH,
        )
    }
}

/// A hostile client (worker 2) opens 2,000 streams with tickets the frontend never issued.
fn open_flood() -> Scenario {
    let forged = Group {
        worker: 2,
        proxied: false,
        forged: true,
        ..Group::victims(2_000)
    };
    Scenario {
        workers: vec![Place::Host, Place::Host, Place::Host],
        rss_margin_mib: Some(64),
        ..Scenario::new(
            "open-flood-refused",
            vec![forged, Group::siblings(1, 32)],
            Inject::Flood {
                worker: 2,
                concurrency: 256,
            },
            Observe::WORKER,
        )
    }
}

/// 2% of the packets each side sends are dropped (namespaces); every stream must deliver.
fn packet_loss() -> Scenario {
    let lossy = Group {
        proxied: false,
        items: SIBLING_ITEMS,
        // 1 KiB items: enough segments on the link for the loss to bite.
        item_bytes: 1024,
        complete: true,
        ..Group::victims(32)
    };
    Scenario {
        frontends: vec![Place::NsA],
        workers: vec![Place::NsB, Place::NsA],
        bound: Bound::None,
        loss_percent: Some(2),
        ..Scenario::new(
            "packet-loss-2pct",
            vec![lossy, Group::siblings(1, 32)],
            Inject::Nothing,
            Observe::BOTH,
        )
    }
}

/// The link between the namespaces starts dropping every packet: a blackhole the kernels
/// can notice (keepalive probes and retransmissions go unanswered), unlike the proxy's stall.
fn link_blackhole() -> Scenario {
    let victims = Group {
        proxied: false,
        ..Group::victims(16)
    };
    Scenario {
        frontends: vec![Place::NsA],
        workers: vec![Place::NsB, Place::NsA],
        loss_percent: Some(0),
        ..Scenario::new(
            "link-blackhole-netns",
            vec![victims, Group::siblings(1, 32)],
            Inject::Loss(100),
            Observe::BOTH,
        )
    }
}

/// Frontend 0 dies and a new instance takes its place behind the same (proxy) address; the
/// worker must end the old streams and prepare a new connection for the new ones.
fn frontend_restart() -> Scenario {
    let after = Group {
        proxied: true,
        phase: Phase::AfterFault,
        ..Group::siblings(0, 32)
    };
    Scenario {
        workers: vec![Place::Host],
        ..Scenario::new(
            "frontend-restart",
            vec![Group::victims(32), after],
            Inject::RestartFrontend,
            Observe::WORKER,
        )
    }
}

/// The frontend shuts down mid-stream: every stream registered before (some of whose
/// workers open them only after the go-away) is served to its end within the grace period.
fn go_away_drain() -> Scenario {
    let running = Group {
        items: 100,
        complete: true,
        ..Group::victims(32)
    };
    let late = Group {
        count: 8,
        items: 50,
        // Opened 300 ms after the go-away (the warm-up is 500 ms).
        delay_ms: 800,
        ..running.clone()
    };
    Scenario {
        warmup: Duration::from_millis(500),
        bound: Bound::Grace,
        ..Scenario::new(
            "goaway-drain",
            vec![running, late, Group::siblings(1, 32)],
            Inject::Shutdown,
            Observe::BOTH,
        )
    }
}
