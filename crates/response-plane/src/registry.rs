//! The frontend's pending registrations: each waits for its stream's first record.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::ResponseError;

/// How long a removed worker instance stays tombstoned: a registration racing its removal
/// fails at once instead of waiting for a stream that will never come.
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(5);

/// Most registrations pending at once; more are refused with [`ResponseError::Overloaded`].
pub const MAX_PENDING: usize = 1 << 20;

/// What reaches a pending registration.
pub(crate) enum Arrival {
    /// The velo plane: the stream's OPEN (with the prologue) arrived.
    Velo(velo_session::IncomingStream),
    /// The classic plane: the worker's connection, past its handshake.
    Classic(crate::classic::Incoming),
    /// The registration ended without a stream.
    Failed(ResponseError),
}

/// Why an arriving stream was not claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No registration has that ticket (never, or no longer: dropped, timed out, cancelled).
    Unknown,
    /// The ticket exists but the token differs.
    BadToken,
}

pub(crate) struct Registry {
    inner: Mutex<Inner>,
}

struct Inner {
    slots: Vec<Slot>,
    free: Vec<u32>,
    pending: usize,
    by_worker: HashMap<u64, HashSet<u64>>,
    tombstones: HashMap<u64, Instant>,
    closed: bool,
    /// Generation new slots start at, so slots created after a shrink never repeat a ticket.
    floor: u32,
}

struct Slot {
    generation: u32,
    reg: Option<Reg>,
}

struct Reg {
    token: [u8; 16],
    tx: oneshot::Sender<Arrival>,
    worker: Option<u64>,
}

fn ticket(index: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index)
}

fn split(ticket: u64) -> (usize, u32) {
    // Truncation is the encoding: the low half is the index, the high half the generation.
    #[allow(clippy::cast_possible_truncation)]
    let (index, generation) = (ticket as u32, (ticket >> 32) as u32);
    (index as usize, generation)
}

impl Registry {
    pub(crate) fn new() -> Self {
        Self {
            inner: Mutex::new(Inner {
                slots: Vec::new(),
                free: Vec::new(),
                pending: 0,
                by_worker: HashMap::new(),
                tombstones: HashMap::new(),
                closed: false,
                floor: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new registration: its ticket, token, and where its arrival will be delivered.
    pub(crate) fn register(
        &self,
    ) -> Result<(u64, [u8; 16], oneshot::Receiver<Arrival>), ResponseError> {
        let mut g = self.lock();
        if g.closed {
            return Err(ResponseError::Closed);
        }
        if g.pending >= MAX_PENDING {
            return Err(ResponseError::Overloaded { limit: MAX_PENDING });
        }
        let token: [u8; 16] = rand::random();
        let (tx, rx) = oneshot::channel();
        let index = match g.free.pop() {
            Some(i) => i,
            None => {
                let i = u32::try_from(g.slots.len())
                    .map_err(|_| ResponseError::Overloaded { limit: MAX_PENDING })?;
                let generation = g.floor;
                g.slots.push(Slot {
                    generation,
                    reg: None,
                });
                i
            }
        };
        let slot = &mut g.slots[index as usize];
        slot.reg = Some(Reg {
            token,
            tx,
            worker: None,
        });
        let t = ticket(index, slot.generation);
        g.pending += 1;
        Ok((t, token, rx))
    }

    /// Takes the registration `ticket` for an arriving stream whose address carries `token`.
    pub(crate) fn claim(
        &self,
        ticket: u64,
        token: &[u8; 16],
    ) -> Result<oneshot::Sender<Arrival>, Refusal> {
        let mut g = self.lock();
        let (index, generation) = split(ticket);
        let slot = g
            .slots
            .get(index)
            .filter(|s| s.generation == generation && s.reg.is_some())
            .ok_or(Refusal::Unknown)?;
        if slot.reg.as_ref().is_some_and(|r| &r.token != token) {
            return Err(Refusal::BadToken);
        }
        let reg = g.take(index).ok_or(Refusal::Unknown)?;
        Ok(reg.tx)
    }

    /// Forgets `ticket` (its pending handle was dropped or timed out).
    pub(crate) fn remove(&self, ticket: u64) {
        let mut g = self.lock();
        let (index, generation) = split(ticket);
        if g.slots
            .get(index)
            .is_some_and(|s| s.generation == generation)
        {
            g.take(index);
        }
    }

    /// Ties `ticket` to the worker instance its request went to.
    pub(crate) fn associate(&self, ticket: u64, worker: u64) -> Result<(), ResponseError> {
        let mut g = self.lock();
        let now = Instant::now();
        if let Some(until) = g.tombstones.get(&worker).copied() {
            if now < until {
                return Err(ResponseError::Disconnected {
                    reason: format!("worker instance {worker} was removed from discovery"),
                });
            }
            g.tombstones.remove(&worker);
        }
        let (index, generation) = split(ticket);
        let Some(reg) = g
            .slots
            .get_mut(index)
            .filter(|s| s.generation == generation)
            .and_then(|s| s.reg.as_mut())
        else {
            return Ok(()); // already arrived or gone: nothing to end later
        };
        reg.worker = Some(worker);
        g.by_worker.entry(worker).or_default().insert(ticket);
        Ok(())
    }

    /// Ends every registration tied to `worker` with `Disconnected` and tombstones it.
    pub(crate) fn cancel_worker(&self, worker: u64) -> usize {
        let mut g = self.lock();
        let now = Instant::now();
        g.tombstones.retain(|_, until| *until > now);
        g.tombstones.insert(worker, now + TOMBSTONE_TTL);
        let tickets = g.by_worker.remove(&worker).unwrap_or_default();
        let mut ended = 0;
        for t in tickets {
            let (index, generation) = split(t);
            if g.slots
                .get(index)
                .is_some_and(|s| s.generation == generation)
                && let Some(reg) = g.take(index)
            {
                let reason = format!("worker instance {worker} was removed from discovery");
                let _ = reg
                    .tx
                    .send(Arrival::Failed(ResponseError::Disconnected { reason }));
                ended += 1;
            }
        }
        ended
    }

    /// Ends every registration with `Closed` and refuses new ones.
    pub(crate) fn close(&self) {
        let mut g = self.lock();
        g.closed = true;
        for i in 0..g.slots.len() {
            if let Some(reg) = g.take(i) {
                let _ = reg.tx.send(Arrival::Failed(ResponseError::Closed));
            }
        }
    }

    /// Registrations waiting for their stream.
    pub(crate) fn pending(&self) -> usize {
        self.lock().pending
    }
}

impl Inner {
    /// Empties slot `index`, moving its generation on, and unlinks it from its worker.
    fn take(&mut self, index: usize) -> Option<Reg> {
        let slot = self.slots.get_mut(index)?;
        let reg = slot.reg.take()?;
        let t = ticket(u32::try_from(index).ok()?, slot.generation);
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(u32::try_from(index).ok()?);
        self.pending -= 1;
        if let Some(w) = reg.worker
            && let Some(set) = self.by_worker.get_mut(&w)
        {
            set.remove(&t);
            if set.is_empty() {
                self.by_worker.remove(&w);
            }
        }
        if self.pending == 0 && self.slots.len() > 1024 {
            // Everything drained: give the memory of a past burst back.
            self.floor = self.slots.iter().map(|s| s.generation).max().unwrap_or(0);
            self.slots.clear();
            self.free.clear();
            self.slots.shrink_to_fit();
            self.free.shrink_to_fit();
        }
        Some(reg)
    }
}
