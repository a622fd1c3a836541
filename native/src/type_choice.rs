//! Which GPU type comes first for a run that accepts several, under fragmentation-aware
//! placement (`mlops_gpu.core.type_choice.order_types`).
//!
//! Rules (in order): a type with no placement for the run comes last; when GPU-holding runs
//! restricted to some of the candidate types are active, the type with the most headroom (its
//! free GPUs less the GPUs restricted runs hold on it), in steps of `HEADROOM_STEP` GPUs
//! (`round`, ties to even); then the least growth of expected fragmentation
//! (`fgd::fragment_growth`: its class, CPU balance, node); then the order the types came in.
//!
//! Invariant: the order depends only on the capacity state (free GPUs per type and the mix of
//! active runs' shapes), never on the order runs were admitted.

use std::cmp::Ordering;
use std::rc::Rc;

use crate::capacity::{Capacity, Placement, UNIT};
use crate::fgd::fragment_growth;
use crate::model::Model;
use crate::pyfloat;

/// GPUs of headroom that make a difference between types (one 8-GPU node).
pub const HEADROOM_STEP: f64 = 8.0;

/// GPUs of type `t` no active run holds (`Capacity.free_by_type`: the projects' holdings
/// summed in `UNIT`s, exactly, as `Capacity.type_used` is).
fn free_by_type(m: &Model, cap: &Capacity, t: usize) -> f64 {
    let units: i64 = (0..m.projects.len())
        .map(|p| cap.used_units[m.pt(p, t)])
        .sum();
    m.capacity_by_type[t] - units as f64 / UNIT
}

/// The positions of `types` best first, for a run whose placement on `types[k]` is
/// `placed[k]` (`holds_gpus` false: a CPU-only run).
pub fn order_types(
    m: &Model,
    cap: &Capacity,
    types: &[usize],
    placed: &[Option<Rc<Placement>>],
    holds_gpus: bool,
) -> Vec<usize> {
    let restricted = cap.mix.restricted();
    let use_headroom = holds_gpus && types.iter().any(|&t| restricted[t] > 0.0);
    // (no placement, headroom step, growth class, imbalance, node, position)
    let keys: Vec<(u8, i64, i64, f64, usize, usize)> = types
        .iter()
        .enumerate()
        .map(|(k, &t)| match &placed[k] {
            None => (1, 0, 0, 0.0, 0, k),
            Some(p) => {
                let mut step = 0;
                if use_headroom {
                    let headroom = free_by_type(m, cap, t) - restricted[t];
                    step = -(pyfloat::round0(headroom / HEADROOM_STEP) as i64);
                }
                let (class, imbalance, node) = fragment_growth(m, cap, p);
                (0, step, class, imbalance, node, k)
            }
        })
        .collect();
    let mut order: Vec<usize> = (0..types.len()).collect();
    order.sort_by(|&a, &b| cmp_keys(&keys[a], &keys[b]));
    order
}

fn cmp_keys(
    a: &(u8, i64, i64, f64, usize, usize),
    b: &(u8, i64, i64, f64, usize, usize),
) -> Ordering {
    a.0.cmp(&b.0)
        .then(a.1.cmp(&b.1))
        .then(a.2.cmp(&b.2))
        .then(a.3.total_cmp(&b.3))
        .then(a.4.cmp(&b.4))
        .then(a.5.cmp(&b.5))
}
