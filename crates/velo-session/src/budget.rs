//! The budget of unauthenticated connections: handshakes in progress, per source and in
//! total, kept apart from the lanes of workers that completed theirs. A flood of silent or
//! slow handshakes is refused at this budget and never takes a lane's place. Public so that
//! a plane with its own listener (response-plane's classic plane) keeps the same budget.
//!
//! # Fair shares when the budget is full
//!
//! The per-source share alone would let a few sources fill the whole budget (four addresses
//! at 64 each fill 256) and lock every newcomer out, a worker starting up included. So when
//! the total is full, a newcomer whose source holds fewer places than the source holding the
//! most takes the place of that source's oldest handshake, which is told to end
//! ([`HandshakeTicket::evicted`]): to fill the budget a flood needs as many sources as
//! places. An IPv6 source is its /64 (one host picks addresses in its own /64 at will).

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, PoisonError};

use tokio_util::sync::CancellationToken;

/// Handshakes in progress, counted per source and in total.
#[derive(Debug)]
pub struct HandshakeBudget {
    max_total: usize,
    max_per_source: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    total: usize,
    /// The places of each source, oldest first (`None`: connections whose transport cannot
    /// tell their source). At most `max_total` entries: an entry exists only while it counts
    /// a handshake.
    by_source: HashMap<Option<IpAddr>, VecDeque<Place>>,
    next_id: u64,
}

/// One handshake's place, as the budget keeps it.
#[derive(Debug)]
struct Place {
    id: u64,
    evicted: CancellationToken,
}

/// Which share of the budget was exhausted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exhausted {
    /// This source has `max_per_source` handshakes in progress.
    Source,
    /// The listener has `max_total` handshakes in progress, and no source holds more of them
    /// than this one.
    Total,
}

/// One handshake's place in the budget, given back when dropped.
#[derive(Debug)]
pub struct HandshakeTicket {
    budget: Arc<HandshakeBudget>,
    source: Option<IpAddr>,
    id: u64,
    evicted: CancellationToken,
}

impl HandshakeBudget {
    /// A budget of at most `max_total` handshakes in progress, at most `max_per_source` of
    /// them from one source.
    pub fn new(max_total: usize, max_per_source: usize) -> Arc<Self> {
        Arc::new(Self {
            max_total,
            max_per_source,
            state: Mutex::new(State::default()),
        })
    }

    /// A place for a handshake from `source` (`None`: a transport that cannot tell; only the
    /// total applies to it). When the total is full, a newcomer from a source holding fewer
    /// places than the heaviest one takes that source's oldest place (see the module doc).
    ///
    /// # Errors
    ///
    /// Which share is exhausted; the connection should be refused.
    pub fn enter(self: &Arc<Self>, source: Option<IpAddr>) -> Result<HandshakeTicket, Exhausted> {
        let source = source.map(source_of);
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let held = st.by_source.get(&source).map_or(0, VecDeque::len);
        if source.is_some() && held >= self.max_per_source {
            return Err(Exhausted::Source);
        }
        if st.total >= self.max_total && !st.evict_for(held) {
            return Err(Exhausted::Total);
        }
        let id = st.next_id;
        st.next_id += 1;
        let evicted = CancellationToken::new();
        st.by_source.entry(source).or_default().push_back(Place {
            id,
            evicted: evicted.clone(),
        });
        st.total += 1;
        Ok(HandshakeTicket {
            budget: self.clone(),
            source,
            id,
            evicted,
        })
    }

    /// Handshakes in progress, and sources holding them.
    #[cfg(test)]
    fn in_progress(&self) -> (usize, usize) {
        let st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        (st.total, st.by_source.len())
    }
}

impl State {
    /// Ends the oldest handshake of the source holding the most places (of those, the one
    /// whose oldest handshake is the oldest), if it holds more than one place beyond `held`
    /// (the newcomer's source's). Returns whether it did.
    fn evict_for(&mut self, held: usize) -> bool {
        let heaviest = self.by_source.iter_mut().max_by_key(|(_, p)| {
            let oldest = p.front().map_or(u64::MAX, |place| place.id);
            (p.len(), std::cmp::Reverse(oldest))
        });
        let Some((&heaviest, places)) = heaviest else {
            return false;
        };
        if places.len() <= held + 1 {
            return false;
        }
        if let Some(oldest) = places.pop_front() {
            oldest.evicted.cancel();
            self.total -= 1;
        }
        if places.is_empty() {
            self.by_source.remove(&heaviest);
        }
        true
    }
}

