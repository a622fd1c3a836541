//! A queue range's head in its project's turn (`Cycle::turn`), ordered without floats.

use crate::state::{float_order, Key};

/// A queue range's head in its project's turn: the lowest (key, range) is served first, as a
/// scan over the ranges in order would pick it (ties: the first range). `order` is that
/// (key, range) as integers that compare alike (`order_of`), so that sorting a turn's heads
/// compares no floats.
#[derive(Clone, Copy)]
pub(super) struct Head {
    pub(super) order: (u64, u64, u64, usize),
    pub(super) run: usize,
}

impl Head {
    pub(super) fn new(key: Key, range: usize, run: usize) -> Self {
        // (i64 order as u64 order)
        let signed = |x: i64| (x as u64) ^ (1 << 63);
        Head {
            order: (signed(key.0), float_order(key.1), signed(key.2), range),
            run,
        }
    }

    pub(super) fn range(&self) -> usize {
        self.order.3
    }
}
