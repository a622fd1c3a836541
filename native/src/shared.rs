//! Placement of shared requests (`mlops_gpu.core.placement._place_shared`): on an eligible
//! shared node, a device free or already shared with enough fraction (and memory, where
//! capped) left. Under best-fit (or fragmentation-aware placement on a cluster without anything
//! to weigh: `Mix::enabled` false), the device left with the least fraction after it first;
//! under fragmentation-aware placement, the device whose node's expected fragmentation grows
//! least (`fgd::score` of `after_share`: growth class, then CPU/GPU imbalance); then the
//! node's name, then the device's name. A memory-only request is charged its memory's share
//! of the node's device (a node that does not say its device memory cannot host it). A
//! reservation's filter judges a node by its free whole devices before the run.
//!
//! Invariant: the keys compare as Python's tuples do (no NaN: floats by `<` and `==`), so the
//! same device wins as in the Python core.

use std::cmp::Ordering;

use crate::capacity::{Capacity, Placement};
use crate::fgd::{score, signature};
use crate::fragmentation::after_share;
use crate::model::Model;
use crate::parts::{self, Shape, SlotShare};
use crate::placement::{eligible_among, Filter};
use crate::pyfloat;
use crate::state::Run;

/// (growth class, imbalance, fraction left, node, device's name rank): Python's `<` on the
/// tuple `_place_shared` compares (node and device by name: their index and rank).
type Key = (i64, f64, f64, usize, u32);

fn key_lt(a: &Key, b: &Key) -> bool {
    let f = |x: f64, y: f64| x.partial_cmp(&y).expect("no NaN");
    a.0.cmp(&b.0)
        .then(f(a.1, b.1))
        .then(f(a.2, b.2))
        .then(a.3.cmp(&b.3))
        .then(a.4.cmp(&b.4))
        == Ordering::Less
}

const EPS: f64 = 1e-9;

pub fn place_shared(
    m: &Model,
    cap: &Capacity,
    r: &Run,
    t: usize,
    flt: Filter<'_>,
    among: Option<&[usize]>,
) -> Option<Placement> {
    let Shape::Shared {
        fraction,
        memory_mb,
    } = r.shape
    else {
        return None;
    };
    let fgd = cap.mix.enabled;
    // (its key, device, fraction charged)
    let mut best: Option<(Key, u16, f64)> = None;
    for n in eligible_among(m, cap, r, t, among) {
        if flt.is_some_and(|(res, ends)| !res.allows(n, cap.free[n].len(), ends)) {
            continue;
        }
        let parts = parts::of(m, n);
        let frac = match (fraction, memory_mb, parts.gpu_memory_mb) {
            (Some(f), _, _) => f,
            (None, Some(mem), Some(g)) if g != 0 => (mem as f64 / g as f64).min(1.0),
            _ => continue, // a memory cap needs a node that says its device memory
        };
        let held = &cap.shared[n];
        for dev in 0..m.nodes[n].ndev as u16 {
            let (used_f, used_m) = match held.iter().find(|x| x.0 == dev) {
                Some(&(_, f, mem)) => (f, mem),
                None if cap.free[n].binary_search(&dev).is_ok() => (0.0, 0),
                None => continue, // held whole by another run
            };
            if used_f + frac > 1.0 + EPS {
                continue;
            }
            if let Some(mem) = memory_mb {
                if parts.gpu_memory_mb.is_none_or(|g| used_m + mem > g) {
                    continue;
                }
            }
            let left = 1.0 - used_f - frac;
            let rank = parts
                .name_rank
                .get(dev as usize)
                .copied()
                .unwrap_or(dev as u32);
            let key = if fgd {
                let sig = signature(m, cap, n);
                let had = pyfloat::round_to(1.0 - used_f, 6);
                let after = after_share(&sig, had, frac, r.cpu_milli, r.host_memory_mb);
                let (class, imbalance) = score(cap, &sig, &after);
                (class, imbalance, 0.0, n, rank) // (no best fit under fragmentation scores)
            } else {
                (0, 0.0, left, n, rank)
            };
            if best.as_ref().is_none_or(|b| key_lt(&key, &b.0)) {
                best = Some((key, dev, frac));
            }
        }
    }
    let ((.., n, _), dev, frac) = best?;
    Some(Placement {
        ty: t,
        backend: m.nodes[n].backend,
        slots: vec![(n, vec![dev])],
        gpus: 1,
        host: r.host(),
        accepts: r.accepts,
        shares: vec![SlotShare {
            fraction: frac,
            memory_mb,
        }],
        charged: None,
    })
}
