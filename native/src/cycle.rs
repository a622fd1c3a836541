//! One scheduling cycle (`mlops_gpu.core.cycle.schedule`, every queue visited): first the runs
//! within nominal quota, classes from the highest, then the runs that borrow, classes from the
//! highest again (under strict FIFO a project whose head borrows waits, whole, for the second
//! pass); within a class the project with the lowest weighted dominant share takes its
//! next run; within a project
//! its runs in order, each queue judged by its head. A run that fits (respecting the
//! reservation) and its quota admits is admitted; else it may choose victims (`preempt`), and
//! is then admitted at once on the devices they free (one run's trial: `trial`). A queue
//! known to admit nothing (`verdict`) is passed over, or left out as the cycle begins.
//!
//! Invariant: the same decisions as the Python core's cycle on the same state; a cycle
//! changes the state only through `cap` (admissions taken, victims' devices given back,
//! trials undone; its stamps move with them) and the queues' remembered verdicts, and the
//! engine applies its admissions and victims after it.

use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rustc_hash::FxHashSet as HashSet;

mod head;
mod levels;
mod trial;

use crate::backfill::{anchor, overtaken, reserve, Reservation};
use crate::budget::{level, Limit};
use crate::capacity::Placement;
use crate::explain::Log;
use crate::model::Model;
use crate::preempt::{Futile, PoolSeen};
use crate::state::{key_cmp, Key, State};
use head::Head;
use trial::Outcome;

pub(crate) const EPS: f64 = 1e-9;

#[derive(Clone, Copy)]
pub struct Range {
    pub queue: usize,
    pub lo: usize,
    pub hi: usize,
}

/// A project's place in the fair-share heap: lowest first.
struct Turn {
    key: Key,
    project: usize,
}

impl PartialEq for Turn {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Turn {}
impl PartialOrd for Turn {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Turn {
    fn cmp(&self, o: &Self) -> Ordering {
        // reversed: BinaryHeap pops the greatest
        key_cmp(&o.key, &self.key).then(o.project.cmp(&self.project))
    }
}

/// A preemption: (victim, the run admitted in its place, GPU-seconds it loses, the fair shares
/// of the victim's project and the run's when `preempt::borrowers` took it).
pub type Taken = (usize, usize, f64, Option<(f64, f64)>);

pub struct Cycle<'a> {
    pub m: &'a Model,
    pub st: &'a mut State,
    pub now: f64,
    load: Vec<f64>,
    shares: Vec<Option<f64>>,
    pub admissions: Vec<(usize, Placement)>,
    pub preemptions: Vec<Taken>,
    /// The victims chosen this cycle (the state's pools still hold them until it ends).
    pub going: HashSet<usize>,
    pub used_at_start: Vec<f64>,
    pub reservation: Option<Reservation>,
    /// The run the reservation is for (kept for the next cycle unless admitted).
    pub anchor: Option<usize>,
    blocked: Vec<bool>,
    /// Strict FIFO: the projects whose head had to borrow (the borrowing passes serve them).
    deferred: Vec<bool>,
    /// Per project: what its spent budget does this cycle (`budget`).
    limits: Vec<Limit>,
    /// Scratch: GPUs per node (`preempt`), all zero between uses.
    pub freed: RefCell<Vec<usize>>,
    pub touched: RefCell<Vec<usize>>,
    /// `room` per (project, type): (admissions when worked out + 1, room); 0: not yet.
    pub(super) rooms: RefCell<Vec<(usize, f64)>>,
    /// What an explanation reads, kept only in a cycle run to explain (`explain`).
    pub log: Option<Box<Log>>,
    /// Scratch: a turn's range heads (`turn`), kept to spare an allocation per turn.
    heads: Vec<Head>,
    /// Per (project, type): what `victims_possible` read of its pool this cycle, if it did.
    pub pools_seen: RefCell<Vec<Option<PoolSeen>>>,
    /// The victim searches that found no plan since the last admission (`Futile`).
    pub futile: Futile,
    /// The places trials found since the last admission.
    placed: trial::Placed,
    /// Whether queues known blocked as the cycle begins are left out (`verdict`; the engine
    /// asks it, and undoes a cycle that then preempted where one of them may be blocked no
    /// more), and the cycle's number in `Dormancy` where they are (`levels`).
    pub dormancy: bool,
    pub epoch: Option<u64>,
    /// Queues not left out however they are known (`verdict::cycle`'s queues woken).
    pub awake: HashSet<(usize, usize)>,
    /// The queues whose verdict this cycle took (`verdict::remember_blocked`).
    pub judged: Vec<(usize, usize)>,
}

impl<'a> Cycle<'a> {
    /// `limits`: per project, what its spent budget does (empty: no budget is spent).
    pub fn new(
        m: &'a Model,
        st: &'a mut State,
        now: f64,
        history: Option<&[f64]>,
        limits: Vec<Limit>,
    ) -> Self {
        let h = m.policy.half_life_s.max(1.0);
        let load = st
            .cap
            .used
            .iter()
            .enumerate()
            .map(|(k, u)| history.map_or(0.0, |hist| hist[k] / h) + u)
            .collect();
        let used_at_start = st.cap.used.clone();
        st.cap.stamps.cycle_begins(m);
        let n = m.projects.len();
        let mut c = Cycle {
            m,
            st,
            now,
            load,
            shares: vec![None; n],
            admissions: Vec::new(),
            preemptions: Vec::new(),
            going: HashSet::default(),
            used_at_start,
            reservation: None,
            anchor: None,
            blocked: vec![false; n],
            deferred: vec![false; n],
            limits,
            freed: RefCell::new(vec![0; m.nodes.len()]),
            touched: RefCell::new(Vec::new()),
            rooms: RefCell::new(vec![(0, 0.0); n * m.n_types]),
            log: None,
            heads: Vec::new(),
            pools_seen: RefCell::new(vec![None; n * m.n_types]),
            futile: Futile::default(),
            placed: trial::Placed::default(),
            dormancy: false,
            epoch: None,
            awake: HashSet::default(),
            judged: Vec::new(),
        };
        if m.policy.backfill {
            if let Some((run, types)) = anchor(&c) {
                c.anchor = Some(run);
                c.reservation = reserve(c.m, c.st, run, &types, now);
            }
        }
        c
    }

