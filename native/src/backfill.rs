//! EASY backfill (`mlops_gpu.core.backfill` and `mlops_gpu.core.anchor`). The anchor: among the
//! queued runs that fit an empty cluster and whose quota could ever admit them, those blocked
//! as the cycle begins (quota and a node set take them on no type now) and the anchor the last
//! cycle kept (`State.anchor`, even when it fits now), the one of the highest class that has
//! waited longest (submit time, seq, id). Its reservation: on the node set needing the fewest
//! GPUs from runs of unknown end, then the earliest; and the quota it counts on, until its own
//! project's runs have made room; its time is the later of the two (infinite: unknown). A later
//! run may use a reserved node, or the anchor's project's quota of its type, only if it ends
//! before then, or if what the anchor needs is still there then (known ends only). A cycle
//! with no anchor, or that admitted it, keeps the oldest run it overtook (`overtaken`).

use std::collections::HashMap;

use crate::model::{Model, Node};
use crate::parts::{self, Shape};
use crate::placement::eligible;
use crate::quota::within_nominal;
use crate::state::{Run, State};
use crate::topology::ever_fits_required;

mod anchor;

pub use anchor::{anchor, overtaken};

const EPS: f64 = 1e-9;

pub struct Reservation {
    pub run: usize,
    /// Infinite: unknown (it waits for a run without max_runtime).
    pub at: f64,
    pub need: usize,
    pub nodes: HashMap<usize, Vec<(f64, u32)>>,
    /// The quota hold: (project, type, amount, the quota it counts on, the project's GPUs of
    /// that type released by known ends by `at`).
    pub quota: Option<(usize, usize, f64, f64, f64)>,
    /// Whether the anchor must borrow on its type: then it holds nothing from a run of another
    /// project within that project's nominal quota (`Reservation.borrows`).
    pub borrows: bool,
    /// Node -> GPUs its own project's runs without max_runtime surely free there before `at`
    /// (`backfill.freed_by_quota`).
    pub freed: HashMap<usize, usize>,
    /// Reserved nodes that wait for runs without max_runtime; whether its quota does (what
    /// an explanation names when its time is unknown).
    pub unknown_nodes: Vec<usize>,
    pub quota_unknown: bool,
}

impl Reservation {
    /// Whether it holds nothing from run `r` on `t`: a borrowing anchor never holds back a
    /// run of another project within that project's nominal quota (`cycle_reserve.backfill_filter`).
    pub fn exempts(&self, m: &Model, st: &State, r: &Run, t: usize) -> bool {
        self.borrows
            && st.runs[self.run].project != r.project
            && within_nominal(m, &st.cap.used, r.project, t, r.amount())
    }

    /// Whether a run ending at `ends_at` is shown to end before the reservation.
    pub fn before(&self, ends_at: Option<f64>) -> bool {
        self.at.is_finite() && ends_at.is_some_and(|e| e <= self.at)
    }

    /// May a run leaving `free_after` free on `node` start now without delaying the anchor?
    pub fn allows(&self, node: usize, free_after: usize, ends_at: Option<f64>) -> bool {
        let Some(line) = self.nodes.get(&node) else {
            return true;
        };
        if self.before(ends_at) {
            return true;
        }
        let released: u32 = line.iter().filter(|x| x.0 <= self.at).map(|x| x.1).sum();
        let freed = self.freed.get(&node).copied().unwrap_or(0);
        free_after + released as usize + freed >= self.need
    }

    /// May a run leaving `project` at `used_after` of `ty` start now without taking quota
    /// the anchor waits for (`Reservation.allows_quota`)?
    pub fn allows_quota(
        &self,
        project: usize,
        ty: usize,
        used_after: f64,
        ends_at: Option<f64>,
    ) -> bool {
        let Some((p, t, amount, limit, released)) = self.quota else {
            return true;
        };
        if p != project || t != ty || self.before(ends_at) {
            return true;
        }
        used_after - released + amount <= limit + EPS
    }
}

/// The quota a reservation holds on `t` (`backfill.quota_limit`), and whether quota could
/// ever admit the run there (`backfill.could_be_admitted`).
fn quota_terms(m: &Model, r: &Run, t: usize) -> (bool, Option<f64>) {
    let q = m.term(r.project, t);
    let amount = r.amount();
    if amount <= q.nominal + EPS {
        return (true, Some(q.nominal));
    }
    if !r.preemptible || m.projects[r.project].root.is_none() {
        return (false, None); // (only a preemptible run borrows)
    }
    match q.borrowing {
        None => (true, None),
        Some(b) if amount <= q.nominal + b + EPS => (true, Some(q.nominal + b)),
        Some(_) => (false, None),
    }
}

