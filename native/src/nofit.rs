//! What placement found no room for, remembered until something is given back where it
//! could fit (`NoFit`, kept by `Capacity`): a queue head of a MIG, shared or topology request
//! is tried every cycle (`surely_blocked` cannot answer for it), and each trial walks every
//! node of its type; a request that found nothing is not walked again until it might fit.
//!
//! Invariants (what makes the memo exact):
//! - whether `placement::place_scan` finds a place for a request with no reservation filter
//!   depends only on the request's `Key` and the free state of its type's nodes (the model is
//!   fixed for the engine's life), and between two gives-back that free state only shrinks
//!   (`Capacity::take` removes free devices, slices, fractions and host resources): a request
//!   that did not fit does not fit until something is given back;
//! - a reservation filter only removes candidates, so a request that did not fit without one
//!   does not fit with one either;
//! - every give-back on a node (`Capacity::release`) stamps its type's `ANY` counter, and the
//!   `MIG` / `SHARED` counter where the node has MIG slices / is shared, with a new value of
//!   one ever-growing counter (a stamp is never reused, so an old memo never matches a later
//!   state); a MIG request can only fit on a MIG node and a shared one on a shared node
//!   (`placement::serves_shape`), any other on any node of its type;
//! - a memo holds the stamp its request's counter had when it did not fit: it still holds
//!   while the counter is unchanged.

use std::sync::Mutex;

use rustc_hash::FxHashMap as HashMap;

use crate::model::Model;
use crate::parts::{self, Shape};
use crate::state::Run;

/// The counters per type: any node, MIG nodes, shared nodes.
const ANY: usize = 0;
const MIG: usize = 1;
const SHARED: usize = 2;
const KINDS: usize = 3;

/// What placement reads of a run, with its type: (type, shape key, GPUs, nodes, pinned
/// backend, host CPU, host memory, topology key, whether required).
pub type Key = (
    usize,
    (u8, usize, u64, Option<i64>),
    usize,
    usize,
    Option<usize>,
    i64,
    i64,
    Option<usize>,
    bool,
);

pub fn key(r: &Run, t: usize) -> Key {
    (
        t,
        r.shape.key(),
        r.gpus,
        r.nodes,
        r.pinned,
        r.cpu_milli,
        r.host_memory_mb,
        r.topology,
        r.topology_required,
    )
}

#[derive(Default)]
pub struct NoFit {
    /// Per (type, kind): the stamp of the last give-back there (0: none yet).
    given: Vec<u64>,
    /// The last stamp handed out.
    last: u64,
    /// Request -> the stamp of its counter when it found no place without a filter (behind
    /// a lock, never contended, only because the engine must be `Sync`: placement reads
    /// `Capacity` shared).
    memo: Mutex<HashMap<Key, u64>>,
}

impl Clone for NoFit {
    fn clone(&self) -> Self {
        NoFit {
            given: self.given.clone(),
            last: self.last,
            memo: Mutex::new(self.memo().clone()),
        }
    }
}

impl NoFit {
    pub fn new(m: &Model) -> NoFit {
        NoFit {
            given: vec![0; m.n_types * KINDS],
            ..NoFit::default()
        }
    }

    /// Something was given back on node `n`: requests that could use it may fit again.
    pub fn given_back(&mut self, m: &Model, n: usize) {
        self.last += 1;
        let Some(node) = m.nodes.get(n) else {
            self.given.iter_mut().for_each(|g| *g = self.last); // (never: slots are nodes)
            return;
        };
        let p = parts::of(m, n);
        let base = node.ty * KINDS;
        self.given[base + ANY] = self.last;
        if !p.mig.is_empty() {
            self.given[base + MIG] = self.last;
        }
        if p.shared {
            self.given[base + SHARED] = self.last;
        }
    }

    /// The stamp of the counter that run `r`'s placement on `t` depends on.
    fn stamp(&self, r: &Run, t: usize) -> u64 {
        let kind = match r.shape {
            Shape::Mig { .. } => MIG,
            Shape::Shared { .. } => SHARED,
            Shape::Whole | Shape::Cpu => ANY,
        };
        self.given[t * KINDS + kind]
    }

    /// Whether the request is known to find no place now (with any filter or none).
    pub fn known(&self, k: &Key, r: &Run) -> bool {
        self.memo().get(k) == Some(&self.stamp(r, k.0))
    }

    /// The request found no place without a filter.
    pub fn remember(&self, k: Key, r: &Run) {
        let s = self.stamp(r, k.0);
        self.memo().insert(k, s);
    }

    fn memo(&self) -> std::sync::MutexGuard<'_, HashMap<Key, u64>> {
        // (a panic while it was held left a whole map: still exact)
        self.memo.lock().unwrap_or_else(|e| e.into_inner())
    }
}
