//! The search for a sufficient set of victims of run R on one GPU type (`preempt._plan_for_type`
//! and `preempt._greedy`); who may be a victim, and how plans compare, is `preempt`'s.
//!
//! Invariants: the candidates are exactly the possible victims among the pools (runs chosen
//! this cycle, in `going`, skipped), sorted by (class, GPU-seconds lost, latest admission
//! first, id); for whole-GPU runs an upper bound (`could_fit_without_all`) may rule a type out
//! early, never in; the greedy pass tries up to `MAX_ANCHORS` of the nodes with the most room
//! first, then the prune gives back the highest class and most expensive first. Every trial
//! gives back what it took: `cap` is as before whether a plan is found or not (the caller
//! takes the plan's victims out).

use std::cell::RefCell;

use rustc_hash::FxHashMap as HashMap;

use super::{better, Plan};
use crate::capacity::Placement;
use crate::cycle::Cycle;
use crate::model::Order;
use crate::placement::{eligible_node, group_serves, place, place_among};
use crate::quota::within_nominal;
use crate::state::{Entry, NONE};

/// How many anchor nodes the search tries per GPU type (the most promising first).
const MAX_ANCHORS: usize = 12;

/// The search inputs of a run charged alike wherever it lands (`Shape::amount_fixed`) but
/// its own run: (project, type, class, request
/// (`Run::request`), whether it may borrow (preemptible), whether the reservation holds its
/// plans there: `hold` is a filter that does not let everything through).
type FutileKey = (usize, usize, i64, u32, bool, bool);

/// The searches that found no plan for a run charged alike wherever it lands, remembered
/// until the next admission (`Cycle::stamp`): per `FutileKey`, the least `own_bound` among
/// them.
///
/// Exact because, with the key and the state fixed, such a run's candidates shrink as its
/// `own_bound` grows, and a search finds no plan exactly when the run does not fit (place
/// and quota, with the hold) with every candidate gone (each greedy order ends with all of
/// them given back, and a fit found earlier is a fit then too, of the same amount, which
/// quota admits as well; `reaches` skips a trial only where the place could not change), which
/// fewer candidates given back cannot change: every part of the candidates but its own
/// class's (and the borrower rule's) reads only the key and the state; those two keep the
/// runs that go on for more than the ratio x its max_runtime (`outlasts`: fewer as it grows;
/// none without one) or, under `las`, that are in a later LAS level than its own (fewer as its
/// level rises). A hold reads the run's end only as whether it ends before the reservation
/// (`Reservation::before`), which the key's last part says. No admission, no change: `cap`,
/// `going` and the usage move only with one (a search gives back what it took).
#[derive(Default)]
pub struct Futile(RefCell<HashMap<FutileKey, (usize, f64)>>);