/// Whether an empty cluster could host the run on `t` (`State.ever_fits`): `nodes` nodes of
/// one backend serving it, with enough devices, schedulable now or not.
pub(crate) fn ever_fits(m: &Model, r: &Run, t: usize) -> bool {
    if r.shape != Shape::Whole {
        return parts_ever_fit(m, r, t);
    }
    if let (Some(key), true) = (r.topology, r.topology_required) {
        return ever_fits_required(m, r, t, key);
    }
    let mut count: HashMap<usize, usize> = HashMap::new();
    for &n in &m.of_type[t] {
        let node = &m.nodes[n];
        if node.ndev < r.gpus
            || r.pinned.is_some_and(|p| p != node.backend)
            || (r.nodes > 1 && !m.multi_node[node.backend])
            || !host_could_fit(node, r)
        {
            continue;
        }
        let c = count.entry(node.backend).or_insert(0);
        *c += 1;
        if *c >= r.nodes {
            return true;
        }
    }
    false
}

/// `ever_fits` for a MIG, shared or CPU-only request (one node): a node of the type serving
/// the shape (`placement::serves_shape`), with enough slices of the profile, or a device that
/// holds the fraction and the memory asked for, or the host resources alone, when empty (`place_mig`/`place_shared` on an empty
/// cluster, as `placement.empty_cluster` places).
fn parts_ever_fit(m: &Model, r: &Run, t: usize) -> bool {
    m.of_type[t].iter().any(|&n| {
        let node = &m.nodes[n];
        let p = parts::of(m, n);
        if r.pinned.is_some_and(|b| b != node.backend) || !host_could_fit(node, r) {
            return false;
        }
        match r.shape {
            Shape::Whole => false,
            Shape::Cpu => true, // (any node of the type with the host resources)
            Shape::Mig { profile, .. } => {
                p.mig_placeable
                    && p.local(profile)
                        .is_some_and(|k| usize::from(p.mig[k].2) >= r.gpus)
            }
            Shape::Shared {
                fraction,
                memory_mb,
            } => {
                let frac = match (fraction, memory_mb, p.gpu_memory_mb) {
                    (Some(f), _, _) => f,
                    (None, Some(mem), Some(g)) if g != 0 => (mem as f64 / g as f64).min(1.0),
                    _ => return false,
                };
                p.shared
                    && node.ndev > 0
                    && frac <= 1.0 + EPS
                    && memory_mb.is_none_or(|mem| p.gpu_memory_mb.is_some_and(|g| mem <= g))
            }
        }
    })
}

/// Whether the node, empty, has the run's host resources (`Capacity.host_fits` on an empty
/// cluster).
pub(crate) fn host_could_fit(node: &Node, r: &Run) -> bool {
    let (cpu, mem) = r.host();
    (cpu == 0 && mem == 0)
        || (node.cpu_milli.is_none_or(|c| cpu <= c) && node.host_memory_mb.is_none_or(|x| mem <= x))
}

/// The expected end of active run `i` (`backfill.expected_end`).
fn expected_end(st: &State, i: usize, now: f64) -> Option<f64> {
    let r = &st.runs[i];
    let mr = r.max_runtime?;
    Some(match r.start() {
        None => now + mr,
        Some(s) => (s + mr).max(now),
    })
}

/// When the project's own runs have released `short` GPUs (`backfill.quota_time`).
fn quota_time(now: f64, short: f64, ends: &[(f64, f64)]) -> f64 {
    if short <= EPS {
        return now;
    }
    let mut freed = 0.0;
    for &(end, amount) in ends {
        freed += amount;
        if freed >= short - EPS {
            return end;
        }
    }
    f64::INFINITY
}

/// A node for a reservation: (GPUs it needs from runs of unknown end, time, node).
type Candidate = (usize, f64, usize);

