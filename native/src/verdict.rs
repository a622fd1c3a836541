//! A queue found to admit nothing, known so across cycles until something it depends on may
//! have changed (`Stamps`, kept by `Capacity`): the rich set-up's 4,496 queues are judged
//! every cycle, and nearly all of them blocked again for the same reason as the cycle before.
//!
//! What is remembered (`state::Queue::blocked`, for the queue's first run, reset when another
//! run heads it): the stamp at which the head (whole GPUs, MIG slices, or a fraction of a
//! shared device: a charge known before a place) was judged and not admitted while, on each
//! type it accepts, quota refused its amount or no node set could take it even with no
//! reservation (which of the two, per type); and no active run could be its victim
//! (`victims_possible` false), or its victim search found no plan without a hold and with no
//! same-class candidate (`preempt::Futile` knows it: no fit with every candidate gone).
//! Then no run of its queue could be admitted in that state: they share its request (project,
//! class, types, GPUs, nodes, host, topology, preemptibility: `state::QueueKey`), so quota
//! and placement refuse them alike, and a later run of the queue has no more possible victims
//! than its head (under `shortest` a longer or unknown max_runtime is outlasted by fewer runs;
//! a queue's runs share their LAS level).
//!
//! Invariants (what makes it exact):
//! - `quota::admits` is monotone: more usage in the cohort tree never admits more, so a
//!   refusal holds until members' usage of that type falls by what it lacked
//!   (`quota::lack`: by the project itself, to fit its nominal quota or borrowing limit; in
//!   the tree, for it to lend enough, as a give-back of x moves what the tree lends less what
//!   it borrows by at most x); every fall goes through `Capacity::release`, which counts it
//!   for the project and each member of its tree on that type (`tree_back`, `own_back`);
//!   over its nominal quota (not refused), what it lacks to be within it is kept alike;
//! - a whole-GPU run that finds no place on `t` finds none while no node of `t` gets back
//!   anything with at least its GPUs free after (a take only removes; a node left with fewer
//!   free GPUs than the run asks per node cannot host it, whatever its host resources):
//!   `Capacity::release` stamps `cap_back[t][g]` for every g up to the node's free GPUs;
//! - a MIG or shared run that finds no place on `t` finds none while no node of `t` with MIG
//!   slices (shared devices) gets anything back (only those serve it): `Capacity::release`
//!   stamps that too;
//! - `victims_possible` reads the project's own pool of each type (stamped in `pool_grew`
//!   when a run joins it or one of its runs reports its first checkpoint: a run leaving, or
//!   the clock, only takes possible victims away, as under `shortest` a same-class run's time
//!   to go only shrinks) and, within nominal quota only (so not on a type quota refused),
//!   the other members' pools where they borrowed as the cycle began (stamped in `lent`
//!   for the whole tree as the next cycle begins, when a member took more above its nominal
//!   quota: a run joins a pool only after its own take);
//!   the borrower rule (`shortest_preempt_borrowers`) keeps nothing here;
//! - a search that found no plan stays so while no candidate joins (`pool_grew`, `lent`), no
//!   quota comes back and nothing at all is given back on the type (`cap_back[t][0]`: a node
//!   given back fewer GPUs than the run needs may reach it with a candidate's);
//! - neither the reservation, the fair shares nor the budgets enter: a reservation only
//!   removes places, the others decide order and levels, never whether a run can start;
//! - stamps come from one counter that only grows (`Capacity` starts it at 1): a verdict
//!   holds while every stamp it read is at most its own;
//! - a victim search's trials give runs back and take them again before the search ends
//!   (`Capacity::release_for_trial`, `retake`): the state is then as before, so they stamp
//!   nothing (no verdict is read or taken meanwhile);
//! - none is remembered or used in a cycle that explains (its reasons are wanted, and its
//!   `Capacity` is put back after, with the stamps handed out meanwhile), under strict FIFO
//!   (a blocked head blocks its project), or for a memory-only shared run (charged its
//!   memory's share once placed).
//!
//! Where it is used: a queue head known blocked is passed over when its turn meets it
//! (`Cycle::turn_over`); and under fair share (a project's turn then does not depend on its
//! queues' heads) a cycle leaves out, as it begins, the queues known blocked then: those
//! asleep (`Dormancy`: each wakes as a stamp its verdict reads moves, so a cycle does not ask
//! every queue), and those awake found so (put to sleep; `cycle::levels`). A cycle's
//! admissions only take, so they stay blocked, unless a victim gives GPUs back. A cycle that
//! left some out, preempted, and ends with one of those known blocked no more is undone and
//! run again with those in (`cycle`).

use rustc_hash::FxHashSet as HashSet;

