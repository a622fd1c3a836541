//! Placement of whole-GPU runs that ask for a topology (`placement._place_whole` and `_gang`
//! with `topology_key`): the eligible nodes with the run's GPUs per node free (and allowed by
//! the reservation), best fit first (fewest free left, then name); per backend (by name) a
//! gang of `nodes` of them: among the label groups (nodes sharing the key's value) with enough
//! members, each group's first `nodes` members, the one leaving the fewest free GPUs (then the
//! label value); without such a group a required topology fails and a preferred one takes
//! the first `nodes` nodes; then the backend whose gang leaves the fewest free devices (then
//! the node names) wins.
//!
//! Invariant: label values are numbered in the sorted order of their names per key
//! (`Node::labels`), so comparing numbers compares values; a key no node has is a number no
//! node's `labels` reaches.

use crate::backfill::host_could_fit;
use crate::capacity::{Capacity, Placement};
use crate::model::Model;
use crate::placement::{group_serves, Filter};
use crate::state::Run;

/// `place` for a run with a topology key (`r.topology`).
pub fn place_topology(
    m: &Model,
    cap: &Capacity,
    r: &Run,
    t: usize,
    flt: Filter<'_>,
) -> Option<Placement> {
    let (key, required) = (r.topology.expect("a topology run"), r.topology_required);
    // (left, node): best fit first; node index order is name order. The eligible nodes
    // with its GPUs per node free are those of the free-count buckets from its GPUs up, of
    // the groups that serve it, whose host resources are free (`placement::eligible`): a
    // walk over the nodes that could take it, not over every node of the type.
    let mut cands: Vec<(usize, usize)> = Vec::new();
    for g in (0..m.groups.len()).filter(|&g| group_serves(m, g, t, r)) {
        for (free, bucket) in cap.buckets[g].iter().enumerate().skip(r.gpus) {
            let left = free - r.gpus;
            for n in bucket.iter() {
                if !cap.host_fits(n, r.host())
                    || flt.is_some_and(|(res, ends)| !res.allows(n, left, ends))
                {
                    continue;
                }
                cands.push((left, n));
            }
        }
    }
    cands.sort_unstable();
    let mut backends: Vec<usize> = cands.iter().map(|&(_, n)| m.nodes[n].backend).collect();
    backends.sort_unstable();
    backends.dedup();
    // (free GPUs of the gang's nodes, its nodes)
    let mut choice: Option<(usize, Vec<usize>)> = None;
    for b in backends {
        let of_b: Vec<(usize, usize)> = cands
            .iter()
            .copied()
            .filter(|&(_, n)| m.nodes[n].backend == b)
            .collect();
        let Some(group) = gang(m, &of_b, r.nodes, key, required) else {
            continue;
        };
        let cost = (group.iter().map(|&n| cap.free[n].len()).sum(), group);
        if choice
            .as_ref()
            .is_none_or(|c| (cost.0, &cost.1) < (c.0, &c.1))
        {
            choice = Some(cost);
        }
    }
    let (_, chosen) = choice?;
    Some(Placement {
        ty: t,
        backend: m.nodes[chosen[0]].backend,
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

/// `nodes` nodes out of best-fit-ordered candidates of one backend, honouring the topology
/// (`placement._gang`).
fn gang(
    m: &Model,
    cands: &[(usize, usize)],
    nodes: usize,
    key: usize,
    required: bool,
) -> Option<Vec<usize>> {
    if cands.len() < nodes {
        return None;
    }
    let first = || cands[..nodes].iter().map(|&(_, n)| n).collect();
    if nodes == 1 && !required {
        return Some(first());
    }
    // label value -> its candidates, in best-fit order
    let mut groups: std::collections::BTreeMap<u32, Vec<(usize, usize)>> = Default::default();
    for &(left, n) in cands {
        if let Some(Some(v)) = m.nodes[n].labels.get(key) {
            groups.entry(*v).or_default().push((left, n));
        }
    }
    let mut best: Option<(usize, Vec<usize>)> = None;
    for g in groups.values() {
        if g.len() < nodes {
            continue;
        }
        let left: usize = g[..nodes].iter().map(|&(l, _)| l).sum();
        if best.as_ref().is_none_or(|b| left < b.0) {
            best = Some((left, g[..nodes].iter().map(|&(_, n)| n).collect()));
        }
    }
    match best {
        Some((_, g)) => Some(g),
        None if required => None,
        None => Some(first()),
    }
}

/// Whether an empty cluster could host the run on `t` with its required topology: `nodes`
/// nodes of one backend sharing the key's value, large enough (`State.ever_fits` through
/// `placement.empty_cluster`).
pub fn ever_fits_required(m: &Model, r: &Run, t: usize, key: usize) -> bool {
    let mut count: std::collections::HashMap<(usize, u32), usize> = Default::default();
    for &n in &m.of_type[t] {
        let node = &m.nodes[n];
        if node.ndev < r.gpus
            || r.pinned.is_some_and(|p| p != node.backend)
            || (r.nodes > 1 && !m.multi_node[node.backend])
        {
            continue;
        }
        if !host_could_fit(node, r) {
            continue;
        }
        let Some(Some(v)) = node.labels.get(key) else {
            continue;
        };
        let c = count.entry((node.backend, *v)).or_insert(0);
        *c += 1;
        if *c >= r.nodes {
            return true;
        }
    }
    false
}