/// The earliest reservation for the queued run `i` on `types` (`backfill.reserve`).
pub fn reserve(m: &Model, st: &State, i: usize, types: &[usize], now: f64) -> Option<Reservation> {
    let r = &st.runs[i];
    let mut best: Option<((f64, usize), Reservation)> = None;
    for &t in types {
        // per backend, in the order their nodes first fit: (GPUs from unknown ends, time, node)
        let mut by_backend: Vec<(usize, Vec<Candidate>)> = Vec::new();
        for n in eligible(m, &st.cap, r, t) {
            if m.nodes[n].ndev < r.gpus {
                continue;
            }
            let (mut free, mut when) = (st.cap.free[n].len(), now);
            if free < r.gpus {
                (free, when) = st.reach(n, free, r.gpus, now);
            }
            let item = (r.gpus.saturating_sub(free), when, n);
            let b = m.nodes[n].backend;
            match by_backend.iter_mut().find(|(x, _)| *x == b) {
                Some((_, c)) => c.push(item),
                None => by_backend.push((b, vec![item])),
            }
        }
        let (limit, used, ends) = match quota_terms(m, r, t).1 {
            None => (None, 0.0, Vec::new()),
            Some(limit) => {
                let mut ends: Vec<(f64, f64)> = Vec::new();
                for &k in &st.held[m.pt(r.project, t)] {
                    if let Some(e) = expected_end(st, k, now) {
                        let p = st.runs[k].placement.as_ref().expect("an active run");
                        ends.push((e, p.amount()));
                    }
                }
                ends.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
                (Some(limit), st.cap.used[m.pt(r.project, t)], ends)
            }
        };
        for (_, mut c) in by_backend {
            if c.len() < r.nodes {
                continue;
            }
            let order = |a: &Candidate, b: &Candidate| {
                a.0.cmp(&b.0)
                    .then(a.1.partial_cmp(&b.1).expect("no NaN"))
                    .then(a.2.cmp(&b.2))
            };
            // the first `r.nodes` in that order (a total order: nodes differ), without sorting
            // every node of the type each cycle
            if c.len() > r.nodes {
                c.select_nth_unstable_by(r.nodes - 1, order);
            }
            c[..r.nodes].sort_by(order);
            let chosen = &c[..r.nodes];
            let unknown: usize = chosen.iter().map(|x| x.0).sum();
            let mut at = if unknown > 0 {
                f64::INFINITY
            } else {
                chosen[chosen.len() - 1].1
            };
            let at_q = limit.map_or(now, |l| quota_time(now, used + r.amount() - l, &ends));
            at = at.max(at_q);
            if best
                .as_ref()
                .is_some_and(|(k, _)| (at, unknown) >= (k.0, k.1))
            {
                continue;
            }
            let released: f64 = ends.iter().filter(|x| x.0 <= at).map(|x| x.1).sum();
            let freed = match limit {
                Some(l) => freed_by_quota(
                    m,
                    st,
                    r,
                    t,
                    st.cap.used[m.pt(r.project, t)] + r.amount() - l - released,
                    chosen.iter().map(|x| x.2),
                    now,
                ),
                None => HashMap::new(),
            };
            best = Some((
                (at, unknown),
                Reservation {
                    run: i,
                    at,
                    need: r.gpus,
                    nodes: chosen
                        .iter()
                        .map(|&(_, _, n)| (n, st.lines(n, now)))
                        .collect(),
                    quota: limit.map(|l| (r.project, t, r.amount(), l, released)),
                    borrows: !within_nominal(m, &st.cap.used, r.project, t, r.amount()),
                    freed,
                    unknown_nodes: chosen.iter().filter(|x| x.0 > 0).map(|x| x.2).collect(),
                    quota_unknown: at_q == f64::INFINITY,
                },
            ));
        }
    }
    best.map(|(_, res)| res)
}

/// What an anchor waiting for `short` GPUs of its project's quota, released by its runs
/// without max_runtime, surely gets back on each of `nodes` before it starts: whatever those
/// runs on the other nodes could not release alone (`backfill.freed_by_quota`).
fn freed_by_quota(
    m: &Model,
    st: &State,
    r: &Run,
    t: usize,
    short: f64,
    nodes: impl Iterator<Item = usize>,
    now: f64,
) -> HashMap<usize, usize> {
    let mut out = HashMap::new();
    if short <= EPS {
        return out;
    }
    let mut on: HashMap<usize, usize> = HashMap::new();
    for &k in &st.held[m.pt(r.project, t)] {
        if expected_end(st, k, now).is_none() {
            if let Some(p) = st.runs[k].placement.as_ref() {
                for (n, devs) in &p.slots {
                    *on.entry(*n).or_insert(0) += devs.len();
                }
            }
        }
    }
    let total: usize = on.values().sum();
    for n in nodes {
        let k = (short - (total - on.get(&n).copied().unwrap_or(0)) as f64 + EPS).floor();
        if k >= 1.0 {
            out.insert(n, k as usize);
        }
    }
    out
}
