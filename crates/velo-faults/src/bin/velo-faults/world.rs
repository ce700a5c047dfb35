//! The state of one scenario run: its processes, its proxy, every stream and how each side
//! saw it end. Events from the processes are handled here, including the hand-off of each
//! registered stream's connection info to its worker (through the proxy where the stream's
//! group says so).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use velo_faults::protocol::{Command, Event, Outcome, ReadMode, rewrite_addr};
use velo_faults::proxy::FaultProxy;

use crate::children::{Arrival, ProcId, RoleProc, Spawner};
use crate::scenarios::{Group, Phase, Role, Scenario};

/// How often the frontends' peak RSS is sampled while events are awaited.
const RSS_SAMPLE: Duration = Duration::from_millis(200);

/// How the frontend saw a stream end.
#[derive(Debug, Clone)]
pub(crate) struct FrontendEnd {
    pub(crate) outcome: Outcome,
    pub(crate) items: u64,
    pub(crate) itl_us: u64,
}

/// How the worker saw a stream end.
#[derive(Debug, Clone)]
pub(crate) struct WorkerEnd {
    pub(crate) outcome: Outcome,
    pub(crate) items: u64,
}

/// One stream of the run: its group, and every end each side reported (one each, if the
/// plane keeps its contract).
#[derive(Debug, Clone, Default)]
pub(crate) struct Stream {
    pub(crate) group: usize,
    pub(crate) frontend: Vec<(Instant, FrontendEnd)>,
    pub(crate) worker: Vec<(Instant, WorkerEnd)>,
}

/// One run's processes and streams.
pub(crate) struct World {
    pub(crate) spawner: Spawner,
    events: mpsc::Receiver<Arrival>,
    pub(crate) groups: Vec<Group>,
    pub(crate) frontends: Vec<Option<RoleProc>>,
    pub(crate) workers: Vec<RoleProc>,
    pub(crate) proxy: Option<FaultProxy>,
    pub(crate) streams: BTreeMap<u64, Stream>,
    /// Connection infos of registrations the harness keeps for itself (a flood's template).
    pub(crate) templates: HashMap<u64, String>,
    pub(crate) ready: HashSet<ProcId>,
    pub(crate) addrs: HashMap<usize, SocketAddr>,
    pub(crate) rss_peak_kib: u64,
    pub(crate) late_register: Option<String>,
    pub(crate) shutdown_done: Option<(String, u64)>,
    next_sid: u64,
}

impl World {
    /// An empty run whose processes report on `events`.
    pub(crate) fn new(spawner: Spawner, events: mpsc::Receiver<Arrival>, sc: &Scenario) -> Self {
        Self {
            spawner,
            events,
            groups: sc.groups.clone(),
            frontends: Vec::new(),
            workers: Vec::new(),
            proxy: None,
            streams: BTreeMap::new(),
            templates: HashMap::new(),
            ready: HashSet::new(),
            addrs: HashMap::new(),
            rss_peak_kib: 0,
            late_register: None,
            shutdown_done: None,
            next_sid: 1,
        }
    }

    /// A fresh stream id.
    pub(crate) fn sid(&mut self) -> u64 {
        let sid = self.next_sid;
        self.next_sid += 1;
        sid
    }

    /// Opens every stream of the groups of `phase` (forged groups are opened by their flood).
    pub(crate) async fn open_groups(&mut self, phase: Phase) {
        for g in 0..self.groups.len() {
            let group = self.groups[g].clone();
            if group.phase != phase || group.forged {
                continue;
            }
            for _ in 0..group.count {
                let sid = self.sid();
                self.streams.insert(
                    sid,
                    Stream {
                        group: g,
                        ..Stream::default()
                    },
                );
                let cmd = Command::Open {
                    sid,
                    mode: group.mode,
                };
                self.send_frontend(group.frontend, &cmd).await;
            }
        }
    }

    /// Registers a stream on frontend `f` that the harness keeps (never served).
    pub(crate) async fn open_template(&mut self, f: usize) -> u64 {
        let sid = self.sid();
        let cmd = Command::Open {
            sid,
            mode: ReadMode::Hold,
        };
        self.send_frontend(f, &cmd).await;
        sid
    }

    pub(crate) async fn send_frontend(&mut self, f: usize, cmd: &Command) {
        if let Some(Some(p)) = self.frontends.get_mut(f) {
            p.send(cmd).await;
        }
    }

