//! The budget of unauthenticated connections: handshakes in progress, per source address and
//! in total, kept apart from the lanes of workers that completed theirs. A flood of silent or
//! slow handshakes is refused at this budget and never takes a lane's place. Public so that
//! a plane with its own listener (response-plane's classic plane) keeps the same budget.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

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
    /// At most `max_total` entries: an entry exists only while it counts a handshake.
    by_source: HashMap<IpAddr, usize>,
}

/// Which share of the budget was exhausted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exhausted {
    /// This source has `max_per_source` handshakes in progress.
    Source,
    /// The listener has `max_total` handshakes in progress.
    Total,
}

/// One handshake's place in the budget, given back when dropped.
#[derive(Debug)]
pub struct HandshakeTicket {
    budget: Arc<HandshakeBudget>,
    source: Option<IpAddr>,
}

impl HandshakeBudget {
    /// A budget of at most `max_total` handshakes in progress, at most `max_per_source` of
    /// them from one source address.
    pub fn new(max_total: usize, max_per_source: usize) -> Arc<Self> {
        Arc::new(Self {
            max_total,
            max_per_source,
            state: Mutex::new(State::default()),
        })
    }

    /// A place for a handshake from `source` (`None`: a transport that cannot tell; only the
    /// total applies).
    ///
    /// # Errors
    ///
    /// Which share is exhausted; the connection should be refused.
    pub fn enter(self: &Arc<Self>, source: Option<IpAddr>) -> Result<HandshakeTicket, Exhausted> {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if st.total >= self.max_total {
            return Err(Exhausted::Total);
        }
        if let Some(ip) = source {
            let n = st.by_source.entry(ip).or_insert(0);
            if *n >= self.max_per_source {
                return Err(Exhausted::Source);
            }
            *n += 1;
        }
        st.total += 1;
        Ok(HandshakeTicket {
            budget: self.clone(),
            source,
        })
    }

    /// Handshakes in progress.
    #[cfg(test)]
    fn in_progress(&self) -> (usize, usize) {
        let st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        (st.total, st.by_source.len())
    }
}

impl Drop for HandshakeTicket {
    fn drop(&mut self) {
        let mut st = self
            .budget
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        st.total = st.total.saturating_sub(1);
        if let Some(ip) = self.source
            && let Some(n) = st.by_source.get_mut(&ip)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                st.by_source.remove(&ip);
            }
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
