//! Settling a `mux` fuzz run: both sides write, read and run their timers until nothing is
//! pending, the frontend application reads everything, and then no stream may be stuck.

use super::world::World;

/// Rounds after which a run that has not settled is a bug (a livelock, or a lane that keeps
/// finding work): a settled pair needs a handful.
const SETTLE_ROUNDS: usize = 1_000;

impl World {
    /// Runs until idle and checks that nothing is stuck.
    ///
    /// # Panics
    ///
    /// When the run does not settle, or a stream is stuck.
    pub(crate) fn settle(&mut self) {
        for _ in 0..SETTLE_ROUNDS {
            let mut moved = self.pump();
            moved |= self.read_everything();
            self.absorb();
            if moved {
                continue;
            }
            let in_flight = self.wire.iter().flatten().any(|w| !w.is_empty());
            if self.worker.is_flushed() && self.frontend.is_flushed() && !in_flight {
                self.check_not_stuck();
                return;
            }
            // Something waits for a deadline (a batch's delay, a grant's): jump to it.
            let next = [self.worker.poll_timeout(), self.frontend.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) if t > self.now => self.advance(t - self.now),
                _ => self.advance(std::time::Duration::from_millis(1)),
            }
            self.absorb();
        }
        panic!("the pair did not settle within {SETTLE_ROUNDS} rounds");
    }

    /// The frontend application reads every stream it holds. Returns whether it read anything.
    fn read_everything(&mut self) -> bool {
        let held: Vec<_> = self
            .model
            .streams
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.frontend.map(|k| (i, k)))
            .collect();
        let mut read = false;
        for (i, key) in held {
            read |= self.read_all_of(i, key);
        }
        read
    }

    /// With both sides idle and everything read: a stream live on both sides has delivered
    /// every item and has credit; a stream the worker ended, or let go of, has ended on the
    /// frontend.
    fn check_not_stuck(&self) {
        for (i, s) in self.model.streams.iter().enumerate() {
            if s.tainted {
                continue;
            }
            let Some(fkey) = s.frontend else { continue };
            let frontend_live = self
                .frontend
                .stream_state(fkey)
                .is_some_and(|st| st.is_live());
            let worker_live = s
                .worker
                .and_then(|k| self.worker.stream_state(k))
                .is_some_and(|st| st.is_live());
            if worker_live && frontend_live {
                assert_eq!(
                    s.delivered,
                    s.sent.len(),
                    "stream {i}: items stuck in flight at idle"
                );
                let credit = s.worker.and_then(|k| self.worker.send_credit(k));
                assert!(
                    credit.is_some_and(|c| c > 0),
                    "stream {i}: credit stuck at 0 with everything read"
                );
            }
            if worker_live && !frontend_live {
                panic!("stream {i}: ended on the frontend, still live on the worker at idle");
            }
            if !worker_live {
                assert_eq!(
                    s.frontend_ends, 1,
                    "stream {i}: ended on the worker, not on the frontend"
                );
            }
        }
    }
}