    pub fn run(&mut self) {
        let (n, levels) = (self.m.projects.len(), self.levels());
        // Runs within nominal quota, of every class, before the runs that borrow, of any
        // class (a borrower of a higher class must not take what an owner takes back).
        let mut borrowing: Vec<Vec<Vec<Range>>> = Vec::new();
        for (_, mut ranges) in levels.into_iter().rev() {
            let mut deferred: Vec<Vec<Range>> = vec![Vec::new(); n];
            self.serve(&mut ranges, Some(&mut deferred));
            borrowing.push(deferred);
        }
        for mut deferred in borrowing {
            self.serve(&mut deferred, None);
        }
        // the anchor keeps the reservation next cycle, even if it fits then (`State.anchor`);
        // admitted or none, the oldest run this cycle overtook does
        let admitted = |i: usize| self.admissions.iter().any(|(a, _)| *a == i);
        self.st.anchor = self.anchor.filter(|&i| !admitted(i));
        if self.st.anchor.is_none() && self.m.policy.backfill {
            self.st.anchor = overtaken(self);
        }
    }

    /// The class value project `p`'s runs of `class` are served at, or None when its spent
    /// budget makes them wait (`CycleBooks.level_of`).
    pub fn level(&self, p: usize, class: i64) -> Option<i64> {
        level(self.limits.get(p).copied().unwrap_or(Limit::Free), class)
    }

    /// `level` of run `i`, 0 when it waits (`CycleBooks.level`).
    pub fn level_of_run(&self, i: usize) -> i64 {
        let r = &self.st.runs[i];
        self.level(r.project, r.class).unwrap_or(0)
    }

    fn share(&mut self, p: usize) -> f64 {
        if let Some(s) = self.shares[p] {
            return s;
        }
        let m = self.m;
        let mut best: Option<f64> = None;
        for (t, &c) in m.capacity_by_type.iter().enumerate() {
            if c > 0.0 {
                let x = self.load[m.pt(p, t)] / c;
                if best.is_none_or(|b| x > b) {
                    best = Some(x);
                }
            }
        }
        let s = best.unwrap_or(0.0) / m.projects[p].weight;
        self.shares[p] = Some(s);
        s
    }

