//! Best-fit placement of whole-GPU runs over the free-count buckets (the reference scans the
//! nodes: `mlops_gpu.core.placement._place_whole`): per backend, the first `nodes` nodes
//! that fit, fewest free devices first, then by name; the backend whose choice leaves the
//! fewest free devices (then the names) wins; each node gives its first free devices. A run
//! with a topology key is placed by `topology`; a one-node run under fragmentation-aware
//! placement by `fgd`. A CPU-only run goes to one node with its host resources free
//! (`place_cpu`).

use crate::backfill::Reservation;
use crate::capacity::{Capacity, Placement};
use crate::fgd::{place_whole_fgd, score, signature};
use crate::fragmentation::after_host;
use crate::model::Model;
use crate::nofit;
use crate::parts::{self, Shape};
use crate::pyfloat;
use crate::state::Run;
use crate::topology::place_topology;

/// A reservation a placement must respect, with the run's expected end (None: unknown).
pub type Filter<'a> = Option<(&'a Reservation, Option<f64>)>;

/// Whether group `g` (a (type, backend) pair) may host the run on type `t`.
pub fn group_serves(m: &Model, g: usize, t: usize, r: &Run) -> bool {
    let (ty, backend) = m.groups[g];
    ty == t && r.pinned.is_none_or(|p| p == backend) && (r.nodes <= 1 || m.multi_node[backend])
}

/// `place_scan`, where `cap.nofit` does not already know that the run finds no place (a
/// request that found none without a filter is remembered: see `nofit`).
pub fn place(m: &Model, cap: &Capacity, r: &Run, t: usize, flt: Filter<'_>) -> Option<Placement> {
    let key = nofit::key(r, t);
    if cap.nofit.known(&key, r) {
        return None;
    }
    let placed = place_scan(m, cap, r, t, flt);
    if placed.is_none() && flt.is_none() {
        cap.nofit.remember(key, r);
    }
    placed
}

/// Where the run fits on `t` now, walking the nodes (the specification `place` remembers).
pub fn place_scan(
    m: &Model,
    cap: &Capacity,
    r: &Run,
    t: usize,
    flt: Filter<'_>,
) -> Option<Placement> {
    match r.shape {
        Shape::Mig { profile, share } => {
            return crate::mig::place_mig(m, cap, r, t, flt, (profile, share), None)
        }
        Shape::Shared { .. } => return crate::shared::place_shared(m, cap, r, t, flt, None),
        Shape::Cpu => return place_cpu(m, cap, r, t, flt, None),
        Shape::Whole => {}
    }
    if r.topology.is_some() {
        return place_topology(m, cap, r, t, flt);
    }
    if cap.mix.enabled && r.nodes == 1 {
        return place_whole_fgd(m, cap, r, t, flt);
    }
    let mut best: Option<(usize, Vec<usize>, usize)> = None;
    for g in 0..m.groups.len() {
        if !group_serves(m, g, t, r) {
            continue;
        }
        let buckets = &cap.buckets[g];
        let mut chosen: Vec<usize> = Vec::with_capacity(r.nodes);
        let mut total = 0;
        'scan: for (k, bucket) in buckets.iter().enumerate().skip(r.gpus) {
            for n in bucket.iter() {
                if let Some((res, ends)) = flt {
                    if !res.allows(n, k - r.gpus, ends) {
                        continue;
                    }
                }
                if !cap.host_fits(n, r.host()) {
                    continue;
                }
                chosen.push(n);
                total += k;
                if chosen.len() == r.nodes {
                    break 'scan;
                }
            }
        }
        if chosen.len() < r.nodes {
            continue;
        }
        let better = match &best {
            None => true,
            Some((bt, bc, _)) => (total, &chosen) < (*bt, bc),
        };
        if better {
            best = Some((total, chosen, m.groups[g].1));
        }
    }
    let (_, chosen, backend) = best?;
    Some(Placement {
        ty: t,
        backend,
        gpus: r.gpus * r.nodes,
        host: r.host(),
        shares: Vec::new(),
        accepts: r.accepts,
        slots: chosen
            .into_iter()
            .map(|n| (n, cap.free[n][..r.gpus].to_vec()))
            .collect(),
        charged: None,
    })
}

/// Whether a node set could take the run on `t` now (`anchor.node_sets`).
pub fn node_sets(m: &Model, cap: &Capacity, r: &Run, t: usize) -> bool {
    (0..m.groups.len())
        .any(|g| group_serves(m, g, t, r) && cap.count_at_least(g, r.gpus) >= r.nodes)
}

/// Schedulable nodes of `t` the run may use, with its host resources free now, in the
/// snapshot's node order (`placement.eligible_nodes`).
pub fn eligible<'a>(
    m: &'a Model,
    cap: &'a Capacity,
    r: &'a Run,
    t: usize,
) -> impl Iterator<Item = usize> + 'a {
    eligible_among(m, cap, r, t, None)
}

