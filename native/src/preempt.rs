//! Victim selection (`mlops_gpu.core.preempt` and the preemption rules of `policy.Cycle`).
//!
//! Who may be a victim of run R on the type R would use: a preemptible run of R's project of
//! a lower class; one of R's own project and class (`same_class_victim`) that reported a
//! checkpoint (unless `preempt_uncheckpointed`), has run `min_runtime_s` and is further back
//! in the order (under `shortest`: expected to run on for more than the ratio x R's
//! max_runtime, so never one without a max_runtime; under `las`: in a later LAS level); a
//! preemptible run of another project of R's cohort tree that borrowed that type as the cycle
//! began, when R stays within its nominal quota. Runs being preempted hold nothing already.
//! Among sufficient sets: the lowest highest victim class (a victim of a higher class,
//! requeued, would preempt its project's lower-class runs in turn), then the fewest
//! GPU-seconds lost since each victim's checkpoint (or start), then the fewest victims; a
//! greedy pass in (class, cost) order around each of the most promising nodes, then a prune
//! that gives back the highest class and most expensive first and keeps only the victims
//! still needed. Every trial gives
//! back what it took: `cap` is as before when a search fails; when one succeeds, the victims
//! give their devices back and R is admitted on the plan's placement in the same step (no
//! preemption without its preemptor placed). A plan leaves the anchor's reservation what
//! backfill leaves it (`hold`), unless R is the anchor or of a higher class.

use rustc_hash::FxHashMap as HashMap;

use crate::capacity::Placement;
use crate::cycle::Cycle;
use crate::model::Order;
use crate::placement::{eligible, group_serves, place, Filter};
use crate::quota::{admits, within_nominal};
use crate::state::{Entry, NONE};

/// How many anchor nodes the search tries per GPU type (the most promising first).
const MAX_ANCHORS: usize = 12;

pub struct Plan {
    pub victims: Vec<usize>,
    pub placement: Placement,
    pub lost: f64,
    /// The highest class among the victims.
    pub top: i64,
}

/// Plans compare by their highest victim class, then the GPU-seconds lost, then the number
/// of victims (`preempt._rank`).
fn better(plan: &Plan, best: &Option<Plan>) -> bool {
    best.as_ref().is_none_or(|b| {
        plan.top < b.top
            || (plan.top == b.top
                && (plan.lost < b.lost
                    || (plan.lost == b.lost && plan.victims.len() < b.victims.len())))
    })
}

