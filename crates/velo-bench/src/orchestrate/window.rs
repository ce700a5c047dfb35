//! The children's lines, turned into measured windows: the kernel's counters are sampled when
//! the first frontend opens a window and when the last one closes it, the workers are asked
//! for their engines' counters at both edges, and a window becomes a [`Run`] once every
//! frontend has reported it and every worker has answered.

use std::collections::{BTreeMap, VecDeque};

use super::{Proc, Run, Source};
use crate::arms::Conns;
use crate::engine_stats::EngineStats;
use crate::frontend::FrontendReport;
use crate::procfs;
use crate::protocol::{FrontendLine, WorkerLine};

/// The processes of one run, as the kernel's counters see them.
pub(crate) struct Fleet {
    conns: Conns,
    /// Each frontend's pid and the port its plane's connections are counted on.
    frontends: Vec<(u32, u16)>,
    workers: Vec<u32>,
    /// Every process is in its own network namespace (packets are counted in each).
    netns: bool,
}

impl Fleet {
    /// The fleet of `children`: the first `workers` are worker processes, the rest frontends
    /// with `ports`.
    pub(super) fn new(
        conns: Conns,
        children: &[Proc],
        workers: usize,
        ports: Vec<u16>,
        netns: bool,
    ) -> Self {
        let pids: Vec<u32> = children.iter().map(|p| p.child.id()).collect();
        Self {
            conns,
            frontends: pids[workers..].iter().copied().zip(ports).collect(),
            workers: pids[..workers].to_vec(),
            netns,
        }
    }

    fn sample(&self) -> Sample {
        let fe: Vec<u32> = self.frontends.iter().map(|f| f.0).collect();
        let cpu = |pids: &[u32]| pids.iter().map(|p| procfs::cpu_seconds(*p)).sum::<f64>();
        let wait = |pids: &[u32]| {
            pids.iter()
                .map(|p| procfs::run_queue_wait_seconds(*p))
                .sum::<f64>()
        };
        let wakeups = |pids: &[u32]| {
            pids.iter()
                .map(|p| procfs::context_switches(*p).voluntary)
                .sum::<u64>()
        };
        // On the netns topology each process has a namespace and a device of its own, which
        // counts wire packets (see `netns`); on loopback, the host's TCP segments and UDP
        // datagrams as sent.
        let device = |pids: &[u32]| {
            pids.iter()
                .map(|p| procfs::device_tx_packets_of(*p, crate::netns::DEVICE))
                .sum::<u64>()
        };
        let (packets, frontend_packets) = if self.netns {
            let from_frontends = device(&fe);
            (from_frontends + device(&self.workers), from_frontends)
        } else {
            (procfs::sent_packets(), 0)
        };
        Sample {
            frontend_cpu_s: cpu(&fe),
            worker_cpu_s: cpu(&self.workers),
            frontend_wait_s: wait(&fe),
            worker_wait_s: wait(&self.workers),
            packets,
            frontend_packets,
            frontend_wakeups: wakeups(&fe),
            worker_wakeups: wakeups(&self.workers),
            softirq_s: procfs::softirq_seconds(),
        }
    }

    /// The plane's connections, counted as the arm says.
    fn connections(&self) -> u64 {
        match self.conns {
            Conns::FrontendTcpPort => self
                .frontends
                .iter()
                .map(|(pid, port)| procfs::established_on_port(*pid, *port))
                .sum(),
            Conns::WorkerUdpSockets => procfs::udp_sockets_of(&self.workers),
        }
    }
}

/// The counters at one edge of a window.
#[derive(Debug, Clone, Copy)]
struct Sample {
    frontend_cpu_s: f64,
    worker_cpu_s: f64,
    frontend_wait_s: f64,
    worker_wait_s: f64,
    packets: u64,
    /// Packets the frontends' devices sent (netns only; 0 on loopback).
    frontend_packets: u64,
    frontend_wakeups: u64,
    worker_wakeups: u64,
    softirq_s: f64,
}

