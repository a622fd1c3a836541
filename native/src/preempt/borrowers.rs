//! Shortest-first preemption across projects (`policy.shortest_preempt_borrowers`; the Python
//! reference is `core/borrowers.py`, whose docstring gives the reasons).
//!
//! Under `order: shortest` with preemption, run R (of project A) may also take a run V of
//! another project P when R's project is over its nominal quota on V's type (else V's
//! borrowing is simply reclaimed) and all of these hold:
//! - P is in A's cohort tree and borrowed V's type when the cycle began (`borrowed_at_start`);
//! - V is of R's class, expected to run on for more than the ratio x R's whole max_runtime,
//!   has reported a checkpoint (unless `preempt_uncheckpointed`) and has run the minimum
//!   runtime: `same_class_victim`, as for a victim of R's own project and class;
//! - P's fair share with V gone stays more than `borrower_share_ratio` x A's with R admitted
//!   (`share_above`, each candidate alone, from the shares as the cycle reads them then);
//! - the whole plan keeps that order for every project it takes from (`keeps_order`), and does
//!   not trade places: with the victims gone, R's project is within nominal with R placed, or
//!   no victim taken by the rule would be within its own project's nominal if queued again.
//!
//! Invariants: nothing here changes `cap`, the shares or the pools (`keeps` releases the
//! victims and takes them back); `possible` over-estimates (false is certain); a victim taken
//! by the rule is reported with both projects' shares (`taken_by_rule`, for the message).

use super::Plan;
use crate::cycle::{Cycle, EPS};
use crate::model::Order;
use crate::quota::within_nominal;
use crate::state::Entry;

