//! Placement of MIG requests (`mlops_gpu.core.placement._place_mig`): `gpus` free slices of
//! the profile on one eligible node (a backend that places MIG, the profile offered), the node
//! left with the fewest free slices of it first, then by name; a reservation's filter judges
//! a node by its free whole devices (MIG requests take none). The slices are the node's first
//! free ones of the profile, each charged the profile's share.

use crate::capacity::{Capacity, Placement};
use crate::model::Model;
use crate::parts::{self, SlotShare};
use crate::placement::{eligible_among, Filter};
use crate::state::Run;

pub fn place_mig(
    m: &Model,
    cap: &Capacity,
    r: &Run,
    t: usize,
    flt: Filter<'_>,
    (profile, share): (usize, f64),
    among: Option<&[usize]>,
) -> Option<Placement> {
    // (slices left, node, the node's index of the profile); node index order is name order
    let mut best: Option<(usize, usize, usize)> = None;
    for n in eligible_among(m, cap, r, t, among) {
        let Some(k) = parts::of(m, n).local(profile) else {
            continue; // (never: `eligible` asks for the profile)
        };
        let free = cap.mig_free[n][k].len();
        if free < r.gpus {
            continue;
        }
        if flt.is_some_and(|(res, ends)| !res.allows(n, cap.free[n].len(), ends)) {
            continue;
        }
        let cand = (free - r.gpus, n, k);
        if best.is_none_or(|b| (cand.0, cand.1) < (b.0, b.1)) {
            best = Some(cand);
        }
    }
    let (_, n, k) = best?;
    Some(Placement {
        ty: t,
        backend: m.nodes[n].backend,
        slots: vec![(n, cap.mig_free[n][k][..r.gpus].to_vec())],
        gpus: r.gpus,
        host: r.host(),
        accepts: r.accepts,
        shares: vec![SlotShare {
            fraction: share,
            memory_mb: None,
        }],
        charged: None,
    })
}