    /// Project `p`'s weighted dominant share as it would be with `amount` more of type `t`
    /// held, 0 without fair share (`Shares.share_with`; nothing changes). With `amount` 0 it
    /// is `share` to the last bit (`x + 0.0 == x`).
    pub fn share_with(&self, p: usize, t: usize, amount: f64) -> f64 {
        if !self.m.policy.fair_share {
            return 0.0;
        }
        let m = self.m;
        let mut best: Option<f64> = None;
        for (u, &c) in m.capacity_by_type.iter().enumerate() {
            if c > 0.0 {
                let x = (self.load[m.pt(p, u)] + if u == t { amount } else { 0.0 }) / c;
                if best.is_none_or(|b| x > b) {
                    best = Some(x);
                }
            }
        }
        best.unwrap_or(0.0) / m.projects[p].weight
    }

    fn turn_key(&mut self, p: usize, ranges: &[Range]) -> Key {
        if self.m.policy.fair_share {
            return (0, self.share(p), 0);
        }
        let qs = &self.st.queues[p];
        ranges
            .iter()
            .filter(|rg| rg.lo < rg.hi)
            .map(|rg| self.st.runs[qs[rg.queue].runs[rg.lo]].key)
            .min_by(key_cmp)
            .unwrap_or((0, 0.0, 0))
    }

    fn serve(&mut self, ranges: &mut [Vec<Range>], mut defer: Option<&mut Vec<Vec<Range>>>) {
        let mut heap = BinaryHeap::new();
        for (p, rs) in ranges.iter().enumerate() {
            if !rs.is_empty() {
                heap.push(Turn {
                    key: self.turn_key(p, rs),
                    project: p,
                });
            }
        }
        while let Some(Turn { project, .. }) = heap.pop() {
            if self.turn(project, &mut ranges[project], defer.as_deref_mut()) {
                heap.push(Turn {
                    key: self.turn_key(project, &ranges[project]),
                    project,
                });
            }
        }
    }

    /// The project's next run that can start: true once one is admitted, false when none can.
    fn turn(
        &mut self,
        p: usize,
        ranges: &mut [Range],
        defer: Option<&mut Vec<Vec<Range>>>,
    ) -> bool {
        if self.blocked[p] {
            if let Some(log) = self.log.as_mut() {
                log.hold_behind(p, None, ranges, usize::MAX);
            }
            ranges.iter_mut().for_each(|rg| rg.lo = rg.hi);
            return false;
        }
        // Each non-empty range's head, read once and sorted, the next to serve last: a pass
        // below moves one range (or empties several and ends the turn), so the others' heads
        // are not read again from the runs (each read is a cache miss at 50,000 runs), and the
        // next run is the last head rather than a scan of every range (a project has a queue
        // per shape and type).
        let mut heads = std::mem::take(&mut self.heads);
        heads.clear();
        for (k, rg) in ranges.iter().enumerate() {
            if rg.lo < rg.hi {
                let (run, key) = self.head(p, rg);
                heads.push(Head::new(key, k, run));
            }
        }
        heads.sort_unstable_by_key(|h| std::cmp::Reverse(h.order)); // (the last first)
        let admitted = self.turn_over(p, ranges, defer, &mut heads);
        self.heads = heads;
        admitted
    }

