//! Role processes as the harness runs them: spawned from this binary (optionally inside a
//! network namespace), commanded over standard input, heard over standard output, killed
//! with SIGKILL when a scenario says so and always when dropped.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;
use tokio::time::Instant;
use velo_faults::protocol::{Command, Event, from_line, to_line};

/// Events buffered from all processes before their readers wait (backpressure on the pipes).
pub(crate) const EVENT_QUEUE: usize = 65_536;
/// How long a process gets to exit after `Quit` before it is killed.
const QUIT_GRACE: Duration = Duration::from_secs(1);

/// Which process an event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ProcId {
    /// Frontend number n.
    Frontend(usize),
    /// Worker number n.
    Worker(usize),
}

/// An event, when it arrived and from whom.
#[derive(Debug)]
pub(crate) struct Arrival {
    pub(crate) at: Instant,
    pub(crate) from: ProcId,
    pub(crate) event: Event,
}

/// Spawns role processes of this binary.
pub(crate) struct Spawner {
    exe: PathBuf,
    log_dir: PathBuf,
    events: mpsc::Sender<Arrival>,
}

/// One running role process.
pub(crate) struct RoleProc {
    child: Child,
    stdin: Option<ChildStdin>,
    pid: Option<u32>,
    killed: bool,
}

impl Spawner {
    /// A spawner whose processes report to `events` and log to `log_dir`.
    pub(crate) fn new(log_dir: PathBuf, events: mpsc::Sender<Arrival>) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
        std::fs::create_dir_all(&log_dir).map_err(|e| format!("{}: {e}", log_dir.display()))?;
        Ok(Self {
            exe,
            log_dir,
            events,
        })
    }

    /// Runs `velo-faults <args>`, behind `prefix` (such as `ip netns exec NAME`) if given.
    pub(crate) fn spawn(
        &self,
        id: ProcId,
        prefix: &[String],
        args: &[String],
        log_name: &str,
    ) -> Result<RoleProc, String> {
        let log = self.log_dir.join(format!("{log_name}.log"));
        let err = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut cmd = match prefix.split_first() {
            None => tokio::process::Command::new(&self.exe),
            Some((program, rest)) => {
                let mut c = tokio::process::Command::new(program);
                c.args(rest).arg(&self.exe);
                c
            }
        };
        let mut child = cmd
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("spawning {log_name}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let events = self.events.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(event) = from_line::<Event>(&line) else {
                    continue;
                };
                let arrival = Arrival {
                    at: Instant::now(),
                    from: id,
                    event,
                };
                if events.send(arrival).await.is_err() {
                    break;
                }
            }
        });
        Ok(RoleProc {
            stdin: child.stdin.take(),
            pid: child.id(),
            child,
            killed: false,
        })
    }
}

impl RoleProc {
    /// Sends one command; a process that is gone cannot take it (its end shows elsewhere).
    pub(crate) async fn send(&mut self, cmd: &Command) {
        let Some(stdin) = &mut self.stdin else { return };
        let mut line = to_line(cmd);
        line.push('\n');
        if stdin.write_all(line.as_bytes()).await.is_err() {
            self.stdin = None;
        }
    }

    /// SIGKILL, now.
    pub(crate) fn kill(&mut self) {
        self.killed = true;
        let _ = self.child.start_kill();
    }

    /// The process's peak resident memory so far (`VmHWM`), KiB; 0 once it is gone.
    pub(crate) fn peak_rss_kib(&self) -> u64 {
        let Some(pid) = self.pid.filter(|_| !self.killed) else {
            return 0;
        };
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
                line.split_whitespace().nth(1)?.parse().ok()
            })
            .unwrap_or(0)
    }

    /// Asks the process to quit, and kills it if it has not within [`QUIT_GRACE`].
    pub(crate) async fn stop(mut self) {
        self.send(&Command::Quit).await;
        self.stdin = None;
        if tokio::time::timeout(QUIT_GRACE, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
            let _ = tokio::time::timeout(QUIT_GRACE, self.child.wait()).await;
        }
    }
}
