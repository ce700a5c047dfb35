//! The line protocol between the orchestrator ([`crate::orchestrate`]) and the processes it
//! spawns: each child writes one message per line on its stdout (its stderr is its log), and
//! the orchestrator reads them to know when to start the frontend and when to sample the
//! kernel's counters.
//!
//! | line | written by | when | the orchestrator |
//! |---|---|---|---|
//! | `READY <address>` | a worker | it takes requests | passes the address to the frontend (`--workers`) |
//! | `ENGINES <json>` | a worker | asked by `SAMPLE` | reads its engines' [`EngineStats`] |
//! | `READY <port>` | the frontend | its plane listens | counts connections on that TCP port |
//! | `WINDOW_START` | the frontend | a measurement window opens | samples CPU, packets, engines |
//! | `WINDOW_MID` | the frontend | half-way through the window | counts the plane's connections |
//! | `WINDOW_END` | the frontend | the window closes | samples CPU, packets, engines again |
//! | `RESULT <json>` | the frontend | after each window | reads the [`FrontendReport`] of that window |
//!
//! A run has one window per load step (one for a closed loop, one per rate for an open loop),
//! each followed by its `RESULT`. The orchestrator writes commands to the children's stdin:
//! `GO` to every frontend once all have said `READY` ([`FrontendCommand`]: the frontends of a
//! run start their load together), and `SAMPLE` to every worker at each edge of a window
//! ([`WorkerCommand`]).
//!
//! A worker's lines are [`WorkerLine`]s and the frontend's are [`FrontendLine`]s: `Display`
//! encodes one (without the newline), `FromStr` decodes one, and a line that is not a message
//! yields a [`LineError`] naming it, never a panic. The orchestrator skips frontend lines
//! whose keyword it does not know (other output on the frontend's stdout), but fails the run
//! on a known keyword with a bad argument, and on a worker whose first line is not `READY`.
//!
//! The peer binaries (`peers/`) speak this protocol through this module: they run their roles
//! with [`crate::roles`], which writes every line, and depend on velo-bench by path rather
//! than on a copy of the format. The orchestrator rebuilds a stale peer binary before its
//! first run ([`crate::peers::ensure_built`]), so both ends always come from the same source.

use std::fmt::{self, Write as _};
use std::str::FromStr;

use tokio::io::AsyncWriteExt;

use crate::engine_stats::EngineStats;
use crate::frontend::FrontendReport;

/// A line a worker process writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerLine {
    /// It takes requests at `address` (the ingress's own format, without whitespace).
    Ready {
        /// Where the frontend sends this process's requests.
        address: String,
    },
    /// Its engines' counters, in answer to [`WorkerCommand::Sample`].
    Engines(EngineStats),
}

/// A line the orchestrator writes to a frontend's stdin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontendCommand {
    /// Start the load (every frontend of a run is told at once, once all are ready).
    Go,
}

/// A line the orchestrator writes to a worker's stdin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerCommand {
    /// Say the engines' counters now ([`WorkerLine::Engines`]).
    Sample,
}

/// A line the frontend process writes, in this order.
#[derive(Debug, Clone, PartialEq)]
pub enum FrontendLine {
    /// Its plane listens; the plane's connections are counted on TCP port `port` (0: none).
    Ready {
        /// The plane's TCP port ([`crate::adapter::BenchFrontend::port`]).
        port: u16,
    },
    /// The measurement window opens.
    WindowStart,
    /// Half-way through the window.
    WindowMid,
    /// The window closes.
    WindowEnd,
    /// What the frontend measured; its last line.
    Result(Box<FrontendReport>),
}

/// A line that is not a message of the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    /// The line, cut to [`EXCERPT_CHARS`] characters.
    excerpt: String,
    problem: Problem,
}

/// What is wrong with a line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Problem {
    /// Its keyword is not one of the protocol's.
    Unknown,
    /// The keyword needs an argument (what it wants) and has none.
    MissingArgument(&'static str, &'static str),
    /// The keyword takes no argument and has one.
    UnexpectedArgument(&'static str),
    /// The argument is not what the keyword wants: (keyword, what it wants, why not).
    BadArgument(&'static str, &'static str, String),
}

