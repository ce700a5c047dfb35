//! The hostile-peer suite: attacks on a running frontend over loopback while a legitimate
//! worker streams alongside, and one table of what each attack got (the frontend's answer,
//! what it held at peak) and what it cost the legitimate worker (its requests' success
//! rate, and the p99 of their mean inter-token latency against a quiet run).
//!
//! The frontend is the velo plane over TCP with TLS and a cluster secret, as a hardened
//! deployment runs it; the legitimate worker holds the CA, the secret and its discovery
//! instance. Attackers come from other loopback addresses (127.0.0.2 and up), so the
//! per-source handshake budget shows, and run on a runtime and thread of their own, as they
//! would on another host (the table gives their CPU time: on this machine they share its cores). `cargo xtask hostile` runs it at full scale; the
//! `hostile` test runs it small and checks every outcome.

mod attacks;
mod legit;
mod raw;

use std::time::Duration;

use response_plane::{FrontendPlane, ResponsePlaneConfig, WorkerPlane};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use velo_tls::testing::TestPki;

pub use attacks::Attack;
pub use legit::Legit;

/// How hard the suite pushes.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    /// Connections that connect and say nothing.
    pub silent: usize,
    /// Connections that send their HELLO a byte at a time.
    pub slowloris: usize,
    /// Connections of random bytes, and of each refused handshake.
    pub probes: usize,
    /// How long each attack (and the legitimate load measured with it) runs.
    pub window: Duration,
    /// Concurrent legitimate requests.
    pub streams: usize,
    /// Items per legitimate request.
    pub items: usize,
    /// Pause between a legitimate request's items (an engine's pass).
    pub item_gap: Duration,
    /// Whether each attack is compared with a quiet window run just before it, rather than
    /// with the one quiet window at the start: on a shared machine the quiet latency drifts
    /// by more than the +10% the suite judges over the minutes a whole table takes.
    pub paired_quiet: bool,
}

impl Scale {
    /// What `cargo xtask hostile` runs.
    pub fn full() -> Self {
        Self {
            silent: 5000,
            slowloris: 60,
            probes: 200,
            window: Duration::from_secs(7),
            streams: 32,
            items: 64,
            item_gap: Duration::from_millis(2),
            paired_quiet: true,
        }
    }