/// What the lines have told of one window so far.
#[derive(Debug, Default)]
struct Edges {
    opened: usize,
    mids: usize,
    closed: usize,
    start: Option<Sample>,
    end: Option<Sample>,
    connections: u64,
    reports: Vec<FrontendReport>,
}

/// Follows every frontend through its windows and the workers' answers.
pub(crate) struct Tracker<'a> {
    fleet: &'a Fleet,
    /// The window each frontend is in (the index of its next `RESULT`).
    at: Vec<usize>,
    windows: BTreeMap<usize, Edges>,
    /// Each worker's engine counters, in the order they answered.
    engines: Vec<VecDeque<EngineStats>>,
    /// The next window to hand out as a run.
    next: usize,
    steps: usize,
}

impl<'a> Tracker<'a> {
    /// A tracker of `steps` windows of `fleet`.
    pub(super) fn new(fleet: &'a Fleet, steps: usize) -> Self {
        Self {
            fleet,
            at: vec![0; fleet.frontends.len()],
            windows: BTreeMap::new(),
            engines: vec![VecDeque::new(); fleet.workers.len()],
            next: 0,
            steps,
        }
    }

    /// Takes one line said by `from`; `sample_workers` asks every worker for its engines'
    /// counters. Returns a window once it is complete. Lines that are not the protocol's are
    /// skipped: they are not meant for the orchestrator.
    pub(super) fn handle(
        &mut self,
        from: Source,
        line: &str,
        sample_workers: &mut dyn FnMut() -> Result<(), String>,
    ) -> Result<Option<Run>, String> {
        match from {
            Source::Worker(i) => match line.parse::<WorkerLine>() {
                Ok(WorkerLine::Engines(stats)) => {
                    if let Some(q) = self.engines.get_mut(i) {
                        q.push_back(stats);
                    }
                }
                Ok(other) => return Err(format!("worker {i} said {other} again")),
                Err(e) if e.is_unknown() => {}
                Err(e) => return Err(format!("worker {i} said {e}")),
            },
            Source::Frontend(i) => match line.parse::<FrontendLine>() {
                Ok(message) => self.on_frontend(i, message, sample_workers)?,
                Err(e) if e.is_unknown() => {}
                Err(e) => return Err(format!("frontend {i} said {e}")),
            },
        }
        Ok(self.complete())
    }

    fn on_frontend(
        &mut self,
        i: usize,
        line: FrontendLine,
        sample_workers: &mut dyn FnMut() -> Result<(), String>,
    ) -> Result<(), String> {
        let n = self.fleet.frontends.len();
        let step = self.at.get(i).copied().ok_or("an unknown frontend")?;
        if step >= self.steps {
            return Err(format!("frontend {i} said {line} after its last window"));
        }
        let w = self.windows.entry(step).or_default();
        match line {
            FrontendLine::Ready { .. } => return Err(format!("frontend {i} said READY twice")),
            FrontendLine::WindowStart => {
                w.opened += 1;
                if w.opened == 1 {
                    w.start = Some(self.fleet.sample());
                    sample_workers()?;
                }
            }
            FrontendLine::WindowMid => {
                w.mids += 1;
                if w.mids == 1 {
                    w.connections = self.fleet.connections();
                }
            }
            FrontendLine::WindowEnd => {
                w.closed += 1;
                if w.closed == n {
                    w.end = Some(self.fleet.sample());
                    sample_workers()?;
                }
            }
            FrontendLine::Result(report) => {
                if w.reports.len() >= w.closed {
                    return Err(format!("frontend {i} reported without a window"));
                }
                w.reports.push(*report);
                self.at[i] += 1;
            }
        }
        Ok(())
    }