impl WorkerLine {
    /// Writes this line and a newline to stdout and flushes, so the orchestrator reads it at
    /// once.
    ///
    /// # Errors
    ///
    /// Stdout's I/O error.
    pub async fn say(&self) -> std::io::Result<()> {
        write_line(self).await
    }
}

impl FrontendLine {
    /// Writes this line and a newline to stdout and flushes, so the orchestrator reads it at
    /// once.
    ///
    /// # Errors
    ///
    /// Stdout's I/O error, or a report that does not encode as JSON (which a
    /// [`FrontendReport`], numbers, strings and lists, never fails to).
    pub async fn say(&self) -> std::io::Result<()> {
        write_line(self).await
    }
}

impl LineError {
    /// Whether the line's keyword is unknown (rather than a known keyword with a bad
    /// argument): output that is not meant for the orchestrator.
    pub fn is_unknown(&self) -> bool {
        self.problem == Problem::Unknown
    }

    fn new(line: &str, problem: Problem) -> Self {
        let mut excerpt: String = line.chars().take(EXCERPT_CHARS).collect();
        if excerpt.len() < line.len() {
            excerpt.push('…');
        }
        Self { excerpt, problem }
    }
}

impl fmt::Display for WorkerLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ready { address } => write!(f, "{READY} {address}"),
            Self::Engines(stats) => {
                let json = serde_json::to_string(stats).map_err(|_| fmt::Error)?;
                write!(f, "{ENGINES} {json}")
            }
        }
    }
}

impl fmt::Display for FrontendCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Go => f.write_str(GO),
        }
    }
}

impl FromStr for FrontendCommand {
    type Err = LineError;

    fn from_str(line: &str) -> Result<Self, LineError> {
        match split(line) {
            (GO, None) => Ok(Self::Go),
            (GO, Some(_)) => Err(LineError::new(line, Problem::UnexpectedArgument(GO))),
            _ => Err(LineError::new(line, Problem::Unknown)),
        }
    }
}

impl fmt::Display for WorkerCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sample => f.write_str(SAMPLE),
        }
    }
}

impl FromStr for WorkerCommand {
    type Err = LineError;

    fn from_str(line: &str) -> Result<Self, LineError> {
        match split(line) {
            (SAMPLE, None) => Ok(Self::Sample),
            (SAMPLE, Some(_)) => Err(LineError::new(line, Problem::UnexpectedArgument(SAMPLE))),
            _ => Err(LineError::new(line, Problem::Unknown)),
        }
    }
}

impl FromStr for WorkerLine {
    type Err = LineError;

    fn from_str(line: &str) -> Result<Self, LineError> {
        let (keyword, argument) = split(line);
        match keyword {
            READY => Ok(Self::Ready {
                address: address(line, argument)?,
            }),
            ENGINES => Ok(Self::Engines(json(line, ENGINES, ENGINES_WANTS, argument)?)),
            _ => Err(LineError::new(line, Problem::Unknown)),
        }
    }
}

impl fmt::Display for FrontendLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ready { port } => write!(f, "{READY} {port}"),
            Self::WindowStart => f.write_str(WINDOW_START),
            Self::WindowMid => f.write_str(WINDOW_MID),
            Self::WindowEnd => f.write_str(WINDOW_END),
            Self::Result(report) => {
                // JSON escapes control characters in strings: the report stays on one line.
                let json = serde_json::to_string(report).map_err(|_| fmt::Error)?;
                write!(f, "{RESULT} {json}")
            }
        }
    }
}

impl FromStr for FrontendLine {
    type Err = LineError;