    /// `turn` over the ranges' heads (`heads`: one per non-empty range, the next to serve
    /// last).
    fn turn_over(
        &mut self,
        p: usize,
        ranges: &mut [Range],
        mut defer: Option<&mut Vec<Vec<Range>>>,
        heads: &mut Vec<Head>,
    ) -> bool {
        let strict = self.m.policy.strict_fifo;
        loop {
            let Some(head) = heads.pop() else {
                return false;
            };
            let (b, run) = (head.range(), head.run);
            if let Some(defer) = defer.as_deref_mut() {
                if self.deferred[p] || self.must_borrow(run) {
                    if strict {
                        // its later runs, of lower classes too, wait behind the borrower
                        for r2 in ranges.iter_mut().filter(|r2| r2.lo < r2.hi) {
                            defer[p].push(*r2);
                            r2.lo = r2.hi;
                        }
                        self.deferred[p] = true;
                        return false;
                    }
                    defer[p].push(ranges[b]);
                    ranges[b].lo = ranges[b].hi;
                    continue;
                }
            }
            if self.known_blocked(p, ranges[b].queue) {
                ranges[b].lo = ranges[b].hi; // (`verdict`: its queue admits nothing)
                continue;
            }
            // (asked once: `surely_blocked` and the trial read it in the same state)
            let may_preempt = (!strict).then(|| self.may_preempt(run));
            if may_preempt.is_some_and(|v| self.surely_blocked(run, v)) {
                self.remember_blocked(run, false, ranges[b]); // (`may_preempt` is false)
                if let Some(log) = self.log.as_mut() {
                    let rg = &ranges[b];
                    log.lazy(run, (p, rg.queue, rg.lo + 1, rg.hi));
                }
                ranges[b].lo = ranges[b].hi;
                continue;
            }
            let outcome = self.try_run(run, may_preempt);
            if let Some(v) = may_preempt.filter(|_| outcome != Outcome::Admitted) {
                self.remember_blocked(run, v, ranges[b]);
            }
            let rg = &mut ranges[b];
            if outcome == Outcome::Admitted {
                if let Some(log) = self.log.as_mut() {
                    log.met(run, None);
                }
                rg.lo += 1;
                return true;
            }
            if strict && !self.held_for_own(&outcome, p) {
                if let Some(log) = self.log.as_mut() {
                    log.met(run, None);
                    log.hold_behind(p, Some(run), ranges, b);
                }
                self.blocked[p] = true;
                ranges.iter_mut().for_each(|rg| rg.lo = rg.hi);
                return false;
            }
            match outcome {
                Outcome::Blocked | Outcome::Admitted => {
                    if let Some(log) = self.log.as_mut() {
                        log.met(run, Some((p, rg.queue, rg.lo + 1, rg.hi)));
                    }
                    rg.lo = rg.hi
                }
                Outcome::Reserved => {
                    // identical runs behind it differ only in max_runtime: try the first that
                    // would end before the reservation, or the anchor itself
                    let res = self.reservation.as_ref().expect("reserved");
                    let latest = res.at - self.now; // (infinite when unknown: none ends before)
                    let q = &self.st.queues[p][rg.queue].runs;
                    let mut j = rg.lo + 1;
                    while j < rg.hi {
                        if q[j] == res.run
                            || (latest.is_finite()
                                && self.st.runs[q[j]]
                                    .max_runtime
                                    .is_some_and(|mr| mr <= latest))
                        {
                            break;
                        }
                        j += 1;
                    }
                    if let Some(log) = self.log.as_mut() {
                        log.met(run, Some((p, rg.queue, rg.lo + 1, j)));
                    }
                    rg.lo = j;
                    if j < rg.hi {
                        // its new head, in order among the others
                        let (run, key) = self.head(p, &ranges[b]);
                        let h = Head::new(key, b, run);
                        let at = heads.partition_point(|x| x.order > h.order);
                        heads.insert(at, h);
                    }
                }
            }
        }
    }

    /// Strict FIFO: a run that waits only for the reservation of an older run of its own
    /// project does not block the project (`cycle._held_for_own`).
    fn held_for_own(&self, outcome: &Outcome, p: usize) -> bool {
        *outcome == Outcome::Reserved
            && self
                .reservation
                .as_ref()
                .is_some_and(|res| self.st.runs[res.run].project == p)
    }

    fn head(&self, p: usize, rg: &Range) -> (usize, Key) {
        let i = self.st.queues[p][rg.queue].runs[rg.lo];
        (i, self.st.runs[i].key)
    }

    /// The memos' stamp (`room`, `trial::Placed`, `preempt::Futile`; 0: never): between two
    /// trials only an admission changes `cap`, the usage and the victims chosen.
    pub fn stamp(&self) -> usize {
        self.admissions.len() + 1
    }

    pub fn admit(&mut self, i: usize, p: Placement) {
        if self.reservation.as_ref().is_some_and(|res| res.run == i) {
            self.reservation = None; // it started: nothing more to hold for it
        }
        let project = self.st.runs[i].project;
        self.st.cap.take(self.m, project, &p);
        self.load[self.m.pt(project, p.ty)] += p.amount();
        self.shares[project] = None;
        self.admissions.push((i, p));
    }

    /// A victim gives its devices, quota and fair-share load back at once.
    pub fn evict(&mut self, v: usize) {
        let (m, st) = (self.m, &mut *self.st);
        let r = &st.runs[v];
        let p = r.placement.as_ref().expect("an active run");
        st.cap.release(m, r.project, p);
        self.load[m.pt(r.project, p.ty)] -= p.amount();
        self.shares[r.project] = None;
    }
}
