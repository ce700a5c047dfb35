//! The frontend's pending registrations: each waits for its stream's first record.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use subtle::ConstantTimeEq;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::{Disconnect, ResponseError};

/// How long a removed worker instance stays tombstoned: a registration racing its removal
/// fails at once instead of waiting for a stream that will never come.
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(5);

/// Most removed worker instances remembered at once. Past it the oldest tombstone goes first
/// (it is the next to expire anyway): a burst of removals cannot grow the frontend.
pub const MAX_TOMBSTONES: usize = 1 << 16;

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
    /// The registration is tied to a worker instance and the stream came from a connection
    /// that did not announce it.
    WrongWorker,
}

pub(crate) struct Registry {
    inner: Mutex<Inner>,
}

struct Inner {
    slots: Vec<Slot>,
    free: Vec<u32>,
    pending: usize,
    by_worker: HashMap<u64, HashSet<u64>>,
    tombstones: Tombstones,
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
                tombstones: Tombstones::default(),
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

    /// Takes the registration `ticket` for an arriving stream whose address carries `token`,
    /// from a connection that announced worker instance `from`. A registration tied to a
    /// worker ([`associate`](Self::associate)) is taken only by a stream from that worker;
    /// the token is compared in constant time.
    pub(crate) fn claim(
        &self,
        ticket: u64,
        token: &[u8; 16],
        from: Option<u64>,
    ) -> Result<oneshot::Sender<Arrival>, Refusal> {
        let mut g = self.lock();
        let (index, generation) = split(ticket);
        let reg = g
            .slots
            .get(index)
            .filter(|s| s.generation == generation)
            .and_then(|s| s.reg.as_ref())
            .ok_or(Refusal::Unknown)?;
        if !bool::from(reg.token.ct_eq(token)) {
            return Err(Refusal::BadToken);
        }
        if reg.worker.is_some_and(|w| from != Some(w)) {
            return Err(Refusal::WrongWorker);
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

    /// Ties `ticket` to the worker instance its request went to, untying it from the one
    /// it was tied to before (a retry on another worker).
    pub(crate) fn associate(&self, ticket: u64, worker: u64) -> Result<(), ResponseError> {
        let mut g = self.lock();
        g.tombstones.prune(Instant::now());
        if g.tombstones.contains(worker) {
            return Err(removed(worker));
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
        let before = reg.worker.replace(worker);
        if let Some(old) = before.filter(|&old| old != worker) {
            g.unlink(old, ticket);
        }
        g.by_worker.entry(worker).or_default().insert(ticket);
        Ok(())
    }

    /// Ends every registration tied to `worker` with `Disconnected` and tombstones it.
    pub(crate) fn cancel_worker(&self, worker: u64) -> usize {
        let mut g = self.lock();
        let now = Instant::now();
        g.tombstones.prune(now);
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
                // A pending handle already dropped needs no telling.
                let _ = reg.tx.send(Arrival::Failed(removed(worker)));
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
        if let Some(w) = reg.worker {
            self.unlink(w, t);
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

    /// Removes `ticket` from `worker`'s set, and the set once empty.
    fn unlink(&mut self, worker: u64, ticket: u64) {
        if let Some(set) = self.by_worker.get_mut(&worker) {
            set.remove(&ticket);
            if set.is_empty() {
                self.by_worker.remove(&worker);
            }
        }
    }
}

/// Removed worker instances until their tombstone expires, kept in expiry order: a request
/// prunes only what expired, from the front, never rescanning the live ones (Dynamo's
/// registries rescan every record on every request, its issue #16340).
#[derive(Default)]
struct Tombstones {
    /// `(expiry, worker)`, oldest first. The TTL is fixed and time only moves on, so pushing
    /// at the back keeps the order. A worker removed twice has two entries; the later wins.
    order: VecDeque<(Instant, u64)>,
    /// Each tombstoned worker's latest expiry.
    until: HashMap<u64, Instant>,
}

impl Tombstones {
    /// Forgets every tombstone expired at `now`.
    fn prune(&mut self, now: Instant) {
        while let Some(&(at, _)) = self.order.front()
            && at <= now
        {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        if let Some((at, worker)) = self.order.pop_front()
            && self.until.get(&worker) == Some(&at)
        {
            self.until.remove(&worker);
        }
    }

    /// Tombstones `worker` until `at`, dropping the oldest tombstone at the limit.
    fn insert(&mut self, worker: u64, at: Instant) {
        if self.order.len() >= MAX_TOMBSTONES {
            self.pop_front();
        }
        self.order.push_back((at, worker));
        self.until.insert(worker, at);
    }

    /// Whether `worker` is tombstoned (call [`prune`](Self::prune) first).
    fn contains(&self, worker: u64) -> bool {
        self.until.contains_key(&worker)
    }

    /// Workers tombstoned.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.until.len()
    }
}

/// How a registration tied to a removed worker instance ends.
fn removed(instance: u64) -> ResponseError {
    ResponseError::Disconnected(Disconnect::InstanceRemoved { instance })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `rx` holds the `Disconnected` that ends a registration of a removed worker.
    fn ended(rx: &mut oneshot::Receiver<Arrival>) -> bool {
        matches!(
            rx.try_recv(),
            Ok(Arrival::Failed(ResponseError::Disconnected(
                Disconnect::InstanceRemoved { .. }
            )))
        )
    }

    #[test]
    fn a_registration_tied_to_a_worker_is_claimed_only_by_that_worker() {
        let r = Registry::new();
        let (t, token, _rx) = r.register().unwrap();
        r.associate(t, 7).unwrap();
        assert_eq!(r.claim(t, &token, None).err(), Some(Refusal::WrongWorker));
        assert_eq!(
            r.claim(t, &token, Some(8)).err(),
            Some(Refusal::WrongWorker)
        );
        assert_eq!(
            r.pending(),
            1,
            "a refused claim leaves the registration waiting"
        );
        let mut wrong = token;
        wrong[15] ^= 1;
        assert_eq!(r.claim(t, &wrong, Some(7)).err(), Some(Refusal::BadToken));
        assert!(r.claim(t, &token, Some(7)).is_ok());
    }

    #[test]
    fn an_untied_registration_is_claimed_by_any_worker_with_its_token() {
        let r = Registry::new();
        let (t, token, _rx) = r.register().unwrap();
        assert!(r.claim(t, &token, Some(3)).is_ok());
        let (t, token, _rx) = r.register().unwrap();
        assert!(r.claim(t, &token, None).is_ok());
    }

    #[test]
    fn re_association_moves_the_registration_to_the_new_worker() {
        let r = Registry::new();
        let (t, _token, mut rx) = r.register().unwrap();
        r.associate(t, 1).unwrap();
        r.associate(t, 2).unwrap();
        assert_eq!(r.cancel_worker(1), 0, "the old worker no longer serves it");
        assert!(!ended(&mut rx));
        assert_eq!(r.pending(), 1);
        assert!(
            !r.lock().by_worker.contains_key(&1),
            "no entry is left behind"
        );
        assert_eq!(r.cancel_worker(2), 1);
        assert!(ended(&mut rx));
    }

    #[tokio::test(start_paused = true)]
    async fn a_tombstone_fails_associations_until_its_ttl_passes() {
        let r = Registry::new();
        r.cancel_worker(7);
        let (t, _token, _rx) = r.register().unwrap();
        assert!(r.associate(t, 7).is_err());
        tokio::time::advance(TOMBSTONE_TTL - Duration::from_millis(1)).await;
        assert!(r.associate(t, 7).is_err());
        tokio::time::advance(Duration::from_millis(1)).await;
        r.associate(t, 7).unwrap();
        assert_eq!(r.lock().tombstones.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn expired_tombstones_are_pruned_and_live_ones_kept() {
        let r = Registry::new();
        r.cancel_worker(1);
        tokio::time::advance(Duration::from_secs(2)).await;
        r.cancel_worker(2);
        tokio::time::advance(TOMBSTONE_TTL - Duration::from_secs(1)).await;
        // Worker 1's tombstone expired, worker 2's has a second left.
        let (t, _token, _rx) = r.register().unwrap();
        r.associate(t, 3).unwrap();
        assert_eq!(r.lock().tombstones.len(), 1);
        assert!(r.associate(t, 2).is_err());
        r.associate(t, 1).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_removed_again_stays_tombstoned_for_the_later_ttl() {
        let r = Registry::new();
        r.cancel_worker(1);
        tokio::time::advance(Duration::from_secs(3)).await;
        r.cancel_worker(1);
        tokio::time::advance(Duration::from_secs(3)).await;
        // The first removal expired; the second has 2 s left.
        let (t, _token, _rx) = r.register().unwrap();
        assert!(r.associate(t, 1).is_err());
        tokio::time::advance(Duration::from_secs(2)).await;
        r.associate(t, 1).unwrap();
        assert_eq!(r.lock().tombstones.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn tombstones_are_capped_oldest_first() {
        let r = Registry::new();
        let n = u64::try_from(MAX_TOMBSTONES).unwrap();
        for worker in 0..=n {
            r.cancel_worker(worker);
        }
        let g = r.lock();
        assert_eq!(g.tombstones.len(), MAX_TOMBSTONES);
        assert!(!g.tombstones.contains(0) && g.tombstones.contains(n));
    }
}