    fn from_str(line: &str) -> Result<Self, LineError> {
        let (keyword, argument) = split(line);
        let bare = |keyword: &'static str, message: Self| match argument {
            None => Ok(message),
            Some(_) => Err(LineError::new(line, Problem::UnexpectedArgument(keyword))),
        };
        match keyword {
            READY => Ok(Self::Ready {
                port: port(line, argument)?,
            }),
            WINDOW_START => bare(WINDOW_START, Self::WindowStart),
            WINDOW_MID => bare(WINDOW_MID, Self::WindowMid),
            WINDOW_END => bare(WINDOW_END, Self::WindowEnd),
            RESULT => Ok(Self::Result(Box::new(json(
                line,
                RESULT,
                RESULT_WANTS,
                argument,
            )?))),
            _ => Err(LineError::new(line, Problem::Unknown)),
        }
    }
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: ", self.excerpt)?;
        match &self.problem {
            Problem::Unknown => f.write_str("not a line of the bench protocol"),
            Problem::MissingArgument(keyword, wants) => write!(f, "{keyword} needs {wants}"),
            Problem::UnexpectedArgument(keyword) => write!(f, "{keyword} takes no argument"),
            Problem::BadArgument(keyword, wants, why) => {
                write!(f, "{keyword} needs {wants}: {why}")
            }
        }
    }
}

impl std::error::Error for LineError {}

/// Writes `message` and a newline to stdout and flushes, so the orchestrator reads the line
/// as soon as it is said. Encoding into a buffer first turns a message that does not encode
/// into an error instead of a panic.
async fn write_line(message: &dyn fmt::Display) -> std::io::Result<()> {
    let mut line = String::new();
    writeln!(line, "{message}")
        .map_err(|_| std::io::Error::other("a bench protocol line did not encode"))?;
    let mut out = tokio::io::stdout();
    out.write_all(line.as_bytes()).await?;
    out.flush().await
}

/// A line's keyword and its argument (everything after the first space).
fn split(line: &str) -> (&str, Option<&str>) {
    match line.split_once(' ') {
        Some((keyword, argument)) => (keyword, Some(argument)),
        None => (line, None),
    }
}

/// `READY`'s argument on a worker's line: an address without whitespace.
fn address(line: &str, argument: Option<&str>) -> Result<String, LineError> {
    const WANTS: &str = "an address";
    let address = argument.map(str::trim).unwrap_or_default();
    if address.is_empty() {
        return Err(LineError::new(line, Problem::MissingArgument(READY, WANTS)));
    }
    if address.contains(char::is_whitespace) {
        let why = "it contains whitespace".to_owned();
        return Err(LineError::new(
            line,
            Problem::BadArgument(READY, WANTS, why),
        ));
    }
    Ok(address.to_owned())
}

/// `READY`'s argument on the frontend's line: a TCP port.
fn port(line: &str, argument: Option<&str>) -> Result<u16, LineError> {
    const WANTS: &str = "a TCP port";
    let port = argument.map(str::trim).unwrap_or_default();
    if port.is_empty() {
        return Err(LineError::new(line, Problem::MissingArgument(READY, WANTS)));
    }
    port.parse()
        .map_err(|e| LineError::new(line, Problem::BadArgument(READY, WANTS, format!("{e}"))))
}

/// A JSON argument (`RESULT`'s report, `ENGINES`' counters) of `keyword`, which wants it as
/// `wants` says.
fn json<T: serde::de::DeserializeOwned>(
    line: &str,
    keyword: &'static str,
    wants: &'static str,
    argument: Option<&str>,
) -> Result<T, LineError> {
    let Some(json) = argument.filter(|j| !j.trim().is_empty()) else {
        return Err(LineError::new(
            line,
            Problem::MissingArgument(keyword, wants),
        ));
    };
    serde_json::from_str(json)
        .map_err(|e| LineError::new(line, Problem::BadArgument(keyword, wants, format!("{e}"))))
}

const RESULT_WANTS: &str = "the frontend's report as JSON";
const ENGINES_WANTS: &str = "the engines' counters as JSON";

const READY: &str = "READY";
const ENGINES: &str = "ENGINES";
const SAMPLE: &str = "SAMPLE";
const GO: &str = "GO";
const WINDOW_START: &str = "WINDOW_START";
const WINDOW_MID: &str = "WINDOW_MID";
const WINDOW_END: &str = "WINDOW_END";
const RESULT: &str = "RESULT";