use crate::budget::Limit;
use crate::capacity::Placement;
use crate::cycle::{Cycle, Range, Taken};
use crate::model::Model;
use crate::parts::Shape;
use crate::placement::node_sets;
use crate::quota::{self, admits, within_nominal};
use crate::state::State;

mod stamps;

pub use stamps::Stamps;
use stamps::{Lack, MIG_NODE, SHARED_NODE};

/// The most types a remembered verdict covers.
const TYPES: usize = 4;

/// A verdict: the stamp it was taken at and, per type of the run (a bit each, in its order),
/// whether quota refused it there (else no node set could take it), and what quota lacked
/// there: over its nominal quota, the tree's borrowers were no victims of it, as they
/// become once its usage falls.
#[derive(Clone, Copy, Default)]
pub struct Blocked {
    at: u64,
    refused: u8,
    lack: [Lack; TYPES],
    /// Its victim search found no plan (else no run could be its victim).
    searched: bool,
    /// Where no node set could take it: the free GPUs a node must be left with by a
    /// give-back for that to change (its GPUs per node), or, for MIG slices and shared
    /// devices, a give-back on a node with slices or on a shared node (`MIG_NODE`,
    /// `SHARED_NODE`, past the GPU counts).
    need: u16,
}

/// A cycle at `now` that leaves out the queues known blocked as it begins (those asleep, and
/// those awake found so: `Dormancy`), deciding as one over every queue would (`Cycle::new`'s
/// arguments; the state is left for the engine to apply its admissions and victims).
///
/// A cycle that preempted and ends with some queue it left out known blocked no more (a
/// victim gave back what it waited for: the stamp it watched woke it) is undone: its
/// admissions and victims (`undo`), the stamps, the anchor and the verdicts it took are put
/// back as they were as it began; and it runs again with those queues in. Where every queue
/// left out is still known blocked as a run ends, one over every queue would have passed each
/// over at its turn (a verdict that holds at the end held all along: stamps only grow),
/// deciding alike.
pub fn cycle(
    m: &Model,
    st: &mut State,
    now: f64,
    history: Option<&[f64]>,
    limits: &[Limit],
) -> (Vec<(usize, Placement)>, Vec<Taken>) {
    // (who borrowed is stamped before the snapshot, so a rerun does not stamp it again:
    // `Cycle::new`'s call, for cycles run alone, then finds nothing to stamp)
    st.cap.stamps.cycle_begins(m);
    settle(m, st); // (what moved since the last cycle wakes its watchers)
    let (anchor, stamps) = (st.anchor, st.cap.stamps.clone());
    let mut awake = HashSet::default();
    loop {
        let mut c = Cycle::new(m, st, now, history, limits.to_vec());
        c.dormancy = true;
        c.awake = std::mem::take(&mut awake);
        c.run();
        let admissions = std::mem::take(&mut c.admissions);
        let preemptions = std::mem::take(&mut c.preemptions);
        let woke = match c.epoch.filter(|_| !preemptions.is_empty()) {
            Some(epoch) => c.woke(epoch),
            None => Vec::new(),
        };
        if woke.is_empty() {
            return (admissions, preemptions);
        }
        let judged = std::mem::take(&mut c.judged);
        awake = std::mem::take(&mut c.awake);
        drop(c);
        undo(m, st, &admissions, &preemptions);
        for (p, j) in judged {
            let q = &mut st.queues[p][j];
            q.blocked = Blocked::default();
            st.dormancy.stir(q.slot);
        }
        st.cap.stamps = stamps.clone();
        st.anchor = anchor;
        awake.extend(woke);
    }
}

/// Undo a cycle's admissions and preemptions in `cap`, the latest first (each admission's
/// victims gave their devices back just before it took its own).
pub fn undo(m: &Model, st: &mut State, admissions: &[(usize, Placement)], taken: &[Taken]) {
    for (i, p) in admissions.iter().rev() {
        st.cap.release(m, st.runs[*i].project, p);
        for &(v, _, _, _) in taken.iter().rev().filter(|t| t.1 == *i) {
            let r = &st.runs[v];
            st.cap
                .take(m, r.project, r.placement.as_ref().expect("an active run"));
        }
    }
}

/// Wake the queues watching what moved since the last call (`Stamps::moved`): the slots
/// woken, with the tag each fell asleep at (`Dormancy::wake`).
pub fn settle(m: &Model, st: &mut State) -> Vec<(u32, u64)> {
    let stamps = &mut st.cap.stamps;
    let mut moved = std::mem::take(&mut stamps.moved);
    let back = |pt: usize| (stamps.tree_back[pt], stamps.own_back[pt]);
    let woken = st.dormancy.wake(m, &mut moved, back);
    st.cap.stamps.moved = moved; // (empty: its allocation kept)
    woken
}