/// `eligible`, of `among` only where given (sorted). A MIG or shared request walks only the
/// nodes of `t` with slices or sharing (`Capacity::parted`): no other serves its shape.
pub fn eligible_among<'a>(
    m: &'a Model,
    cap: &'a Capacity,
    r: &'a Run,
    t: usize,
    among: Option<&'a [usize]>,
) -> impl Iterator<Item = usize> + 'a {
    let nodes: &[usize] = match (among, r.shape) {
        (Some(nodes), _) => nodes,
        (None, Shape::Mig { .. } | Shape::Shared { .. }) => &cap.parted[t],
        (None, _) => &m.of_type[t],
    };
    nodes
        .iter()
        .copied()
        .filter(move |&n| m.nodes[n].ty == t && eligible_node(m, cap, r, n))
}

/// Where a one-node run that is not whole GPUs fits on `t` now among `nodes` alone (sorted):
/// `place_scan` where every other node of `t` is known to take it nowhere, as after a place
/// that found none and give-backs on `nodes` only.
pub fn place_among(
    m: &Model,
    cap: &Capacity,
    r: &Run,
    t: usize,
    flt: Filter<'_>,
    nodes: &[usize],
) -> Option<Placement> {
    let among = Some(nodes);
    match r.shape {
        Shape::Mig { profile, share } => {
            crate::mig::place_mig(m, cap, r, t, flt, (profile, share), among)
        }
        Shape::Shared { .. } => crate::shared::place_shared(m, cap, r, t, flt, among),
        Shape::Cpu => place_cpu(m, cap, r, t, flt, among),
        Shape::Whole => place_scan(m, cap, r, t, flt),
    }
}

/// Whether node `n` (of the run's type) is one `eligible` yields.
pub fn eligible_node(m: &Model, cap: &Capacity, r: &Run, n: usize) -> bool {
    let node = &m.nodes[n];
    node.schedulable
        && r.pinned.is_none_or(|p| p == node.backend)
        && (r.nodes <= 1 || m.multi_node[node.backend])
        && serves_shape(m, n, r)
        && cap.host_fits(n, r.host())
}

/// Whether node `n` can host the run's shape (`eligible_nodes`): MIG requests need a backend
/// that places them and the profile on the node, shared ones a shared node.
fn serves_shape(m: &Model, n: usize, r: &Run) -> bool {
    match r.shape {
        Shape::Whole | Shape::Cpu => true,
        Shape::Mig { profile, .. } => {
            let p = parts::of(m, n);
            p.mig_placeable && p.local(profile).is_some()
        }
        Shape::Shared { .. } => parts::of(m, n).shared,
    }
}

/// A CPU-only run (`placement._place_cpu`): one eligible node (allowed by the reservation with
/// its free devices untouched); under fragmentation-aware placement the least class of growth
/// of expected fragmentation, then CPU balance; then the node left with the most CPU per free
/// GPU share (it strands the fewest GPUs; untracked CPU or no free GPU: infinitely much);
/// then the name. It holds no device.
pub fn place_cpu(
    m: &Model,
    cap: &Capacity,
    r: &Run,
    t: usize,
    flt: Filter<'_>,
    among: Option<&[usize]>,
) -> Option<Placement> {
    let fgd = cap.mix.enabled;
    // (growth class, imbalance, minus CPU per free GPU, node): Python's tuple order, where
    // -0.0 and 0.0 are equal (so `partial_cmp`, never `total_cmp`, on the floats)
    let mut best: Option<(i64, f64, f64, usize)> = None;
    for n in eligible_among(m, cap, r, t, among) {
        let free = cap.free[n].len();
        if flt.is_some_and(|(res, ends)| !res.allows(n, free, ends)) {
            continue;
        }
        let sig = signature(m, cap, n);
        let (class, imbalance) = if fgd {
            score(cap, &sig, &after_host(&sig, r.cpu_milli, r.host_memory_mb))
        } else {
            (0, 0.0)
        };
        let share = pyfloat::sum(sig.shares(), cap.mix.compensated);
        let left = cap.cpu_free[n].map_or(f64::INFINITY, |c| (c - r.cpu_milli) as f64);
        let per_gpu = if share <= 1e-9 {
            f64::INFINITY
        } else {
            left / share
        };
        let key = (class, imbalance, -per_gpu, n);
        if best.is_none_or(|b| cpu_key_lt(key, b)) {
            best = Some(key);
        }
    }
    let (_, _, _, n) = best?;
    Some(Placement {
        ty: t,
        backend: m.nodes[n].backend,
        gpus: 0,
        host: r.host(),
        slots: vec![(n, Vec::new())],
        shares: Vec::new(),
        accepts: r.accepts,
        charged: None,
    })
}

/// Python's `<` on (int, float, float, name) tuples (no NaN: a node's CPU left over its free
/// share is never 0/0 or inf/inf).
fn cpu_key_lt(a: (i64, f64, f64, usize), b: (i64, f64, f64, usize)) -> bool {
    let eq = |x: f64, y: f64| x.partial_cmp(&y).expect("no NaN");
    a.0.cmp(&b.0)
        .then(eq(a.1, b.1))
        .then(eq(a.2, b.2))
        .then(a.3.cmp(&b.3))
        .is_lt()
}
