//! Identifier newtypes carried on the wire.

use std::fmt;

/// A stream's address on a connection: a slot index plus the slot's generation.
///
/// The side that opens a stream picks both. Reusing a slot bumps its generation, so a record
/// still in flight for the slot's previous stream (same slot, older generation) can never be
/// mistaken for a record of the new one. The receiver drops and counts such stale records.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId {
    slot: u32,
    generation: u32,
}

impl StreamId {
    /// The id of `slot` at `generation`.
    pub const fn new(slot: u32, generation: u32) -> Self {
        Self { slot, generation }
    }

    /// The slot index.
    pub const fn slot(self) -> u32 {
        self.slot
    }

    /// How many times the slot had been used before this stream.
    pub const fn generation(self) -> u32 {
        self.generation
    }
}

impl fmt::Debug for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StreamId({}g{})", self.slot, self.generation)
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}g{}", self.slot, self.generation)
    }
}

/// A process instance's 128-bit identity, fresh at every start.
///
/// Zero is reserved: in a handshake's `peer_instance_id` it means "any peer".
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceId(u128);

impl InstanceId {
    /// The reserved "unknown / any" value.
    pub const ANY: Self = Self(0);

    /// Wraps a raw value.
    pub const fn from_u128(v: u128) -> Self {
        Self(v)
    }

    /// The raw value.
    pub const fn as_u128(self) -> u128 {
        self.0
    }

    /// Whether this is the reserved "any" value.
    pub const fn is_any(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Debug for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "InstanceId({:032x})", self.0)
    }
}

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// An unguessable 128-bit per-stream secret: only the holder of the stream's address can open it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(pub [u8; 16]);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Secrets stay out of logs.
        f.write_str("Token(..)")
    }
}

/// Which end of a lane sent a handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The dialing side, which opens response streams and sends their records.
    Worker,
    /// The listening side, which accepts response streams and consumes them.
    Frontend,
}

impl Role {
    pub(crate) const fn to_byte(self) -> u8 {
        match self {
            Self::Worker => 1,
            Self::Frontend => 2,
        }
    }

    pub(crate) const fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(Self::Worker),
            2 => Some(Self::Frontend),
            _ => None,
        }
    }
}
