//! A stream's item queue against a plain model (a deque of owned items): random pushes (copied
//! or held), reads (lent or handed over), appends of one queue to another and clears keep
//! every item, in order, once; and a queue emptied keeps at most its share of buffer.

use std::collections::VecDeque;

use bytes::Bytes;
use proptest::prelude::*;
use velo_mux::{ITEM_BUFFER_KEEP, ItemQueue};

#[derive(Debug, Clone)]
enum Op {
    /// Into queue `q`: an item of `len` bytes, copied or held as `Bytes`.
    Push {
        q: usize,
        len: usize,
        held: bool,
    },
    /// From queue `q`: the next item, lent or handed over.
    Pop {
        q: usize,
        lent: bool,
    },
    /// Every item of the other queue moves to the end of queue `q`.
    Append {
        q: usize,
    },
    Clear {
        q: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let q = 0usize..2;
    prop_oneof![
        6 => (q.clone(), prop_oneof![4 => 0usize..200, 1 => 200usize..6000], any::<bool>())
            .prop_map(|(q, len, held)| Op::Push { q, len, held }),
        6 => (q.clone(), any::<bool>()).prop_map(|(q, lent)| Op::Pop { q, lent }),
        1 => q.clone().prop_map(|q| Op::Append { q }),
        1 => q.prop_map(|q| Op::Clear { q }),
    ]
}

/// Item `n` of `len` bytes: its bytes say which it is.
fn item(n: u32, len: usize) -> Vec<u8> {
    n.to_le_bytes().iter().copied().cycle().take(len).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_item_comes_out_once_in_order_and_an_emptied_queue_keeps_little(
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        let mut queues = [ItemQueue::new(), ItemQueue::new()];
        let mut models: [VecDeque<Vec<u8>>; 2] = [VecDeque::new(), VecDeque::new()];
        let mut next = 0u32;
        for op in ops {
            match op {
                Op::Push { q, len, held } => {
                    let it = item(next, len);
                    next += 1;
                    if held {
                        queues[q].push_bytes(Bytes::from(it.clone()));
                    } else {
                        queues[q].push_copy(&it);
                    }
                    models[q].push_back(it);
                }
                Op::Pop { q, lent } => {
                    let want = models[q].pop_front();
                    if lent {
                        prop_assert_eq!(queues[q].pop(), want.as_deref());
                    } else {
                        let got = queues[q].pop_bytes();
                        prop_assert_eq!(got.as_deref(), want.as_deref());
                    }
                    if want.is_none() {
                        prop_assert!(queues[q].buffer_capacity() <= ITEM_BUFFER_KEEP);
                    }
                }
                Op::Append { q } => {
                    let [a, b] = &mut queues;
                    let (to, from) = if q == 0 { (a, b) } else { (b, a) };
                    to.append(from);
                    let moved: Vec<_> = models[1 - q].drain(..).collect();
                    models[q].extend(moved);
                    prop_assert!(queues[1 - q].is_empty());
                }
                Op::Clear { q } => {
                    queues[q].clear();
                    models[q].clear();
                    prop_assert!(queues[q].buffer_capacity() <= ITEM_BUFFER_KEEP);
                }
            }
            for (queue, model) in queues.iter().zip(&models) {
                prop_assert_eq!(queue.len(), model.len());
            }
        }
        for (queue, model) in queues.iter_mut().zip(&mut models) {
            while let Some(want) = model.pop_front() {
                prop_assert_eq!(queue.pop(), Some(&want[..]));
            }
            prop_assert_eq!(queue.pop(), None);
        }
    }
}
