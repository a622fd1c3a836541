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
//! preemption without its preemptor placed). With `policy.shortest_preempt_borrowers`, a run
//! over its nominal quota may also take long runs of its class from borrowing cohort members
//! whose fair share stays above its project's (`borrowers`). A plan leaves the anchor's reservation what
//! backfill leaves it (`hold`), unless R is the anchor or of a higher class. The search for a
//! plan on one type is `search`'s.

mod borrowers;
mod search;

pub use search::Futile;

use crate::capacity::Placement;
use crate::cycle::Cycle;
use crate::model::Order;
use crate::placement::{place, Filter};
use crate::quota::{admits, within_nominal};

/// What a pool (project, type) holds, as `victims_possible` asks of it for one class: its
/// lowest class, whether it holds a run of `class` that may be a same-class victim (one that
/// reported a checkpoint, unless the policy preempts runs without one), and the latest
/// expected end among its runs of `class` (`Cycle::pool_seen`).
#[derive(Clone, Copy)]
pub struct PoolSeen {
    class: i64,
    lowest: Option<i64>,
    has_class: bool,
    latest_end: Option<f64>,
}

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
            let seen = self.pool_seen(m.pt(r.project, t), r.class);
            if let Some(lowest) = seen.lowest {
                if lowest < r.class || (seen.has_class && self.peers(i, seen.latest_end)) {
                    return true;
                }
            }
            if self.borrowers_possible(i, t) {
                return true;
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

    /// Whether a run of run `i`'s project and class on `t` may be its victim at some time:
    /// one that reported a checkpoint, or any where the policy preempts runs without one.
    pub(crate) fn peers_possible(&self, i: usize, t: usize) -> bool {
        let r = &self.st.runs[i];
        self.pool_seen(self.m.pt(r.project, t), r.class).has_class
    }

    /// What `victims_possible` reads of pool `pt` for `class`, remembered for the cycle (no
    /// pool changes during a cycle: victims leave their pools when it is applied), so that the
    /// pools' `BTreeMap`s are walked once per (project, type) and cycle, not once per head.
    fn pool_seen(&self, pt: usize, class: i64) -> PoolSeen {
        if let Some(seen) = self.pools_seen.borrow()[pt].filter(|s| s.class == class) {
            return seen;
        }
        let pool = &self.st.pools[pt];
        let seen = PoolSeen {
            class,
            lowest: pool.keys().next().copied(),
            has_class: pool
                .get(&class)
                .is_some_and(|p| self.m.policy.preempt_uncheckpointed || p.checkpointed > 0),
            latest_end: pool
                .get(&class)
                .and_then(|pool| pool.ends.last().map(|x| x.end)),
        };
        self.pools_seen.borrow_mut()[pt] = Some(seen);
        seen
    }

    /// Whether a run of `i`'s project and class on a type might be its victim
    /// (`Cycle.peers`); `latest_end`: the latest expected end among them
    /// (`State::latest_victim_end`).
    fn peers(&self, i: usize, latest_end: Option<f64>) -> bool {
        let to_go = match latest_end {
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
    /// (`cycle_victims.may_preempt`'s same-class rule): it reported a checkpoint (or the policy
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

    /// A trial takes victim `v`'s devices back (its give-back, `release`, undone).
    fn take(&mut self, v: usize) {
        let (m, st) = (self.m, &mut *self.st);
        let r = &st.runs[v];
        st.cap
            .retake(m, r.project, r.placement.as_ref().expect("an active run"));
    }

    /// A trial gives victim `v`'s devices back, to be taken again (`take`) before the search
    /// ends: no verdict stamp moves (`Capacity::release_for_trial`); the victims chosen give
    /// theirs back for good in `Cycle::evict`.
    fn release(&mut self, v: usize) {
        let (m, st) = (self.m, &mut *self.st);
        let r = &st.runs[v];
        st.cap
            .release_for_trial(m, r.project, r.placement.as_ref().expect("an active run"));
    }

    /// Choose victims for run `i` and admit it on the devices they free: true when it did
    /// (`cycle._preempt`).
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
        if !self.keeps_what_it_frees(i, &plan) || !self.borrowers_keep(i, &plan) {
            return false;
        }
        // (the shares a message names are read before any victim goes)
        let shares: Vec<_> = plan
            .victims
            .iter()
            .map(|&v| self.taken_by_rule(i, v))
            .collect();
        for (&v, shares) in plan.victims.iter().zip(shares) {
            self.going.insert(v);
            self.evict(v);
            let lost = self.lost_gpu_s(v);
            self.preemptions.push((v, i, lost, shares));
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

    /// What run `i`'s plan on `t` must leave to the reservation (`cycle_reserve.preempt_hold`): as
    /// for backfill (a borrowing anchor holds nothing from another project's run within its
    /// own nominal quota), unless it is the anchor or of a higher class (priority wins).
    pub(super) fn hold(&self, i: usize, t: usize) -> Filter<'_> {
        if !self.held_off(i) {
            return None;
        }
        let res = self.reservation.as_ref()?;
        let r = &self.st.runs[i];
        if res.exempts(self.m, self.st, r, t) {
            return None;
        }
        Some((res, r.max_runtime.map(|mr| self.now + mr)))
    }

    /// Whether a reservation holds run `i`'s plans at all (`cycle_reserve.preempt_hold` is not None):
    /// there is one, `i` is not its anchor nor of a higher level. (A run it exempts on a type
    /// is held by a filter that lets everything through there, but held: `plan_for_type`
    /// then still asks `fits_without`, as Python's does. Found while holdings were float sums,
    /// when that trial's takes and gives back moved them; since they are counted in whole
    /// units (`capacity::UNIT`) the trial changes no holding, and this keeps the structure.)
    fn held_off(&self, i: usize) -> bool {
        self.reservation.as_ref().is_some_and(|res| {
            // (the levels its budgets serve them at)
            res.run != i && self.level_of_run(i) <= self.level_of_run(res.run)
        })
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

    /// Whether a run preempting runs of its own class gets the GPUs it frees
    /// (`cycle._keeps_what_it_frees`): within nominal once its victims of its project are
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