/// The source a budget counts `ip` under: an IPv4 address (IPv4-mapped ones too), or an IPv6
/// address's /64.
fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !u128::from(u64::MAX))),
        },
    }
}

impl HandshakeTicket {
    /// Resolves when this handshake lost its place to a newcomer from a lighter source: the
    /// connection should be dropped.
    pub async fn evicted(&self) {
        self.evicted.cancelled().await;
    }

    /// A token cancelled when this handshake loses its place (see
    /// [`evicted`](Self::evicted)), to watch while the ticket itself is moved.
    pub fn eviction(&self) -> CancellationToken {
        self.evicted.clone()
    }
}

impl Drop for HandshakeTicket {
    fn drop(&mut self) {
        if self.evicted.is_cancelled() {
            return; // its place was taken already
        }
        let mut st = self
            .budget
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(places) = st.by_source.get_mut(&self.source) else {
            return;
        };
        // Handshakes mostly end in the order they began: the place is near the front.
        if let Some(i) = places.iter().position(|p| p.id == self.id) {
            places.remove(i);
            if places.is_empty() {
                st.by_source.remove(&self.source);
            }
            st.total = st.total.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_source_cannot_take_more_than_its_share_and_others_still_get_in() {
        let b = HandshakeBudget::new(4, 2);
        let a: IpAddr = [10, 0, 0, 1].into();
        let c: IpAddr = [10, 0, 0, 2].into();
        let t1 = b.enter(Some(a)).unwrap();
        let _t2 = b.enter(Some(a)).unwrap();
        assert_eq!(b.enter(Some(a)).unwrap_err(), Exhausted::Source);
        let _t3 = b.enter(Some(c)).unwrap();
        let _t4 = b.enter(None).unwrap();
        assert_eq!(b.enter(Some(c)).unwrap_err(), Exhausted::Total);
        drop(t1);
        let _t5 = b.enter(Some(a)).unwrap();
    }

    #[test]
    fn a_full_budget_makes_room_for_a_lighter_source_at_the_heaviest_ones_expense() {
        // Four sources fill it at their share; a fifth still gets in: the oldest handshake of
        // a source holding the most ends.
        let b = HandshakeBudget::new(8, 2);
        let flood: Vec<_> = (1..=4u8)
            .flat_map(|i| {
                [
                    b.enter(Some([10, 0, 0, i].into())),
                    b.enter(Some([10, 0, 0, i].into())),
                ]
            })
            .map(Result::unwrap)
            .collect();
        let worker = b.enter(Some([10, 0, 0, 9].into())).unwrap();
        let evicted: Vec<_> = flood.iter().map(|t| t.evicted.is_cancelled()).collect();
        assert_eq!(
            evicted,
            [true, false, false, false, false, false, false, false],
            "the oldest place of a heaviest source was taken"
        );
        assert_eq!(b.in_progress(), (8, 5));
        // Sources now as heavy as any other take nobody's place.
        for source in [9, 1] {
            assert_eq!(
                b.enter(Some([10, 0, 0, source].into())).unwrap_err(),
                Exhausted::Total
            );
        }
        drop(flood);
        drop(worker);
        assert_eq!(b.in_progress(), (0, 0), "every place is given back once");
    }

    #[test]
    fn one_ipv6_host_is_one_source_whatever_addresses_of_its_64_it_uses() {
        let b = HandshakeBudget::new(256, 64);
        let mut held = Vec::new();
        let refused = loop {
            let i = u16::try_from(held.len()).unwrap();
            let ip = Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 0, 0, 0, i);
            match b.enter(Some(ip.into())) {
                Ok(t) => held.push(t),
                Err(e) => break e,
            }
            assert!(held.len() <= 256);
        };
        assert_eq!((held.len(), refused), (64, Exhausted::Source));
        // Another /64 is another source.
        let other = Ipv6Addr::new(0x2001, 0xdb8, 1, 3, 0, 0, 0, 1);
        assert!(b.enter(Some(other.into())).is_ok());
    }

    #[test]
    fn the_source_table_forgets_sources_with_nothing_in_progress() {
        let b = HandshakeBudget::new(8, 8);
        let tickets: Vec<_> = (0..8u8)
            .map(|i| b.enter(Some([10, 0, 0, i].into())).unwrap())
            .collect();
        assert_eq!(b.in_progress(), (8, 8));
        drop(tickets);
        assert_eq!(b.in_progress(), (0, 0));
    }
}
