//! A text protocol to drive a proxy from another process (the soak): one command per line.
//!
//! ```text
//! both pass | up stall | down reset | both cut 4096 | up delay 50 | both stop-reading
//! upstream 127.0.0.1:4000
//! quit
//! ```
//!
//! `up` is client to upstream ([`Direction::ToUpstream`]), `down` the other way; delays are in
//! milliseconds, cuts in bytes.

use std::net::SocketAddr;
use std::time::Duration;

use super::{Direction, Fault};

/// One control command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Set the fault of one direction, or of both (`None`).
    Set(Option<Direction>, Fault),
    /// Forward new connections to this address.
    Upstream(SocketAddr),
    /// Stop the proxy.
    Quit,
}

/// Parses one control line.
///
/// # Errors
///
/// A message saying what is wrong with the line.
pub fn parse_control(line: &str) -> Result<Control, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["quit"] => Ok(Control::Quit),
        ["upstream", addr] => addr
            .parse()
            .map(Control::Upstream)
            .map_err(|_| format!("not an address: {addr}")),
        [dir, rest @ ..] => {
            let dir = match *dir {
                "up" => Some(Direction::ToUpstream),
                "down" => Some(Direction::ToClient),
                "both" => None,
                other => return Err(format!("unknown direction `{other}` (up, down, both)")),
            };
            Ok(Control::Set(dir, parse_fault(rest)?))
        }
        [] => Err("an empty command".into()),
    }
}

fn parse_fault(words: &[&str]) -> Result<Fault, String> {
    let number = |w: &str| {
        w.parse::<u64>()
            .map_err(|_| format!("not a whole number: {w}"))
    };
    match words {
        ["pass"] => Ok(Fault::Pass),
        ["stall"] => Ok(Fault::Stall),
        ["stop-reading"] => Ok(Fault::StopReading),
        ["reset"] => Ok(Fault::Reset),
        ["delay", ms] => Ok(Fault::Delay(Duration::from_millis(number(ms)?))),
        ["cut", bytes] => Ok(Fault::CutAfter(number(bytes)?)),
        other => Err(format!(
            "unknown fault `{}` (pass, stall, stop-reading, reset, delay MS, cut BYTES)",
            other.join(" ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(line: &str, expect: Result<Control, &str>) {
        match (parse_control(line), expect) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{line}"),
            (Err(got), Err(want)) => assert!(got.contains(want), "{line}: {got}"),
            (got, want) => panic!("{line}: got {got:?}, expected {want:?}"),
        }
    }

    #[test]
    fn commands_name_a_direction_and_a_fault() {
        check("both pass", Ok(Control::Set(None, Fault::Pass)));
        check(
            "up stall",
            Ok(Control::Set(Some(Direction::ToUpstream), Fault::Stall)),
        );
        check(
            "down cut 4096",
            Ok(Control::Set(
                Some(Direction::ToClient),
                Fault::CutAfter(4096),
            )),
        );
        check(
            "both delay 50",
            Ok(Control::Set(None, Fault::Delay(Duration::from_millis(50)))),
        );
        check(
            "upstream 127.0.0.1:4000",
            Ok(Control::Upstream("127.0.0.1:4000".parse().unwrap())),
        );
        check("quit", Ok(Control::Quit));
    }

    #[test]
    fn malformed_commands_say_why() {
        check("sideways pass", Err("unknown direction"));
        check("up cut many", Err("not a whole number"));
        check("both explode", Err("unknown fault"));
        check("", Err("empty"));
        check("upstream nowhere", Err("not an address"));
    }
}