    /// The next window as a run, once every frontend reported it and every worker answered
    /// at both its edges.
    fn complete(&mut self) -> Option<Run> {
        let n = self.fleet.frontends.len();
        let w = self.windows.get(&self.next)?;
        if w.reports.len() < n || self.engines.iter().any(|q| q.len() < 2) {
            return None;
        }
        let w = self.windows.remove(&self.next)?;
        self.next += 1;
        let (s0, s1) = (w.start?, w.end?);
        let engines = self
            .engines
            .iter_mut()
            .fold(EngineStats::default(), |all, q| {
                let (a, b) = (
                    q.pop_front().unwrap_or_default(),
                    q.pop_front().unwrap_or_default(),
                );
                all.plus(&b.since(&a))
            });
        Some(Run {
            report: FrontendReport::merge(&w.reports),
            frontend_cpu_s: s1.frontend_cpu_s - s0.frontend_cpu_s,
            worker_cpu_s: s1.worker_cpu_s - s0.worker_cpu_s,
            frontend_wait_s: (s1.frontend_wait_s - s0.frontend_wait_s).max(0.0),
            worker_wait_s: (s1.worker_wait_s - s0.worker_wait_s).max(0.0),
            segments: s1.packets.saturating_sub(s0.packets),
            frontend_segments: s1.frontend_packets.saturating_sub(s0.frontend_packets),
            connections: w.connections,
            frontend_wakeups: s1.frontend_wakeups.saturating_sub(s0.frontend_wakeups),
            worker_wakeups: s1.worker_wakeups.saturating_sub(s0.worker_wakeups),
            softirq_s: (s1.softirq_s - s0.softirq_s).max(0.0),
            engines,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet(frontends: usize) -> Fleet {
        let me = std::process::id();
        Fleet {
            conns: Conns::FrontendTcpPort,
            frontends: vec![(me, 0); frontends],
            workers: vec![me],
            netns: false,
        }
    }

    fn say(t: &mut Tracker<'_>, from: Source, line: &str) -> Result<Option<Run>, String> {
        t.handle(from, line, &mut || Ok(()))
    }

    fn engines(passes: u64) -> String {
        WorkerLine::Engines(EngineStats {
            passes,
            ..EngineStats::default()
        })
        .to_string()
    }

    #[test]
    fn a_window_is_a_run_once_every_frontend_reported_and_the_workers_answered() {
        let fleet = fleet(2);
        let mut t = Tracker::new(&fleet, 1);
        let result = FrontendLine::Result(Box::default()).to_string();
        for line in ["WINDOW_START", "WINDOW_MID", "WINDOW_END"] {
            for i in 0..2 {
                assert!(say(&mut t, Source::Frontend(i), line).unwrap().is_none());
            }
        }
        assert!(say(&mut t, Source::Frontend(0), &result).unwrap().is_none());
        assert!(say(&mut t, Source::Frontend(1), &result).unwrap().is_none());
        assert!(
            say(&mut t, Source::Worker(0), &engines(10))
                .unwrap()
                .is_none()
        );
        let run = say(&mut t, Source::Worker(0), &engines(25))
            .unwrap()
            .expect("a run");
        assert_eq!(run.engines.passes, 15);
        assert!(run.frontend_cpu_s >= 0.0 && run.worker_cpu_s >= 0.0);
        let late = say(&mut t, Source::Frontend(0), "WINDOW_START").unwrap_err();
        assert!(late.contains("after its last window"), "{late}");
    }

    #[test]
    fn a_report_before_its_window_is_an_error_and_other_output_is_skipped() {
        let fleet = fleet(1);
        let mut t = Tracker::new(&fleet, 2);
        assert!(say(&mut t, Source::Frontend(0), "hello").unwrap().is_none());
        assert!(
            say(&mut t, Source::Worker(0), "log line")
                .unwrap()
                .is_none()
        );
        let result = FrontendLine::Result(Box::default()).to_string();
        let early = say(&mut t, Source::Frontend(0), &result).unwrap_err();
        assert_eq!(early, "frontend 0 reported without a window");
    }
}