    /// Handles events until `done` holds or `deadline` passes; returns whether `done` held.
    pub(crate) async fn pump_until(
        &mut self,
        deadline: Instant,
        done: impl Fn(&Self) -> bool,
    ) -> bool {
        let mut next_sample = Instant::now();
        loop {
            if Instant::now() >= next_sample {
                self.sample_rss();
                next_sample = Instant::now() + RSS_SAMPLE;
            }
            if done(self) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            // Cancel safety: `recv` loses no event when dropped.
            tokio::select! {
                a = self.events.recv() => match a {
                    Some(a) => self.handle(a).await,
                    None => return done(self),
                },
                () = tokio::time::sleep_until(deadline.min(next_sample)) => {}
            }
        }
    }

    /// Handles events for `d`.
    pub(crate) async fn pump_for(&mut self, d: Duration) {
        self.pump_until(Instant::now() + d, |_| false).await;
    }

    /// Records the frontends' peak RSS.
    pub(crate) fn sample_rss(&mut self) {
        let peak = self
            .frontends
            .iter()
            .flatten()
            .map(RoleProc::peak_rss_kib)
            .max()
            .unwrap_or(0);
        self.rss_peak_kib = self.rss_peak_kib.max(peak);
    }

    async fn handle(&mut self, a: Arrival) {
        match a.event {
            Event::Ready { addr } => {
                self.ready.insert(a.from);
                if let (ProcId::Frontend(i), Some(addr)) = (a.from, addr) {
                    self.addrs.insert(i, addr);
                }
            }
            Event::Info { sid, info } => self.serve(sid, info).await,
            Event::End {
                sid,
                outcome,
                items,
                itl_us,
            } => {
                if let Some(s) = self.streams.get_mut(&sid) {
                    let end = FrontendEnd {
                        outcome,
                        items,
                        itl_us,
                    };
                    s.frontend.push((a.at, end));
                }
            }
            Event::WorkerEnd {
                sid,
                outcome,
                items,
            } => {
                let Some(s) = self.streams.get_mut(&sid) else {
                    return;
                };
                // A request plane reports a worker's failure: a frontend still waiting for
                // the prologue gives up (a stream it already reads ends through the plane).
                let failed = outcome != Outcome::Clean && s.frontend.is_empty();
                s.worker.push((a.at, WorkerEnd { outcome, items }));
                let f = self.groups[s.group].frontend;
                if failed {
                    self.send_frontend(f, &Command::Failed { sid }).await;
                }
            }
            Event::ShutdownBegan { late_register } => self.late_register = Some(late_register),
            Event::ShutdownDone {
                outcome,
                elapsed_ms,
            } => self.shutdown_done = Some((outcome, elapsed_ms)),
        }
    }

    /// Hands a registered stream to its worker (or keeps a template's info).
    async fn serve(&mut self, sid: u64, info: String) {
        let Some(group) = self.streams.get(&sid).map(|s| self.groups[s.group].clone()) else {
            self.templates.insert(sid, info);
            return;
        };
        let info = match (&self.proxy, group.proxied) {
            (Some(p), true) => match rewrite_addr(&info, p.local_addr()) {
                Ok(info) => info,
                Err(e) => {
                    eprintln!("velo-faults: cannot point stream {sid} at the proxy: {e}");
                    info
                }
            },
            _ => info,
        };
        let cmd = Command::Serve {
            sid,
            items: group.items,
            interval_ms: group.interval_ms,
            item_bytes: group.item_bytes,
            delay_ms: group.delay_ms,
            info,
        };
        if let Some(w) = self.workers.get_mut(group.worker) {
            w.send(&cmd).await;
        }
    }

    /// The streams of groups with `role`.
    pub(crate) fn of_role(&self, role: Role) -> impl Iterator<Item = &Stream> {
        self.streams
            .values()
            .filter(move |s| self.groups[s.group].role == role)
    }

    /// Stops every process and the proxy, each bounded.
    pub(crate) async fn teardown(&mut self) {
        self.sample_rss();
        for p in self.frontends.drain(..).flatten() {
            p.stop().await;
        }
        for p in self.workers.drain(..) {
            p.stop().await;
        }
        if let Some(proxy) = self.proxy.take()
            && !proxy.shutdown().await
        {
            eprintln!("velo-faults: the proxy's tasks did not all stop in time");
        }
    }
}