    /// What the test runs: every attack, smaller.
    pub fn smoke() -> Self {
        Self {
            silent: 300,
            slowloris: 8,
            probes: 16,
            window: Duration::from_secs(6),
            streams: 4,
            items: 16,
            item_gap: Duration::from_millis(2),
            paired_quiet: false,
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone)]
pub struct Row {
    /// The attack.
    pub attack: &'static str,
    /// What the frontend did to it (refused / closed, with which code), tallied.
    pub outcome: String,
    /// CPU time the attacker's own thread used, in seconds.
    pub attacker_cpu_s: f64,
    /// Connections to the frontend's port at peak during the attack (the legitimate
    /// worker's lanes included).
    pub peak_connections: usize,
    /// Growth of this process's resident memory at peak, in KiB.
    pub peak_rss_kib: i64,
    /// CPU time of the frontend and the legitimate worker (this process, the attacker's and
    /// the sampler's threads left out) over the window, in seconds.
    pub defender_cpu_s: f64,
    /// The legitimate worker's requests during the attack.
    pub legit: Legit,
    /// The quiet window this row is compared with.
    pub quiet: Quiet,
}

/// A window of the legitimate load alone.
#[derive(Debug, Clone)]
pub struct Quiet {
    /// Its requests.
    pub legit: Legit,
    /// The frontend's and the legitimate worker's CPU time, in seconds.
    pub cpu_s: f64,
}

/// The suite's result: a quiet run, then one row per attack (each with its own quiet window
/// when [`Scale::paired_quiet`]).
#[derive(Debug, Clone)]
pub struct Report {
    /// The legitimate load alone, before the first attack.
    pub quiet: Quiet,
    /// Each attack.
    pub rows: Vec<Row>,
}

impl Report {
    /// The table, in Markdown.
    pub fn table(&self) -> String {
        let q = &self.quiet;
        let mut out = format!(
            "quiet run: {} requests, success {:.2}%, ITL p99 {:.3} ms, defender CPU {:.2} s\n\n",
            q.legit.total(),
            q.legit.success_pct(),
            q.legit.itl_p99_ms(),
            q.cpu_s
        );
        out.push_str("| attack | outcome | attacker CPU | defender CPU (quiet) | peak conns | peak RSS | legit success | legit ITL p99 | quiet ITL p99 | vs quiet |\n");
        out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for r in &self.rows {
            let (itl, quiet) = (r.legit.itl_p99_ms(), r.quiet.legit.itl_p99_ms());
            out.push_str(&format!(
                "| {} | {} | {:.2} s | {:.2} s ({:.2} s) | {} | {:+} KiB | {:.2}% ({}) | {:.3} ms | {:.3} ms | {:+.1}% |\n",
                r.attack,
                r.outcome,
                r.attacker_cpu_s,
                r.defender_cpu_s,
                r.quiet.cpu_s,
                r.peak_connections,
                r.peak_rss_kib,
                r.legit.success_pct(),
                r.legit.total(),
                itl,
                quiet,
                (itl / quiet - 1.0) * 100.0
            ));
        }
        out
    }
}

/// What one window measured (a [`Row`] without its quiet comparison).
struct Window {
    outcome: String,
    attacker_cpu_s: f64,
    peak_connections: usize,
    peak_rss_kib: i64,
    defender_cpu_s: f64,
    legit: Legit,
}

/// The frontend under attack and what the attacks need to reach it.
pub struct Target {
    pki: TestPki,
    frontend: FrontendPlane,
    legit: WorkerPlane,
    /// A plaintext frontend, for the TLS-client-to-plaintext attack.
    plain: FrontendPlane,
    config: ResponsePlaneConfig,
    tracker: TaskTracker,
    scale: Scale,
}

/// The legitimate worker's discovery instance.
pub const LEGIT_INSTANCE: u64 = 1;
/// An insider's (a worker holding the secret, serving other requests).
pub const INSIDER_INSTANCE: u64 = 666;
/// The cluster secret of the run.
const SECRET: &str = "the hostile suite's cluster secret";

impl Target {
    /// Starts the frontends and the legitimate worker.
    ///
    /// # Panics
    ///
    /// If they cannot start (the suite cannot run then).
    pub async fn start(scale: Scale) -> Self {
        let pki = TestPki::new();
        std::fs::write(pki.path("secret"), SECRET).expect("secret file");
        let tracker = TaskTracker::new();
        let config = base(&pki);
        let frontend = FrontendPlane::bind(config.clone(), tracker.clone())
            .await
            .expect("frontend starts");
        let legit = worker(&config, LEGIT_INSTANCE, &tracker);
        let plain_config = ResponsePlaneConfig::builder()
            .plane(response_plane::Plane::Velo)
            .host(Some(std::net::Ipv4Addr::LOCALHOST.into()))
            .build()
            .expect("valid");
        let plain = FrontendPlane::bind(plain_config, tracker.clone())
            .await
            .expect("plaintext frontend starts");
        Self {
            pki,
            frontend,
            legit,
            plain,
            config,
            tracker,
            scale,
        }
    }

    /// A worker of the cluster (it holds the CA and the secret) announcing `instance`.
    pub fn insider(&self, instance: u64) -> WorkerPlane {
        worker(&self.config, instance, &self.tracker)
    }

    /// Runs the quiet baseline, then every attack (each after a quiet window of its own when
    /// [`Scale::paired_quiet`]).
    pub async fn run(&self, attacks: &[Attack]) -> Report {
        let first = self.quiet().await;
        let mut rows = Vec::new();
        for &a in attacks {
            let quiet = match self.scale.paired_quiet {
                true => self.quiet().await,
                false => first.clone(),
            };
            let w = self.measure(Some(a)).await;
            rows.push(Row {
                attack: a.name(),
                outcome: w.outcome,
                attacker_cpu_s: w.attacker_cpu_s,
                peak_connections: w.peak_connections,
                peak_rss_kib: w.peak_rss_kib,
                defender_cpu_s: w.defender_cpu_s,
                legit: w.legit,
                quiet,
            });
        }
        Report { quiet: first, rows }
    }

    async fn quiet(&self) -> Quiet {
        let w = self.measure(None).await;
        Quiet {
            legit: w.legit,
            cpu_s: w.defender_cpu_s,
        }
    }