impl Cycle<'_> {
    /// What of run `i` alone its own class's candidates depend on: fewer as it grows
    /// (`Futile`).
    fn own_bound(&self, i: usize) -> f64 {
        let (pol, r) = (&self.m.policy, &self.st.runs[i]);
        match pol.order {
            Order::Shortest => r.max_runtime.unwrap_or(f64::INFINITY),
            Order::Las => pol.las_level(r.attained) as f64,
            Order::Submit => 0.0,
        }
    }

    fn futile_key(&self, i: usize, t: usize) -> Option<FutileKey> {
        let r = &self.st.runs[i];
        let held = self.hold(i, t).is_some_and(|(res, ends)| !res.before(ends));
        r.shape
            .amount_fixed()
            .then_some((r.project, t, r.class, r.request, r.preemptible, held))
    }

    /// Whether a search since the last admission found that run `i` has no plan on `t`
    /// with no hold (`verdict`: found so, the run fits nowhere with every candidate gone).
    pub(crate) fn no_plan_unheld(&self, i: usize, t: usize) -> bool {
        self.futile_key(i, t)
            .filter(|k| !k.5)
            .is_some_and(|k| self.known_futile(&k, self.own_bound(i)))
    }

    /// Whether a search since the last admission with key `k` and an own bound at most
    /// `bound` found no plan.
    fn known_futile(&self, k: &FutileKey, bound: f64) -> bool {
        let known = self.futile.0.borrow().get(k).copied();
        known.is_some_and(|(at, least)| at == self.stamp() && bound >= least)
    }

    /// Run `i`'s best plan on `t`, or None (`preempt._plan_for_type`), where `Futile` does
    /// not know already that there is none.
    pub(super) fn plan_for_type(&mut self, i: usize, t: usize) -> Option<Plan> {
        let stamp = self.stamp();
        let (key, bound) = (self.futile_key(i, t), self.own_bound(i));
        let Some(k) = key else {
            return self.search(i, t);
        };
        if self.known_futile(&k, bound) {
            return None; // (a search with no more candidates found none)
        }
        let plan = self.search(i, t);
        if plan.is_none() {
            let mut futile = self.futile.0.borrow_mut();
            let entry = futile.entry(k).or_insert((stamp, bound));
            *entry = if entry.0 == stamp {
                (stamp, entry.1.min(bound))
            } else {
                (stamp, bound)
            };
        }
        plan
    }

    /// Run `i`'s best plan on `t`, or None (`preempt._plan_for_type`).
    fn search(&mut self, i: usize, t: usize) -> Option<Plan> {
        // The candidates: the possible victims among the pool (the run's project's runs on
        // `t`, and those of the cohort members that borrowed `t` as the cycle began).
        // (`preempt._plan_for_type` first asks whether the run could fit with the whole pool
        // gone: the pool holds the candidates, so when it could not, neither could they, and
        // the one question below gives the same answer.)
        let m = self.m;
        let mut cands: Vec<usize> = Vec::new();
        {
            let r = &self.st.runs[i];
            // the pool's parts that hold candidates (runs chosen as victims this cycle, in
            // `going`, are skipped as they are read)
            let mut parts: Vec<&[Entry]> = Vec::new();
            let mut own: Vec<Entry> = Vec::new(); // of its own class (kept apart: filtered)
            for (&class, pool) in &self.st.pools[m.pt(r.project, t)] {
                if class < r.class {
                    parts.push(&pool.ends);
                } else if class == r.class && m.policy.order != Order::Submit {
                    // Under `shortest`, only a suffix of the pool sorted by end can go on for
                    // more than the ratio x its max_runtime (the time to go only grows with the
                    // end; an entry's end is never before the run's expected end).
                    let from = if m.policy.order == Order::Shortest {
                        pool.ends
                            .partition_point(|e| !self.outlasts(i, self.to_go(e.end)))
                    } else {
                        0
                    };
                    own.extend(
                        pool.ends[from..]
                            .iter()
                            .filter(|e| self.same_class_victim(i, e.run)),
                    );
                }
            }
            // Cohort members that borrowed `t` as the cycle began, while the run stays within
            // its nominal quota: all their runs on `t`.
            // Else, under `shortest_preempt_borrowers`, some of their runs of its class.
            let mut theirs: Vec<Entry> = Vec::new();
            if let Some(root) = m.projects[r.project].root {
                if within_nominal(m, &self.st.cap.used, r.project, t, r.amount()) {
                    for &o in &m.members[root] {
                        if o != r.project && self.borrowed_at_start(o, t) {
                            parts.extend(self.st.pools[m.pt(o, t)].values().map(|p| &p.ends[..]));
                        }
                    }
                } else {
                    theirs = self.borrower_candidates(i, t);
                }
            }
            parts.push(&own);
            parts.push(&theirs);
            // (the bound counts whole devices: asked of whole-GPU runs only)
            if !r.shape.is_whole() || self.could_fit_without_all(i, t, &parts) {
                for part in parts {
                    cands.extend(
                        part.iter()
                            .map(|e| e.run)
                            .filter(|v| !self.going.contains(v)),
                    );
                }
            }
        }
        if cands.is_empty() {
            return None;
        }
        // Held off what it needs, or a run charged alike wherever it lands (whose greedy
        // orders each end with every candidate gone): fitting only gets easier as victims go,
        // so no fit with all of them gone is no plan, found with one trial instead of one per
        // order (and before the candidates are sorted).
        let fixed = self.st.runs[i].shape.amount_fixed();
        if (fixed || self.held_off(i)) && !self.fits_without(i, t, &cands) {
            return None;
        }
        let cost: HashMap<usize, f64> = cands.iter().map(|&v| (v, self.lost_gpu_s(v))).collect();
        let runs = &self.st.runs;
        // (class, cost, latest admission first, id): the keys read once, not per comparison
        let mut keyed: Vec<(i64, f64, f64, usize)> = cands
            .iter()
            .map(|&v| {
                (
                    runs[v].class,
                    cost[&v],
                    -runs[v].admitted_at.unwrap_or(0.0),
                    v,
                )
            })
            .collect();
        keyed.sort_by(|a, b| {
            a.0.cmp(&b.0)
                .then(a.1.partial_cmp(&b.1).expect("no NaN"))
                .then(a.2.partial_cmp(&b.2).expect("no NaN"))
                .then_with(|| runs[a.3].id.cmp(&runs[b.3].id))
        });
        cands = keyed.into_iter().map(|k| k.3).collect();
        let runs = &self.st.runs;
        let mut on_node: HashMap<usize, Vec<usize>> = HashMap::default();
        for &v in &cands {
            for (n, _) in &runs[v].placement.as_ref().expect("an active run").slots {
                on_node.entry(*n).or_default().push(v);
            }
        }
        let cap = &self.st.cap;
        let room = |n: usize| -> usize {
            cap.free[n].len()
                + on_node[&n]
                    .iter()
                    .map(|&v| runs[v].placement.as_ref().expect("an active run").gpus)
                    .sum::<usize>()
        };
        // (the eligible nodes among the candidates' own, not every node of the type: sorted
        // below, in no order of the map's)
        let mut nodes: Vec<(usize, usize)> = on_node
            .keys()
            .copied()
            .filter(|&n| m.nodes[n].ty == t && eligible_node(m, cap, &runs[i], n))
            .map(|n| (room(n), n))
            .collect();
        nodes.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut orders: Vec<Vec<usize>> = Vec::new();
        for &(_, n) in nodes.iter().take(MAX_ANCHORS) {
            let local = &on_node[&n];
            let mut order = local.clone();
            order.extend(cands.iter().copied().filter(|v| !local.contains(v)));
            orders.push(order);
        }
        if orders.is_empty() {
            orders.push(cands);
        }
        let mut best: Option<Plan> = None;
        for order in &orders {
            if let Some(plan) = self.greedy(i, t, order, &cost) {
                if better(&plan, &best) {
                    best = Some(plan);
                }
            }
        }
        best
    }

    /// Whether run `i` might fit on `t` with every run of `cands` gone: per backend (and, for
    /// a gang that requires a topology, per value of its key: its nodes share one), the nodes
    /// with its GPUs and host resources free now, plus those of the candidates that reach its
    /// GPUs with the candidates' devices back (their host resources taken to be enough: an
    /// upper bound, false is certain).
    fn could_fit_without_all(&self, i: usize, t: usize, parts: &[&[Entry]]) -> bool {
        let (m, st) = (self.m, &*self.st);
        let r = &st.runs[i];
        let topology = r.topology.filter(|_| r.topology_required && r.nodes > 1);
        // (a node without the key joins no gang)
        let domain = |n: usize| match topology {
            None => Some(0),
            Some(k) => m.nodes[n].labels.get(k).copied().flatten(),
        };
        // ((backend, domain), nodes fitting)
        let mut count: HashMap<(usize, u32), usize> = HashMap::default();
        let mut serves: Vec<usize> = Vec::new(); // (the backends of the groups that serve it)
        for g in 0..m.groups.len() {
            if group_serves(m, g, t, r) {
                let backend = m.groups[g].1;
                serves.push(backend);
                if topology.is_none() && r.host() == (0, 0) {
                    let c = st.cap.count_at_least(g, r.gpus);
                    if c >= r.nodes {
                        return true;
                    }
                    count.insert((backend, 0), c);
                    continue;
                }
                for n in st.cap.buckets[g].iter().skip(r.gpus).flat_map(|b| b.iter()) {
                    if !st.cap.host_fits(n, r.host()) {
                        continue;
                    }
                    if let Some(d) = domain(n) {
                        let c = count.entry((backend, d)).or_insert(0);
                        *c += 1;
                        if *c >= r.nodes {
                            return true;
                        }
                    }
                }
            }
        }
        // GPUs the candidates hold per node, in scratch arrays (zeroed again after)
        let freed = &mut *self.freed.borrow_mut();
        let touched = &mut *self.touched.borrow_mut();
        touched.clear();
        let mut add = |n: usize, k: usize| {
            if freed[n] == 0 {
                touched.push(n);
            }
            freed[n] += k;
        };
        let going = &self.going;
        for e in parts.iter().flat_map(|p| p.iter()) {
            if !going.is_empty() && going.contains(&e.run) {
                continue;
            }
            if e.more {
                for (n, d) in &st.runs[e.run]
                    .placement
                    .as_ref()
                    .expect("an active run")
                    .slots
                {
                    add(*n, d.len());
                }
                continue;
            }
            for &(n, k) in &e.held {
                if n != NONE {
                    add(n as usize, k as usize);
                }
            }
        }
        let mut found = false;
        for &n in touched.iter() {
            let back = std::mem::take(&mut freed[n]);
            let node = &m.nodes[n];
            if found || node.ty != t || !node.schedulable || !serves.contains(&node.backend) {
                continue;
            }
            let Some(d) = domain(n) else {
                continue;
            };
            let free = st.cap.free[n].len();
            // (a node with its GPUs free counted above unless its host resources were short)
            let reaches = if free < r.gpus {
                r.gpus <= free + back
            } else {
                !st.cap.host_fits(n, r.host())
            };
            if reaches {
                let c = count.entry((node.backend, d)).or_insert(0);
                *c += 1;
                found = *c >= r.nodes;
            }
        }
        found
    }

    fn greedy(
        &mut self,
        i: usize,
        t: usize,
        order: &[usize],
        cost: &HashMap<usize, f64>,
    ) -> Option<Plan> {
        let r = &self.st.runs[i];
        let (need, whole, amount) = (r.gpus, r.shape.is_whole(), r.amount());
        // (charged alike wherever it lands: quota, which no place changes, is asked first)
        let fixed = r.shape.amount_fixed();
        let mut chosen: Vec<usize> = Vec::new();
        let mut placed: Option<Placement> = None;
        // Whether the last place found no node at all; then only the nodes of the victims
        // given back since (`chosen[since..]`) may take it.
        let (mut nowhere, mut since) = (false, 0);
        for &a in order {
            self.release(a);
            chosen.push(a);
            if fixed && !self.admits_held(i, t, amount) {
                continue;
            }
            let fresh = &chosen[since..];
            if nowhere && whole && !fresh.iter().any(|&v| self.reaches(v, need)) {
                continue;
            }
            let (m, st) = (self.m, &*self.st);
            let found = if nowhere && !whole {
                // (a one-node request: the best place is among those nodes, if any)
                let mut nodes: Vec<usize> = (fresh.iter())
                    .flat_map(|&v| &st.runs[v].placement.as_ref().expect("active").slots)
                    .map(|(n, _)| *n)
                    .collect();
                nodes.sort_unstable();
                nodes.dedup();
                place_among(m, &st.cap, &st.runs[i], t, self.hold(i, t), &nodes)
            } else {
                place(m, &st.cap, &st.runs[i], t, self.hold(i, t))
            };
            (nowhere, since) = (found.is_none(), chosen.len());
            if let Some(w) = found {
                if self.admits_held(i, t, w.amount()) {
                    placed = Some(w);
                    break;
                }
            }
        }
        let Some(mut placed) = placed else {
            for &a in &chosen {
                self.take(a);
            }
            return None;
        };
        // Prune: give back every victim the run can do without, most expensive first.
        let last = chosen[chosen.len() - 1];
        let mut kept = chosen.clone();
        let mut by_cost = chosen.clone();
        let runs = &self.st.runs;
        by_cost.sort_by(|a, b| {
            (runs[*b].class.cmp(&runs[*a].class))
                .then(cost[b].partial_cmp(&cost[a]).expect("no NaN"))
        });
        for &a in &by_cost {
            self.take(a);
            let known = a == last && kept.len() == chosen.len() && chosen.len() > 1;
            let still = if known { None } else { self.fits(i, t) };
            if let Some(s) = still {
                kept.retain(|&k| k != a);
                placed = s;
            } else {
                self.release(a);
            }
        }
        for &a in &kept {
            self.take(a);
        }
        let lost = kept.iter().fold(0.0, |acc, a| acc + cost[a]);
        let runs = &self.st.runs;
        kept.sort_by(|a, b| runs[*a].id.cmp(&runs[*b].id));
        let top = kept.iter().map(|&a| runs[a].class).max().expect("a victim");
        Some(Plan {
            victims: kept,
            placement: placed,
            lost,
            top,
        })
    }

    /// Whether one of the victim's nodes has `need` GPUs free (after its release).
    fn reaches(&self, v: usize, need: usize) -> bool {
        let p = self.st.runs[v].placement.as_ref().expect("an active run");
        p.slots
            .iter()
            .any(|(n, _)| self.st.cap.free[*n].len() >= need)
    }
}