/// Tag of a queue put to sleep as cycle `epoch` begins (left out), or in it (`Dormancy`).
pub fn tag(epoch: u64, in_cycle: bool) -> u64 {
    2 * epoch + u64::from(in_cycle)
}

impl Cycle<'_> {
    /// The queues this cycle (`epoch`) left out that are known blocked no more, woken by what
    /// moved in it.
    fn woke(&mut self, epoch: u64) -> Vec<(usize, usize)> {
        let woken = settle(self.m, self.st);
        let mut out = Vec::new();
        for (s, slept) in woken {
            let (p, j) = self.st.dormancy.place(s);
            let class = self.st.queues[p][j].key.class;
            if slept <= tag(epoch, false)
                && self.level(p, class).is_some()
                && !self.known_blocked(p, j)
            {
                out.push((p, j));
            }
        }
        out
    }

    /// Queue `j` of project `p`, known blocked, falls asleep at `tag`.
    pub(crate) fn sleep(&mut self, p: usize, j: usize, tag: u64) {
        let st = &mut *self.st;
        let q = &st.queues[p][j];
        let d = &mut st.dormancy;
        st.cap
            .stamps
            .watches(self.m, (p, q.key.class), &q.types, &q.blocked, |on| {
                d.watch(on)
            });
        d.sleep(q.slot, tag);
    }

    /// Whether queue `j` of project `p` is known to admit nothing (from its head on).
    pub(crate) fn known_blocked(&self, p: usize, j: usize) -> bool {
        let q = &self.st.queues[p][j];
        q.blocked.at != 0
            && self.log.is_none()
            && self
                .st
                .cap
                .stamps
                .unchanged(self.m, p, &q.types, &q.blocked)
    }

    /// Run `i`, a queue head, was judged and not admitted (`may_preempt`: whether it may have
    /// had victims): remember it where, on each type, quota refused it or no node set could
    /// take it, and no run could be its victim or its search found no plan with no hold and
    /// no same-class candidate (whose number moves with the clock).
    /// `rg`: the range of its queue it headed (remembered only for the queue's first run).
    pub(crate) fn remember_blocked(&mut self, i: usize, may_preempt: bool, rg: Range) {
        if self.log.is_some() || self.borrowers_on() || rg.lo != 0 {
            return;
        }
        let (m, r) = (self.m, &self.st.runs[i]);
        let width = self.st.cap.stamps.width;
        let need = match r.shape {
            Shape::Whole => r.gpus.min(width - 1) as u16,
            Shape::Mig { .. } => (width + MIG_NODE) as u16,
            Shape::Shared {
                fraction: Some(_), ..
            } => (width + SHARED_NODE) as u16,
            // (charged its memory's share once placed, not `amount`)
            Shape::Shared { fraction: None, .. } | Shape::Cpu => return,
        };
        if r.types.len() > TYPES {
            return;
        }
        let searched = may_preempt;
        let none = |&t: &usize| self.no_plan_unheld(i, t) && !self.peers_possible(i, t);
        if searched && !r.types.iter().all(none) {
            return;
        }
        let (cap, amount) = (&self.st.cap, r.amount());
        let (mut refused, mut lack) = (0u8, [Lack::default(); TYPES]);
        for (k, &t) in r.types.iter().enumerate() {
            let (s, pt, used) = (&cap.stamps, m.pt(r.project, t), &cap.used);
            let admitted = admits(m, used, r.project, t, amount, r.preemptible);
            if admitted
                && (!r.shape.is_whole() || node_sets(m, cap, r, t))
                && self.placed(i, t, None).is_some()
            {
                return; // it might fit
            }
            lack[k] = if searched {
                Lack::any(s, pt)
            } else if !admitted {
                refused |= 1 << k;
                Lack::new(
                    s,
                    pt,
                    quota::lack(m, used, r.project, t, amount, r.preemptible),
                )
            } else if !within_nominal(m, used, r.project, t, amount) {
                // (the tree's borrowers become its possible victims once it is within)
                let own = quota::lack(m, used, r.project, t, amount, false).0;
                Lack::new(s, pt, (own, f64::INFINITY))
            } else {
                Lack::default()
            };
        }
        let (at, p) = (cap.stamps.clock, r.project);
        self.judged.push((p, rg.queue));
        self.st.queues[p][rg.queue].blocked = Blocked {
            at,
            refused,
            lack,
            searched,
            need,
        };
        if let Some(epoch) = self.epoch {
            self.sleep(p, rg.queue, tag(epoch, true));
        }
    }
}
