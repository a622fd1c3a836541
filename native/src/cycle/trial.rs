//! One run's trial in a cycle (`cycle._try`): on each type it accepts, in order (several:
//! headroom, then the placement that fragments least), a placement that respects the
//! reservation's hold and a quota that admits it admit it; else, when it would fit but for
//! the reservation, it is `Reserved`; else it may choose victims (`preempt`); else it is
//! `Blocked`, and an explaining cycle books why.
//!
//! Invariants: a trial changes `cap` only by admitting the run (with its victims' devices
//! given back first); `surely_blocked` is true only when `try_run` would find the run blocked
//! with no side effect (it never hides an admission or a preemption).

use std::cell::RefCell;
use std::rc::Rc;

use super::{Cycle, EPS};
use crate::capacity::Placement;
use crate::explain;
use crate::parts::Shape;
use crate::placement::{node_sets, place, Filter};
use crate::quota::{admits, room, within_nominal};
use crate::type_choice::order_types;

/// The places trials found since the last admission (`Cycle::placed`): per request
/// (`Run::request`), type and whether a reservation held it, the place or None, with the
/// `Cycle::stamp` it was found at.
///
/// Exact because a place depends only on those and `cap`, which between two admissions moves
/// only inside a victim search (which gives back what it took, and does not read this), and a
/// reservation's hold reads the run's end only as whether it ends before the reservation
/// (`Reservation::before`: then it holds nothing, as no filter). Queue heads of one request
/// in several projects (a queue per project and shape) are placed once; a place is shared
/// (`Rc`), copied only for the run admitted on it.
#[derive(Default)]
pub struct Placed(RefCell<Vec<(usize, Option<Rc<Placement>>)>>);

/// What a trial did with the run.
#[derive(PartialEq)]
pub(super) enum Outcome {
    Admitted,
    Blocked,
    Reserved,
}