impl Cycle<'_> {
    /// Whether the rule applies in this engine's policy (`borrowers.enabled`).
    pub(crate) fn borrowers_on(&self) -> bool {
        let p = &self.m.policy;
        p.shortest_preempt_borrowers && p.order == Order::Shortest && p.preemption
    }

    /// Whether a run of another project might be the rule's victim for run `i` on `t` now
    /// (`borrowers.possible`: the time to go of the longest candidate, and the shares before
    /// the move, which bound those after it).
    pub(super) fn borrowers_possible(&self, i: usize, t: usize) -> bool {
        if !self.borrowers_on() {
            return false;
        }
        let (m, r) = (self.m, &self.st.runs[i]);
        let Some(root) = m.projects[r.project].root else {
            return false;
        };
        let mine = self.share_with(r.project, t, 0.0) * m.policy.borrower_share_ratio + EPS;
        m.members[root].iter().any(|&o| {
            o != r.project
                && self.borrowed_at_start(o, t)
                && self.outlasts(i, self.longest_to_go(o, t, r.class))
                && self.share_with(o, t, 0.0) > mine
        })
    }

    /// The rule's candidates for run `i` on `t` (R over its nominal quota there): the runs of
    /// R's class of the other members that borrowed `t` as the cycle began, that
    /// `same_class_victim` accepts and whose project's share stays above (`share_above`).
    pub(super) fn borrower_candidates(&self, i: usize, t: usize) -> Vec<Entry> {
        let mut out = Vec::new();
        if !self.borrowers_on() {
            return out;
        }
        let (m, r) = (self.m, &self.st.runs[i]);
        let Some(root) = m.projects[r.project].root else {
            return out;
        };
        for &o in &m.members[root] {
            if o == r.project || !self.borrowed_at_start(o, t) {
                continue;
            }
            let Some(pool) = self.st.pools[m.pt(o, t)].get(&r.class) else {
                continue;
            };
            // (sorted by end: only a suffix goes on for long enough, as for R's own class)
            let from = pool
                .ends
                .partition_point(|e| !self.outlasts(i, self.to_go(e.end)));
            out.extend(
                pool.ends[from..]
                    .iter()
                    .filter(|e| self.same_class_victim(i, e.run) && self.share_above(i, e.run)),
            );
        }
        out
    }

    /// Whether victim `v`'s project's share without it stays above the ratio x run `i`'s
    /// project's with `i` admitted on `v`'s type (`borrowers.share_above`).
    fn share_above(&self, i: usize, v: usize) -> bool {
        let (r, a) = (&self.st.runs[i], &self.st.runs[v]);
        let placed = a.placement.as_ref().expect("an active run");
        let theirs = self.share_with(a.project, placed.ty, -placed.amount());
        let mine = self.share_with(r.project, placed.ty, r.amount());
        theirs > mine * self.m.policy.borrower_share_ratio + EPS
    }

    /// The most time a victim candidate of (project `p`, type `t`, `class`) goes on for,
    /// infinite when unknown, -1 with none (`State.longest_to_go`).
    pub(super) fn longest_to_go(&self, p: usize, t: usize, class: i64) -> f64 {
        match self.st.latest_victim_end(self.m, p, t, class) {
            None => -1.0,
            Some(end) => (end - self.now).max(0.0),
        }
    }

    /// Whether run `i` may take victim `v` (another project's) back as lent quota
    /// (`CycleBooks.reclaims`, with the usage as it is now).
    fn reclaims(&self, i: usize, v: usize) -> bool {
        let (m, r, a) = (self.m, &self.st.runs[i], &self.st.runs[v]);
        let t = a.placement.as_ref().expect("an active run").ty;
        let root = m.projects[a.project].root;
        root.is_some()
            && root == m.projects[r.project].root
            && self.borrowed_at_start(a.project, t)
            && within_nominal(m, &self.st.cap.used, r.project, t, r.amount())
    }

    /// Whether the rule (not a reclaim, not a lower class) took victim `v` of run `i`: then
    /// the fair shares of `v`'s project and `i`'s as they are now (`borrowers.taken_by_rule`,
    /// for the preemption's message; asked before any victim goes).
    pub(super) fn taken_by_rule(&self, i: usize, v: usize) -> Option<(f64, f64)> {
        let (r, a) = (&self.st.runs[i], &self.st.runs[v]);
        if !self.borrowers_on() || a.project == r.project || a.class != r.class {
            return None;
        }
        if self.reclaims(i, v) {
            return None;
        }
        let t = a.placement.as_ref().expect("an active run").ty;
        Some((
            self.share_with(a.project, t, 0.0),
            self.share_with(r.project, t, 0.0),
        ))
    }

    /// Whether the plan keeps the order of shares and does not trade places
    /// (`borrowers.keeps`): each candidate was judged alone, this judges the plan's move.
    pub(super) fn borrowers_keep(&mut self, i: usize, plan: &Plan) -> bool {
        let taken: Vec<usize> = plan
            .victims
            .iter()
            .copied()
            .filter(|&v| self.taken_by_rule(i, v).is_some())
            .collect();
        if taken.is_empty() {
            return true;
        }
        if !self.keeps_order(i, plan, &taken) {
            return false;
        }
        for &v in &plan.victims {
            self.release(v);
        }
        let (m, used, project) = (self.m, &self.st.cap.used, self.st.runs[i].project);
        let t = plan.placement.ty;
        let keeps = within_nominal(m, used, project, t, plan.placement.amount())
            || !taken.iter().any(|&v| {
                let a = &self.st.runs[v];
                within_nominal(m, used, a.project, t, a.amount())
            });
        for &v in &plan.victims {
            self.take(v);
        }
        keeps
    }

    /// With every victim gone and run `i` placed, each project the rule took from keeps a
    /// share above the ratio x `i`'s project's (`borrowers._keeps_order`; the GPUs freed per
    /// project summed in the plan's victim order, as the Python core sums them).
    fn keeps_order(&self, i: usize, plan: &Plan, taken: &[usize]) -> bool {
        let t = plan.placement.ty;
        let mut freed: Vec<(usize, f64)> = Vec::new(); // (project, GPUs freed on `t`)
        for &v in &plan.victims {
            let a = &self.st.runs[v];
            let placed = a.placement.as_ref().expect("an active run");
            if placed.ty != t {
                continue;
            }
            match freed.iter_mut().find(|(p, _)| *p == a.project) {
                Some((_, x)) => *x += placed.amount(),
                None => freed.push((a.project, 0.0 + placed.amount())),
            }
        }
        let of = |p: usize| freed.iter().find(|(q, _)| *q == p).map_or(0.0, |x| x.1);
        let project = self.st.runs[i].project;
        let mine = self.share_with(project, t, plan.placement.amount() - of(project));
        let bar = mine * self.m.policy.borrower_share_ratio + EPS;
        taken.iter().all(|&v| {
            let p = self.st.runs[v].project;
            self.share_with(p, t, -of(p)) > bar
        })
    }
}