    /// One window of the legitimate load, under `attack` if any.
    async fn measure(&self, attack: Option<Attack>) -> Window {
        let stop = CancellationToken::new();
        let cpu_before = crate::procfs::cpu_seconds(std::process::id());
        let port = self.frontend.address().port();
        let sampler = tokio::spawn(legit::sample_peak(port, stop.clone()));
        let load = tokio::spawn(legit::run(
            self.frontend.clone(),
            self.legit.clone(),
            self.scale,
            stop.clone(),
        ));
        let (outcome, attacker_cpu_s) = match attack {
            Some(a) => self.attack_apart(a),
            None => {
                tokio::time::sleep(self.scale.window).await;
                ("-".to_owned(), 0.0)
            }
        };
        stop.cancel();
        let legit = load.await.expect("the legitimate load ends");
        let (peak_connections, peak_rss_kib, sampler_cpu_s) =
            sampler.await.expect("the sampler ends");
        let process_cpu_s = crate::procfs::cpu_seconds(std::process::id()) - cpu_before;
        Window {
            outcome,
            attacker_cpu_s,
            peak_connections,
            peak_rss_kib,
            defender_cpu_s: process_cpu_s - attacker_cpu_s - sampler_cpu_s,
            legit,
        }
    }

    /// Runs `attack` on a runtime of its own on a thread of its own, as an attacker on another
    /// host would: its tasks never wait in the run queue the frontend and the legitimate worker
    /// share (in one runtime, 5,000 attacker tasks queued in front of them measured the
    /// harness, not the frontend). It still shares the machine's cores; its CPU time, in
    /// seconds, is returned with the outcome.
    fn attack_apart(&self, attack: Attack) -> (String, f64) {
        tokio::task::block_in_place(|| {
            std::thread::scope(|s| {
                s.spawn(|| {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("the attacker's runtime");
                    let outcome = runtime.block_on(attack.run(self));
                    drop(runtime);
                    (outcome, crate::procfs::thread_cpu_seconds())
                })
                .join()
                .expect("the attacker's thread ends")
            })
        })
    }

    /// Stops everything.
    pub async fn shutdown(self) {
        self.frontend.shutdown().await;
        self.plain.shutdown().await;
        self.legit.close();
        self.tracker.close();
        let _ = tokio::time::timeout(Duration::from_secs(15), self.tracker.wait()).await;
    }
}

/// The frontend's and workers' common configuration: velo over TCP on loopback, TLS with the
/// run's PKI, the cluster secret.
fn base(pki: &TestPki) -> ResponsePlaneConfig {
    let p = |n: &str| pki.path(n).display().to_string();
    let vars = [
        ("DYN_RESPONSE_PLANE", "velo".to_owned()),
        ("DYN_TCP_RESPONSE_STREAM_HOST", "127.0.0.1".to_owned()),
        ("DYN_TCP_TLS_CERT_PATH", p("server.pem")),
        ("DYN_TCP_TLS_KEY_PATH", p("server.key")),
        ("DYN_TCP_TLS_CA_CERT_PATH", p("ca.pem")),
        ("DYN_VELO_CLUSTER_SECRET_PATH", p("secret")),
    ];
    ResponsePlaneConfig::from_lookup(|v| vars.iter().find(|(k, _)| *k == v).map(|(_, x)| x.clone()))
        .expect("the suite's configuration is valid")
}

fn worker(config: &ResponsePlaneConfig, instance: u64, tracker: &TaskTracker) -> WorkerPlane {
    let c = config
        .to_builder()
        .worker_instance(Some(instance))
        .build()
        .expect("valid");
    WorkerPlane::new(c, tracker.clone()).expect("worker starts")
}

/// Keeps the PKI's paths reachable for attacks that dial by hand.
impl Target {
    fn ca(&self) -> std::path::PathBuf {
        self.pki.path("ca.pem")
    }

    fn secret(&self) -> velo_session::ClusterSecret {
        velo_session::ClusterSecret::new(SECRET.as_bytes()).expect("valid secret")
    }
}

/// Shared with the attacks: the frontend's stats are read before and after.
fn stats(f: &FrontendPlane) -> response_plane::PlaneStats {
    f.stats()
}
