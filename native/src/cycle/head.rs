//! A queue range's head in its project's turn (`Cycle::turn`), ordered without floats.

use crate::state::Key;

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
        // (f64 order, as `key_cmp` compares them, as u64 order: -0.0 is 0.0 there; a negative
        // number's bits, flipped, rise as it does)
        let bits = if key.1 == 0.0 { 0 } else { key.1.to_bits() };
        let float = if bits >> 63 == 1 {
            !bits
        } else {
            bits | (1 << 63)
        };
        Head {
            order: (signed(key.0), float, signed(key.2), range),
            run,
        }
    }

    pub(super) fn range(&self) -> usize {
        self.order.3
    }
}