/// Characters of a bad line an error quotes (a `RESULT` line runs to kilobytes).
const EXCERPT_CHARS: usize = 120;

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> FrontendReport {
        FrontendReport {
            requests: 120,
            errors: 2,
            tokens: 15_360,
            window_s: 1.5,
            ttft_p50_ms: 4.25,
            ttft_p99_ms: 18.5,
            prologue_p50_ms: 0.5,
            prologue_p99_ms: 2.0,
            latency_p50_ms: 100.0,
            latency_p99_ms: 151.75,
            itl_mean_p50_ms: 0.75,
            itl_mean_p99_ms: 1.125,
            ttft_cdf: vec![(1.0, 0.5), (4.5, 1.0)],
            itl_cdf: vec![(0.25, 1.0)],
            tokens_series: vec![0, 7, 1024],
            error_samples: vec!["two\nlines".into(), "a \"quoted\" tab\t".into()],
            step: 2,
            offered_rate: 1e4 / 3.0,
            arrivals: 130,
            dropped: 1,
            late: 3,
            chunk_gap_p50_ms: 0.5,
            chunk_gap_p99_ms: 6.25,
            hists: crate::frontend::Hists {
                ttft: vec![(4250, 60), (18_500, 60)],
                chunk_gap: vec![(1, u64::MAX)],
                ..crate::frontend::Hists::default()
            },
        }
    }

    fn frontend_lines() -> Vec<FrontendLine> {
        vec![
            FrontendLine::Ready { port: 0 },
            FrontendLine::Ready { port: 43_117 },
            FrontendLine::WindowStart,
            FrontendLine::WindowMid,
            FrontendLine::WindowEnd,
            FrontendLine::Result(Box::new(report())),
            FrontendLine::Result(Box::default()),
        ]
    }

    #[test]
    fn every_frontend_line_round_trips_on_one_line() {
        for message in frontend_lines() {
            let line = message.to_string();
            assert!(!line.contains('\n'), "{line:?}");
            assert_eq!(line.parse::<FrontendLine>(), Ok(message), "{line:?}");
        }
    }

    #[test]
    fn every_worker_line_round_trips_on_one_line() {
        let ready = [
            "127.0.0.1:40321",
            "[::1]:9",
            "tcp://127.0.0.1:5555/1a2b/velo-bench/mocker/generate",
        ]
        .map(|address| WorkerLine::Ready {
            address: address.into(),
        });
        let engines = WorkerLine::Engines(EngineStats {
            passes: 10,
            prefill_passes: 3,
            admitted: 17,
            gap_us_sq: u64::MAX,
            ..EngineStats::default()
        });
        for message in ready.into_iter().chain([engines]) {
            let line = message.to_string();
            assert!(!line.contains('\n'), "{line:?}");
            assert_eq!(line.parse::<WorkerLine>(), Ok(message), "{line:?}");
        }
    }

    #[test]
    fn the_sample_command_round_trips_and_nothing_else_is_a_command() {
        let line = WorkerCommand::Sample.to_string();
        assert_eq!(line, "SAMPLE");
        assert_eq!(line.parse(), Ok(WorkerCommand::Sample));
        let e = "SAMPLE now".parse::<WorkerCommand>().unwrap_err();
        assert!(!e.is_unknown() && e.to_string().contains("SAMPLE takes no argument"));
        for line in ["", "sample", "READY 1", "ENGINES {}", "GO"] {
            assert!(
                line.parse::<WorkerCommand>().unwrap_err().is_unknown(),
                "{line:?}"
            );
        }
    }

    #[test]
    fn the_go_command_round_trips_and_nothing_else_is_a_frontend_command() {
        assert_eq!(FrontendCommand::Go.to_string(), "GO");
        assert_eq!("GO".parse(), Ok(FrontendCommand::Go));
        assert!(!"GO 1".parse::<FrontendCommand>().unwrap_err().is_unknown());
        for line in ["", "go", "SAMPLE", "WINDOW_START"] {
            assert!(
                line.parse::<FrontendCommand>().unwrap_err().is_unknown(),
                "{line:?}"
            );
        }
    }

    #[test]
    fn the_encoding_is_the_one_peer_binaries_and_old_logs_use() {
        let ready = WorkerLine::Ready {
            address: "127.0.0.1:1".into(),
        };
        assert_eq!(ready.to_string(), "READY 127.0.0.1:1");
        assert_eq!(FrontendLine::Ready { port: 80 }.to_string(), "READY 80");
        assert_eq!(FrontendLine::WindowStart.to_string(), "WINDOW_START");
        assert_eq!(FrontendLine::WindowMid.to_string(), "WINDOW_MID");
        assert_eq!(FrontendLine::WindowEnd.to_string(), "WINDOW_END");
        let result = FrontendLine::Result(Box::default()).to_string();
        assert!(result.starts_with("RESULT {\"requests\":0,"), "{result}");
    }

    #[test]
    fn malformed_frontend_lines_are_errors_that_quote_the_line() {
        let cases: [(&str, &str); 14] = [
            ("READY", "READY needs a TCP port"),
            ("READY ", "READY needs a TCP port"),
            ("READY http", "READY needs a TCP port: invalid digit"),
            ("READY 65536", "READY needs a TCP port: number too large"),
            ("READY -1", "READY needs a TCP port: invalid digit"),
            ("WINDOW_START now", "WINDOW_START takes no argument"),
            ("WINDOW_MID ", "WINDOW_MID takes no argument"),
            ("WINDOW_END 3", "WINDOW_END takes no argument"),
            ("RESULT", "RESULT needs the frontend's report as JSON"),
            ("RESULT  ", "RESULT needs the frontend's report as JSON"),
            (
                "RESULT {",
                "RESULT needs the frontend's report as JSON: EOF",
            ),
            (
                "RESULT 42",
                "RESULT needs the frontend's report as JSON: invalid type",
            ),
            ("RESULT {\"requests\":1}", "missing field"),
            ("RESULT null", "invalid type: null"),
        ];
        for (line, says) in cases {
            let e = line.parse::<FrontendLine>().expect_err(line);
            assert!(!e.is_unknown(), "{line:?}");
            let text = e.to_string();
            assert!(text.starts_with(&format!("{line:?}: ")), "{text}");
            assert!(text.contains(says), "{line:?}: {text}");
        }
        let trailing = format!("{} x", FrontendLine::Result(Box::default()));
        let e = trailing.parse::<FrontendLine>().unwrap_err().to_string();
        assert!(e.contains("trailing characters"), "{e}");
    }

    #[test]
    fn lines_with_unknown_keywords_are_unknown() {
        for line in [
            "",
            " ",
            "hello",
            "ready 80",
            "WINDOW_STARTED",
            " WINDOW_START",
            "RESULTS {}",
            "\u{1F600}",
        ] {
            let e = line.parse::<FrontendLine>().expect_err(line);
            assert!(e.is_unknown(), "{line:?}");
            assert!(
                e.to_string().ends_with("not a line of the bench protocol"),
                "{e}"
            );
            assert!(line.parse::<WorkerLine>().expect_err(line).is_unknown());
        }
        // A worker says nothing but READY.
        assert!(
            "WINDOW_START"
                .parse::<WorkerLine>()
                .unwrap_err()
                .is_unknown()
        );
    }

    #[test]
    fn malformed_worker_lines_are_errors() {
        for (line, says) in [
            ("READY", "READY needs an address"),
            ("READY  ", "READY needs an address"),
            (
                "READY a b",
                "READY needs an address: it contains whitespace",
            ),
            ("ENGINES", "ENGINES needs the engines' counters as JSON"),
            ("ENGINES {\"passes\":1}", "missing field"),
        ] {
            let e = line.parse::<WorkerLine>().expect_err(line);
            assert!(!e.is_unknown());
            assert!(e.to_string().contains(says), "{e}");
        }
    }

    #[test]
    fn long_and_multibyte_lines_are_quoted_in_part_without_panicking() {
        let line = format!("RESULT {}", "é".repeat(10_000));
        let e = line.parse::<FrontendLine>().unwrap_err().to_string();
        assert!(e.len() < 1_000, "{} bytes", e.len());
        assert!(e.contains("é…\": RESULT needs"), "{e}");
        let short = "READY é".parse::<FrontendLine>().unwrap_err().to_string();
        assert!(short.starts_with("\"READY é\": "), "{short}");
    }
}
