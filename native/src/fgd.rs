//! Fragmentation-aware placement of one-node whole-GPU runs (`placement._place_whole_fgd`,
//! `_score`, `growth_class`, `fragment_growth` and `Capacity.signature`), under
//! `policy.placement: fragmentation` on a cluster where it can matter (nodes that track host
//! CPU or memory, or shared nodes: `Mix::enabled`; a shared device's part: `shared`).
//!
//! Rules: among the eligible nodes with the run's GPUs free (and allowed by the reservation),
//! the node whose expected fragmentation grows least, compared in FGD's integer score classes
//! (`growth_class` of the growth rounded to 1e-9), then the CPU/GPU imbalance it is left with,
//! then its name; it gives its first free devices.
//!
//! Invariant: nodes in the same state (`Sig`) score alike, so a placement scores each state
//! once; the node's name (its index: numbered in name order) breaks every tie.

use std::collections::HashMap;

use crate::capacity::{Capacity, Placement};
use crate::fragmentation::{after_share, after_whole, Sig};
use crate::model::Model;
use crate::placement::{eligible, Filter};
use crate::pyfloat;
use crate::state::Run;

/// The node's state as fragmentation sees it (`Capacity.signature`): whole free devices count
/// 1.0 each, a shared device what is left of it (rounded to 1e-6), largest first.
pub fn signature(m: &Model, cap: &Capacity, node: usize) -> Sig {
    let one = 1.0f64.to_bits();
    let mut free = vec![one; cap.free[node].len()];
    if !cap.shared[node].is_empty() {
        let mut left: Vec<f64> = cap.shared[node]
            .iter()
            .map(|&(_, f, _)| pyfloat::round_to(1.0 - f, 6))
            .filter(|&x| x > 1e-9)
            .collect();
        left.sort_by(|a, b| b.total_cmp(a));
        free.extend(left.into_iter().map(f64::to_bits)); // (each below the whole ones)
    }
    Sig {
        free,
        cpu: cap.cpu_free[node],
        mem: cap.mem_free[node],
        ty: m.nodes[node].ty,
    }
}

/// The class of a growth of expected fragmentation, lower better: minus the Kubernetes node
/// score FGD gives it, `int(100 * sigmoid(-growth))` (`placement.growth_class`).
pub fn growth_class(growth: f64) -> i64 {
    -((100.0 / (1.0 + growth.exp())) as i64)
}

/// (class of the growth of expected fragmentation, CPU/GPU imbalance left), lower better
/// (`placement._score`).
pub fn score(cap: &Capacity, sig: &Sig, after: &Sig) -> (i64, f64) {
    let growth = cap.mix.node_fragment(after) - cap.mix.node_fragment(sig);
    (
        growth_class(pyfloat::round_to(growth, 9)),
        cap.mix.imbalance(after),
    )
}

/// The one-node whole-GPU placement that fragments least (`placement._place_whole_fgd`).
pub fn place_whole_fgd(
    m: &Model,
    cap: &Capacity,
    r: &Run,
    t: usize,
    flt: Filter<'_>,
) -> Option<Placement> {
    let mut scored: HashMap<Sig, (i64, f64)> = HashMap::new();
    let mut best: Option<(i64, f64, usize)> = None;
    for n in eligible(m, cap, r, t) {
        let free = cap.free[n].len();
        if free < r.gpus {
            continue;
        }
        if flt.is_some_and(|(res, ends)| !res.allows(n, free - r.gpus, ends)) {
            continue;
        }
        let sig = signature(m, cap, n);
        let s = match scored.get(&sig) {
            Some(&s) => s,
            None => {
                let after = after_whole(&sig, r.gpus, r.cpu_milli, r.host_memory_mb);
                let s = score(cap, &sig, &after);
                scored.insert(sig, s);
                s
            }
        };
        let key = (s.0, s.1, n);
        if best.is_none_or(|b| key_lt(key, b)) {
            best = Some(key);
        }
    }
    let (_, _, n) = best?;
    Some(Placement {
        ty: t,
        backend: m.nodes[n].backend,
        gpus: r.gpus,
        host: r.host(),
        slots: vec![(n, cap.free[n][..r.gpus].to_vec())],
        shares: Vec::new(),
        accepts: r.accepts,
        charged: None,
    })
}

/// Python's `<` on (int, float, name) tuples (no NaN here).
fn key_lt(a: (i64, f64, usize), b: (i64, f64, usize)) -> bool {
    a.0.cmp(&b.0)
        .then(a.1.total_cmp(&b.1))
        .then(a.2.cmp(&b.2))
        .is_lt()
}

/// How good `p` (not yet taken) is for fragmentation, lower better: (class of the growth of
/// its nodes' expected fragmentation, CPU/GPU imbalance left, its first node)
/// (`placement.fragment_growth`; whole-GPU slots and parts of shared devices).
pub fn fragment_growth(m: &Model, cap: &Capacity, p: &Placement) -> (i64, f64, usize) {
    let (mut total, mut imbalance) = (0.0, 0.0);
    for (k, (node, devs)) in p.slots.iter().enumerate() {
        let sig = signature(m, cap, *node);
        let share = p.share(k);
        let after = if share.whole() {
            after_whole(&sig, devs.len(), p.host.0, p.host.1)
        } else {
            // (the device's free share before, as the signature rounds it)
            let used = cap.shared[*node]
                .iter()
                .find(|x| x.0 == devs[0])
                .map_or(0.0, |x| x.1);
            let had = pyfloat::round_to(1.0 - used, 6);
            after_share(&sig, had, share.fraction, p.host.0, p.host.1)
        };
        let growth = cap.mix.node_fragment(&after) - cap.mix.node_fragment(&sig);
        total += growth;
        imbalance += cap.mix.imbalance(&after);
    }
    (
        growth_class(pyfloat::round_to(total, 9)),
        imbalance,
        p.slots[0].0,
    )
}