impl Cycle<'_> {
    /// Whether run `i` borrows on every type it accepts (`cycle._must_borrow`).
    pub(super) fn must_borrow(&self, i: usize) -> bool {
        let r = &self.st.runs[i];
        let used = &self.st.cap.used;
        !r.types
            .iter()
            .any(|&t| within_nominal(self.m, used, r.project, t, r.amount()))
    }

    /// Whether run `i` might take victims: `victims_possible` where the policy preempts.
    pub(super) fn may_preempt(&self, i: usize) -> bool {
        self.m.policy.preemption && self.victims_possible(i)
    }

    /// A cheap test that `try_run` would find the run blocked with no side effect
    /// (`cycle._surely_blocked`); `may_preempt`: `may_preempt(i)`, asked by the caller.
    pub(super) fn surely_blocked(&self, i: usize, may_preempt: bool) -> bool {
        let m = self.m;
        if may_preempt {
            return false;
        }
        let r = &self.st.runs[i];
        // (a memory-only shared request is charged its memory's share once placed, less
        // than the whole GPU `amount` counts before: quota cannot tell before a place)
        let charged_later = matches!(r.shape, Shape::Shared { fraction: None, .. });
        for &t in &r.types {
            let open = charged_later || r.amount() <= self.room(r.project, t) + EPS;
            // (a topology run: the free-count index cannot tell, it might fit)
            // (MIG and shared requests: it cannot tell either)
            if open
                && (r.topology.is_some() || !r.shape.is_whole() || node_sets(m, &self.st.cap, r, t))
            {
                return false;
            }
        }
        true
    }

    /// Try run `i` on each of its types in order: admitted (perhaps with victims), held for
    /// the reservation, or blocked (`cycle._try`). `may_preempt`: `may_preempt(i)` where the
    /// caller asked it in the same state (the trial changes nothing before it reads it).
    pub(super) fn try_run(&mut self, i: usize, may_preempt: Option<bool>) -> Outcome {
        let m = self.m;
        let (mut fits_without_reservation, mut quota_held) = (false, false);
        // (a copy of its types, on the stack when they are few: a trial per queue head and
        // cycle would otherwise allocate one)
        let (mut inline, mut spilled) = ([0usize; 4], Vec::new());
        let own = &self.st.runs[i].types;
        let types: &mut [usize] = if own.len() <= inline.len() {
            inline[..own.len()].copy_from_slice(own);
            &mut inline[..own.len()]
        } else {
            spilled.extend_from_slice(own);
            &mut spilled
        };
        // (not a MIG request's: `cycle._try` orders only the others)
        let reorder = !matches!(self.st.runs[i].shape, Shape::Mig { .. });
        let mut placed_first = if types.len() > 1 && self.st.cap.mix.enabled && reorder {
            // any of several types: headroom, then the placement that fragments least
            let placed: Vec<_> = types.iter().map(|&t| self.place_for(i, t)).collect();
            let holds_gpus = self.st.runs[i].shape != Shape::Cpu;
            let order = order_types(m, &self.st.cap, types, &placed, holds_gpus);
            let mut placed: Vec<_> = placed.into_iter().map(Some).collect();
            let ordered: Vec<usize> = order.iter().map(|&k| types[k]).collect();
            types.copy_from_slice(&ordered);
            order.iter().map(|&k| placed[k].take()).collect()
        } else {
            Vec::new()
        };
        // (per type, the amount quota judged: the reason names it; kept only to explain)
        let mut amounts = Vec::new();
        for (k, &t) in types.iter().enumerate() {
            let r = &self.st.runs[i];
            let ends = r.max_runtime.map(|mr| self.now + mr);
            // (the anchor itself: nothing is held from it; nor, from a borrowing anchor, a
            // run of another project within its own nominal quota)
            let res = self
                .reservation
                .as_ref()
                .filter(|res| res.run != i && !res.exempts(m, self.st, r, t));
            let flt = res.map(|res| (res, ends));
            let placed = match placed_first.get_mut(k) {
                Some(p) => p.take().expect("placed once"),
                None => self.placed(i, t, flt),
            };
            if placed.is_none() && flt.is_some() && !fits_without_reservation {
                fits_without_reservation = self.placed(i, t, None).is_some();
            }
            let amount = placed.as_ref().map_or(r.amount(), |p| p.amount());
            if self.log.is_some() {
                amounts.push(amount);
            }
            if !admits(m, &self.st.cap.used, r.project, t, amount, r.preemptible) {
                continue;
            }
            if let Some(p) = placed {
                let used = self.st.cap.used[m.pt(r.project, t)];
                if res.is_some_and(|res| !res.allows_quota(r.project, t, used + amount, ends)) {
                    quota_held = true;
                    continue;
                }
                self.admit(i, Rc::unwrap_or_clone(p));
                return Outcome::Admitted;
            }
        }
        if (fits_without_reservation || quota_held) && self.reservation.is_some() {
            if let Some(mut log) = self.log.take() {
                log.wait(
                    i,
                    explain::reserved(self, i, fits_without_reservation, types),
                );
                self.log = Some(log);
            }
            return Outcome::Reserved;
        }
        if may_preempt.unwrap_or_else(|| self.may_preempt(i)) && self.preempt(i, types) {
            return Outcome::Admitted; // with its victims
        }
        if let Some(mut log) = self.log.take() {
            log.wait(i, explain::blocked(self, i, types, Some(&amounts)));
            self.log = Some(log);
        }
        Outcome::Blocked
    }

    /// `quota::room`, remembered until the next admission.
    pub fn room(&self, p: usize, t: usize) -> f64 {
        let k = self.m.pt(p, t);
        let stamp = self.stamp();
        let got = self.rooms.borrow()[k];
        if got.0 == stamp {
            return got.1;
        }
        let r = room(self.m, &self.st.cap.used, p, t);
        self.rooms.borrow_mut()[k] = (stamp, r);
        r
    }

    /// Where run `i` fits on `t` now, with the reservation's hold (as `try_run` places it).
    fn place_for(&self, i: usize, t: usize) -> Option<Rc<Placement>> {
        let (m, r) = (self.m, &self.st.runs[i]);
        let ends = r.max_runtime.map(|mr| self.now + mr);
        let res = self
            .reservation
            .as_ref()
            .filter(|res| res.run != i && !res.exempts(m, self.st, r, t));
        self.placed(i, t, res.map(|res| (res, ends)))
    }

    /// `place` of run `i` on `t` with `flt`, found once per request between admissions
    /// (`Placed`); never inside a victim search, whose trials move `cap`.
    pub(crate) fn placed(&self, i: usize, t: usize, flt: Filter<'_>) -> Option<Rc<Placement>> {
        let (m, r) = (self.m, &self.st.runs[i]);
        let held = flt.is_some_and(|(res, ends)| !res.before(ends));
        let k = (r.request as usize * m.n_types + t) * 2 + usize::from(held);
        let stamp = self.stamp();
        let mut seen = self.placed.0.borrow_mut();
        if k >= seen.len() {
            // (every request known now: one allocation a cycle)
            let n = self.st.requests.len().max(r.request as usize + 1) * m.n_types * 2;
            seen.resize(n, (0, None));
        }
        if seen[k].0 != stamp {
            seen[k] = (stamp, place(m, &self.st.cap, r, t, flt).map(Rc::new));
        }
        seen[k].1.clone()
    }
}