impl Cycle<'_> {
    /// Whether any active run might be a victim of run `i` (an over-estimate).
    pub fn victims_possible(&self, i: usize) -> bool {
        let (m, st) = (self.m, &*self.st);
        let r = &st.runs[i];
        for &t in &r.types {
            let pool = &st.pools[m.pt(r.project, t)];
            if let Some((&lowest, _)) = pool.iter().next() {
                if lowest < r.class || (pool.contains_key(&r.class) && self.peers(i, t)) {
                    return true;
                }
            }
            let Some(root) = m.projects[r.project].root else {
                continue;
            };
            if !within_nominal(m, &st.cap.used, r.project, t, r.amount()) {
                continue;
            }
            for &o in &m.members[root] {
                if o != r.project
                    && self.borrowed_at_start(o, t)
                    && !st.pools[m.pt(o, t)].is_empty()
                {
                    return true;
                }
            }
        }
        false
    }

    /// Whether a run of `i`'s project and class on `t` might be its victim (`Cycle.peers`).
    fn peers(&self, i: usize, t: usize) -> bool {
        let r = &self.st.runs[i];
        let to_go = match self.st.latest_victim_end(self.m, r.project, t, r.class) {
            None => -1.0,
            Some(end) => (end - self.now).max(0.0),
        };
        match self.m.policy.order {
            Order::Las => true,
            Order::Shortest => self.outlasts(i, to_go),
            Order::Submit => false,
        }
    }

    /// Under `shortest`: whether a run with `to_go` seconds left goes on for more than the
    /// ratio x run `i`'s whole max_runtime.
    fn outlasts(&self, i: usize, to_go: f64) -> bool {
        self.st.runs[i]
            .max_runtime
            .is_some_and(|mr| to_go > mr * self.m.policy.shortest_preempt_ratio + 1e-9)
    }

    /// Seconds a run expected to end at `end` still goes on for (`backfill.expected_end` less
    /// the clock; infinite without a known end).
    fn to_go(&self, end: f64) -> f64 {
        if end == f64::INFINITY {
            return end;
        }
        end.max(self.now) - self.now
    }

    /// Whether `v`, of run `i`'s project and class, may be its victim
    /// (`Cycle._may_preempt`'s same-class rule): it reported a checkpoint (or the policy
    /// preempts runs without one), has run at least the guaranteed minimum, and is further back
    /// in the order than `i`.
    fn same_class_victim(&self, i: usize, v: usize) -> bool {
        let (pol, a) = (&self.m.policy, &self.st.runs[v]);
        if a.last_checkpoint_at.is_none() && !pol.preempt_uncheckpointed {
            return false;
        }
        if a.start().is_none_or(|s| self.now - s < pol.min_runtime_s) {
            return false;
        }
        match pol.order {
            Order::Las => {
                pol.las_level(self.attained_now(v)) > pol.las_level(self.st.runs[i].attained)
            }
            // an unknown end is not an infinitely long run: no victim
            Order::Shortest => self
                .expected_end(v)
                .is_some_and(|end| self.outlasts(i, end - self.now)),
            Order::Submit => false,
        }
    }

    /// When an active run not being preempted is expected to end (`backfill.expected_end`):
    /// start + max_runtime (now + max_runtime without a start), never before now; None without
    /// a max_runtime.
    fn expected_end(&self, v: usize) -> Option<f64> {
        let a = &self.st.runs[v];
        let mr = a.max_runtime?;
        Some((a.start().unwrap_or(self.now) + mr).max(self.now))
    }

    fn borrowed_at_start(&self, p: usize, t: usize) -> bool {
        self.used_at_start[self.m.pt(p, t)] > self.m.term(p, t).nominal + 1e-9
    }

    /// GPU-seconds over all attempts, the current one included (`fairshare.attained_now`).
    fn attained_now(&self, v: usize) -> f64 {
        let a = &self.st.runs[v];
        let held = match (&a.placement, a.admitted_at) {
            (Some(p), Some(at)) => p.amount() * (self.now - at).max(0.0),
            _ => 0.0,
        };
        a.attained + held
    }

    fn lost_gpu_s(&self, v: usize) -> f64 {
        let a = &self.st.runs[v];
        let mut since = 0.0f64;
        for x in [a.last_checkpoint_at, a.started_at, a.admitted_at]
            .into_iter()
            .flatten()
        {
            if x > since {
                since = x;
            }
        }
        a.placement.as_ref().expect("an active run").amount() * (self.now - since).max(0.0)
    }

    fn take(&mut self, v: usize) {
        let (m, st) = (self.m, &mut *self.st);
        let r = &st.runs[v];
        st.cap
            .take(m, r.project, r.placement.as_ref().expect("an active run"));
    }

    fn release(&mut self, v: usize) {
        let (m, st) = (self.m, &mut *self.st);
        let r = &st.runs[v];
        st.cap
            .release(m, r.project, r.placement.as_ref().expect("an active run"));
    }

    /// Choose victims for run `i` and admit it on the devices they free: true when it did
    /// (`Cycle._preempt`).
    pub fn preempt(&mut self, i: usize, types: &[usize]) -> bool {
        let mut best: Option<Plan> = None;
        for &t in types {
            if let Some(plan) = self.plan_for_type(i, t) {
                if better(&plan, &best) {
                    best = Some(plan);
                }
            }
        }
        let Some(plan) = best else { return false };
        if !self.keeps_what_it_frees(i, &plan) {
            return false;
        }
        for &v in &plan.victims {
            self.going.insert(v);
            self.evict(v);
            let lost = self.lost_gpu_s(v);
            self.preemptions.push((v, i, lost));
        }
        self.admit(i, plan.placement);
        true
    }

    fn fits(&self, i: usize, t: usize) -> Option<Placement> {
        let (m, st) = (self.m, &*self.st);
        let r = &st.runs[i];
        let placed = place(m, &st.cap, r, t, self.hold(i, t))?;
        self.admits_held(i, t, placed.amount()).then_some(placed)
    }

    /// Whether run `i` fits on `t` (`fits`, with the hold) with every run of `cands` gone.
    fn fits_without(&mut self, i: usize, t: usize, cands: &[usize]) -> bool {
        for &v in cands {
            self.release(v);
        }
        let fits = self.fits(i, t).is_some();
        for &v in cands {
            self.take(v);
        }
        fits
    }

    /// What run `i`'s plan on `t` must leave to the reservation (`Cycle._preempt_hold`): as
    /// for backfill (a borrowing anchor holds nothing from another project's run within its
    /// own nominal quota), unless it is the anchor or of a higher class (priority wins).
    fn hold(&self, i: usize, t: usize) -> Filter<'_> {
        let res = self.reservation.as_ref().filter(|res| res.run != i)?;
        if self.level_of_run(i) > self.level_of_run(res.run) {
            return None; // (the levels its budgets serve them at)
        }
        let r = &self.st.runs[i];
        if res.exempts(self.m, self.st, r, t) {
            return None;
        }
        Some((res, r.max_runtime.map(|mr| self.now + mr)))
    }

    /// Quota admits `amount` of `t` for run `i`, and the reservation's hold lets it take it.
    fn admits_held(&self, i: usize, t: usize, amount: f64) -> bool {
        let (m, st) = (self.m, &*self.st);
        let r = &st.runs[i];
        let used = st.cap.used[m.pt(r.project, t)];
        admits(m, &st.cap.used, r.project, t, amount, r.preemptible)
            && self
                .hold(i, t)
                .is_none_or(|(res, ends)| res.allows_quota(r.project, t, used + amount, ends))
    }

    fn plan_for_type(&mut self, i: usize, t: usize) -> Option<Plan> {
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
            if let Some(root) = m.projects[r.project].root {
                if within_nominal(m, &self.st.cap.used, r.project, t, r.amount()) {
                    for &o in &m.members[root] {
                        if o != r.project && self.borrowed_at_start(o, t) {
                            parts.extend(self.st.pools[m.pt(o, t)].values().map(|p| &p.ends[..]));
                        }
                    }
                }
            }
            parts.push(&own);
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
        let cost: HashMap<usize, f64> = cands.iter().map(|&v| (v, self.lost_gpu_s(v))).collect();
        let runs = &self.st.runs;
        cands.sort_by(|&a, &b| {
            let (ra, rb) = (&runs[a], &runs[b]);
            ra.class
                .cmp(&rb.class)
                .then(cost[&a].partial_cmp(&cost[&b]).expect("no NaN"))
                .then(
                    (-ra.admitted_at.unwrap_or(0.0))
                        .partial_cmp(&-rb.admitted_at.unwrap_or(0.0))
                        .expect("no NaN"),
                )
                .then(ra.id.cmp(&rb.id))
        });
        if self.hold(i, t).is_some() && !self.fits_without(i, t, &cands) {
            return None; // held off what it needs: fitting only gets easier as victims go
        }
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
        let mut nodes: Vec<(usize, usize)> = eligible(m, cap, &runs[i], t)
            .filter(|n| on_node.contains_key(n))
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

    /// Whether run `i` might fit on `t` with every run of `cands` gone: per backend, the
    /// nodes with its GPUs free now plus those that reach them with the candidates' devices
    /// back (an upper bound: false is certain).
    fn could_fit_without_all(&self, i: usize, t: usize, parts: &[&[Entry]]) -> bool {
        let (m, st) = (self.m, &*self.st);
        let r = &st.runs[i];
        let mut count: Vec<(usize, usize)> = Vec::new(); // (backend, nodes fitting)
        for g in 0..m.groups.len() {
            if group_serves(m, g, t, r) {
                let c = st.cap.count_at_least(g, r.gpus);
                if c >= r.nodes {
                    return true;
                }
                count.push((m.groups[g].1, c));
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
            if found || node.ty != t || !node.schedulable {
                continue;
            }
            let Some(c) = count.iter_mut().find(|(b, _)| *b == node.backend) else {
                continue;
            };
            let free = st.cap.free[n].len();
            if free < r.gpus && r.gpus <= free + back {
                c.1 += 1;
                found = c.1 >= r.nodes;
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
        let need = self.st.runs[i].gpus;
        let whole = self.st.runs[i].shape.is_whole();
        let mut chosen: Vec<usize> = Vec::new();
        let mut placed: Option<Placement> = None;
        let mut nowhere = false; // the last search found no node at all
        for &a in order {
            self.release(a);
            chosen.push(a);
            if nowhere && whole && !self.reaches(a, need) {
                continue;
            }
            let (m, st) = (self.m, &*self.st);
            let found = place(m, &st.cap, &st.runs[i], t, self.hold(i, t));
            nowhere = found.is_none();
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

    /// Whether a run preempting runs of its own class gets the GPUs it frees
    /// (`Cycle._keeps_what_it_frees`): within nominal once its victims of its project are
    /// gone, or every such victim would borrow too.
    fn keeps_what_it_frees(&mut self, i: usize, plan: &Plan) -> bool {
        let (project, class) = (self.st.runs[i].project, self.st.runs[i].class);
        let mine = |v: &usize| self.st.runs[*v].project == project;
        let peers: Vec<usize> = plan
            .victims
            .iter()
            .copied()
            .filter(|v| mine(v) && self.st.runs[*v].class == class)
            .collect();
        if peers.is_empty() {
            return true;
        }
        let gone: Vec<usize> = plan.victims.iter().copied().filter(mine).collect();
        for &a in &gone {
            self.release(a);
        }
        let (m, used) = (self.m, &self.st.cap.used);
        let t = plan.placement.ty;
        let keeps = within_nominal(m, used, project, t, plan.placement.amount())
            || !peers.iter().any(|&v| {
                let amount = self.st.runs[v].placement.as_ref().expect("active").amount();
                within_nominal(m, used, project, t, amount)
            });
        for &a in &gone {
            self.take(a);
        }
        keeps
    }
}
