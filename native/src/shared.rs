//! Placement of shared requests under best-fit placement (`mlops_gpu.core.placement.
//! _place_shared` without fragmentation scores): on an eligible shared node, a device free or
//! already shared with enough fraction (and memory, where capped) left; the device left with
//! the least fraction after it first, then the node's name, then the device's name. A
//! memory-only request is charged its memory's share of the node's device (a node that does
//! not say its device memory cannot host it). A reservation's filter judges a node by its
//! free whole devices before the run.

use crate::capacity::{Capacity, Placement};
use crate::model::Model;
use crate::parts::{self, Shape, SlotShare};
use crate::placement::{eligible, Filter};
use crate::state::Run;

const EPS: f64 = 1e-9;

pub fn place_shared(
    m: &Model,
    cap: &Capacity,
    r: &Run,
    t: usize,
    flt: Filter<'_>,
) -> Option<Placement> {
    let Shape::Shared {
        fraction,
        memory_mb,
    } = r.shape
    else {
        return None;
    };
    // (fraction left, node, device's name rank, device, fraction charged)
    let mut best: Option<(f64, usize, u32, u16, f64)> = None;
    for n in eligible(m, cap, r, t) {
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
            let better = best.is_none_or(|b| left < b.0 || (left == b.0 && (n, rank) < (b.1, b.2)));
            if better {
                best = Some((left, n, rank, dev, frac));
            }
        }
    }
    let (_, n, _, dev, frac) = best?;
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
    })
}
