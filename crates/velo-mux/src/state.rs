//! The lifecycle of one stream, the same on both sides.
//!
//! ```text
//!              open (worker: open() called; frontend: OPEN received)
//!                |
//!                v
//!   +-------- Open --------------------------+
//!   |            | stop (sent or received)   |
//!   |            v                           |
//!   |        Stopping ----------------------+|
//!   |            |                          ||
//!   | end        | end                      || cancel, lane lost, violation
//!   | (FINAL or  | (FINAL or ERROR          ||
//!   |  ERROR)    |  sent / received)        ||
//!   v            v                          vv
//!  Closed(Finished | Errored | Cancelled | Lost | Violation)
//!                |
//!                | release (the application lets go of the stream)
//!                v
//!            (slot free; its generation moves on)
//! ```
//!
//! `Data` keeps an open stream where it is. Every event that is not in the diagram is an
//! [`InvalidTransition`]: the mux drops the record or call that caused it (for example a
//! record still in flight for a stream that already ended) and counts it.

use std::fmt;

/// Where a stream is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Items flow.
    Open,
    /// The frontend asked the worker to finish soon; items still flow.
    Stopping,
    /// The stream has ended; the slot is kept until the application releases it.
    Closed(Closed),
}

/// How a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Closed {
    /// FINAL: the worker finished cleanly.
    Finished,
    /// ERROR: the worker ended the stream with an error.
    Errored,
    /// CANCEL: the frontend cancelled (or refused) the stream.
    Cancelled,
    /// The lane carrying the stream failed.
    Lost,
    /// The stream broke a protocol rule (sequence, credit, duplicate open).
    Violation,
}

/// Something that happens to a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// A DATA record is sent or received.
    Data,
    /// STOP is sent or received.
    Stop,
    /// FINAL is sent or received.
    Finish,
    /// ERROR is sent or received.
    Error,
    /// CANCEL is sent or received.
    Cancel,
    /// The stream's lane failed.
    LaneLost,
    /// The stream broke a protocol rule.
    Violation,
}

/// An event that the stream's state does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stream in state {state} cannot take event {event:?}")]
pub struct InvalidTransition {
    /// The state the stream was in.
    pub state: State,
    /// The event it could not take.
    pub event: Event,
}

impl State {
    /// All events, in a fixed order (for the transition table test).
    pub const EVENTS: [Event; 7] = [
        Event::Data,
        Event::Stop,
        Event::Finish,
        Event::Error,
        Event::Cancel,
        Event::LaneLost,
        Event::Violation,
    ];

    /// Every state, in a fixed order (for the transition table test).
    pub const ALL: [Self; 7] = [
        Self::Open,
        Self::Stopping,
        Self::Closed(Closed::Finished),
        Self::Closed(Closed::Errored),
        Self::Closed(Closed::Cancelled),
        Self::Closed(Closed::Lost),
        Self::Closed(Closed::Violation),
    ];

    /// The state after `event`, or why it cannot happen.
    pub fn on(self, event: Event) -> Result<Self, InvalidTransition> {
        let invalid = Err(InvalidTransition { state: self, event });
        let live = matches!(self, Self::Open | Self::Stopping);
        if !live {
            return invalid;
        }
        Ok(match event {
            Event::Data => self,
            Event::Stop => Self::Stopping,
            Event::Finish => Self::Closed(Closed::Finished),
            Event::Error => Self::Closed(Closed::Errored),
            Event::Cancel => Self::Closed(Closed::Cancelled),
            Event::LaneLost => Self::Closed(Closed::Lost),
            Event::Violation => Self::Closed(Closed::Violation),
        })
    }

    /// Whether items may still flow.
    pub fn is_live(self) -> bool {
        matches!(self, Self::Open | Self::Stopping)
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Open => f.write_str("open"),
            Self::Stopping => f.write_str("stopping"),
            Self::Closed(c) => write!(f, "closed({c:?})"),
        }
    }
}
