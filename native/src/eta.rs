//! Estimated start times of pending runs (`mlops_gpu.core.backfill.EtaBook` and `quota_eta`).
//!
//! Per GPU type, a profile of GPUs over time: those free now, then the (end, GPUs) releases of
//! the active runs with a known end (start + max_runtime); runs without one hold their GPUs
//! for good. Runs are booked in the order the cycle met them: each takes its need from the
//! earliest point its type's profile covers it, and with a max_runtime gives it back that long
//! after. A run waiting for quota waits, besides, until the runs holding that quota (its
//! project's, or its cohort tree's where the tree lends without limits) have released enough.
//!
//! Invariant: the same arithmetic, in the same order, as the Python core, so the ETAs are equal
//! to the bit (every GPU amount is a whole number; ends are sums of the same two floats).

use crate::cycle::Cycle;
use crate::model::Model;
use crate::state::State;

const EPS: f64 = 1e-9;

/// Why a run has no ETA (`None`: it has one, or its reason takes no suffix).
#[derive(Clone, Debug, PartialEq)]
pub enum NoEta {
    /// `no ETA: {gpus} GPUs are held by runs without max_runtime`
    HeldUnknown(f64),
    /// `no ETA: not enough GPUs of this type will free up`
    NotEnough,
    /// `no ETA: it waits for quota its cohort lends`
    CohortLends,
    /// `no ETA: {project}'s (or the cohort's) running runs that hold its quota have no
    /// max_runtime`: the project, or None for the cohort.
    QuotaUnknown(Option<usize>),
    /// `no ETA` (no type to wait on)
    Plain,
    /// The anchor's reservation at an unknown time: the runs without max_runtime it waits for
    /// (the first ten by id) and how many there are.
    Reserved(Vec<String>, usize),
}

/// The expected end of active run `i` (`backfill.expected_end`).
pub fn expected_end(st: &State, i: usize, now: f64) -> Option<f64> {
    let r = &st.runs[i];
    let mr = r.max_runtime?;
    Some(match r.start() {
        None => now + mr,
        Some(s) => (s + mr).max(now),
    })
}

/// Whether run `i` holds GPUs as cycle `c` ends: active before it, not being preempted, not
/// one of its victims (its admissions are read from `c.admissions`).
pub fn holds(c: &Cycle, i: usize) -> bool {
    let r = &c.st.runs[i];
    r.placement.is_some() && !r.going && !c.going.contains(&i)
}

/// GPUs of one type over time (`backfill._TypeProfile`).
struct Profile {
    free: f64,
    at: f64,
    ends: Vec<(f64, f64)>,
    i: usize,
    unknown: f64,
}

impl Profile {
    fn eta(&self, need: f64) -> Option<(f64, usize, f64)> {
        let (mut free, mut at, mut i) = (self.free, self.at, self.i);
        while free < need - EPS {
            if i == self.ends.len() {
                return None;
            }
            let (when, got) = self.ends[i];
            at = when;
            free += got;
            i += 1;
        }
        Some((at, i, free))
    }

    fn book(&mut self, found: (f64, usize, f64), need: f64, runtime: Option<f64>) {
        (self.at, self.i, self.free) = (found.0, found.1, found.2 - need);
        if let Some(rt) = runtime {
            let item = (found.0 + rt, need);
            let k = self.ends.partition_point(|x| tuple_le(x, &item));
            self.ends.insert(k, item);
        }
    }
}

fn tuple_le(a: &(f64, f64), b: &(f64, f64)) -> bool {
    a.0 < b.0 || (a.0 == b.0 && a.1 <= b.1)
}

fn sort_pairs(v: &mut [(f64, f64)]) {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
}

/// Estimated start times for pending runs booked in scheduling order (`backfill.EtaBook`).
pub struct EtaBook {
    profiles: Vec<Option<Profile>>,
}

impl EtaBook {
    /// The profiles as cycle `c` leaves the cluster: its admissions hold GPUs from now on.
    pub fn new(c: &Cycle) -> EtaBook {
        let (m, st, now) = (c.m, &*c.st, c.now);
        let n = m.n_types;
        let mut releases: Vec<Vec<(f64, f64)>> = vec![Vec::new(); n];
        let mut unknown = vec![0.0f64; n];
        // (the GPUs held without an end are summed in the order the runs came to hold them,
        // then the cycle's admissions, as `EtaBook.__init__` adds the snapshot's active runs
        // then the admitted: MIG and shared amounts are fractions, and float sums depend on
        // their order)
        let mut held_unknown: Vec<(u64, usize, f64)> = Vec::new();
        for held in &st.held {
            for &i in held {
                if holds(c, i) {
                    let p = st.runs[i].placement.as_ref().expect("active");
                    match expected_end(st, i, now) {
                        None => held_unknown.push((st.runs[i].activated, p.ty, p.amount())),
                        Some(e) => releases[p.ty].push((e, p.amount())),
                    }
                }
            }
        }
        held_unknown.sort_unstable_by_key(|x| x.0);
        for (_, ty, amount) in held_unknown {
            unknown[ty] += amount;
        }
        for (i, p) in &c.admissions {
            match st.runs[*i].max_runtime {
                None => unknown[p.ty] += p.amount(),
                Some(mr) => releases[p.ty].push((now + mr, p.amount())),
            }
        }
        let mut free = vec![0.0f64; n];
        let mut has_free = vec![false; n];
        for (k, node) in m.nodes.iter().enumerate() {
            if node.schedulable {
                free[node.ty] += st.cap.free[k].len() as f64;
                has_free[node.ty] = true;
            }
        }
        let profiles = (0..n)
            .map(|t| {
                // (a type with releases only, e.g. all its nodes cordoned, has a profile)
                (has_free[t] || !releases[t].is_empty()).then(|| {
                    let mut ends = std::mem::take(&mut releases[t]);
                    sort_pairs(&mut ends);
                    Profile {
                        free: free[t],
                        at: now,
                        ends,
                        i: 0,
                        unknown: unknown[t],
                    }
                })
            })
            .collect();
        EtaBook { profiles }
    }

    /// The ETA of a run needing `need` GPUs of any of `types` for `runtime`, queued behind the
    /// runs booked before it; or why there is none (`EtaBook.book`).
    pub fn book(&mut self, types: &[usize], need: f64, runtime: Option<f64>) -> Result<f64, NoEta> {
        let mut best: Option<((f64, usize, f64), usize)> = None;
        let mut held_unknown = 0.0;
        for &t in types {
            let Some(prof) = self.profiles[t].as_ref() else {
                continue;
            };
            let found = prof.eta(need);
            held_unknown += prof.unknown;
            if let Some(f) = found {
                if best.is_none_or(|b| f.0 < b.0 .0) {
                    best = Some((f, t));
                }
            }
        }
        let Some((found, t)) = best else {
            // still queue it, so runs behind it are not estimated too early
            if let Some(&t) = types.iter().find(|&&t| self.profiles[t].is_some()) {
                self.profiles[t].as_mut().expect("found").free -= need;
            }
            return Err(if held_unknown != 0.0 {
                NoEta::HeldUnknown(held_unknown)
            } else {
                NoEta::NotEnough
            });
        };
        self.profiles[t]
            .as_mut()
            .expect("found")
            .book(found, need, runtime);
        Ok(found.0)
    }
}

/// Whose runs hold the quota a run of a project waits for on a type, and when they free it
/// (`cycle_explain._quota_term`): the holders (one project, or a cohort tree's members), their usage,
/// the limit (None: unknown), their runs' known ends and the GPUs released by each in turn.
pub struct QuotaTerm {
    pub single: Option<usize>,
    pub used: f64,
    pub limit: Option<f64>,
    pub ends: Vec<(f64, f64)>,
    pub cum: Vec<f64>,
}

/// `cycle_explain._quota_term` for `project` on `t` (a run that is `preemptible` or not).
pub fn quota_term(c: &Cycle, project: usize, t: usize, preemptible: bool) -> QuotaTerm {
    let m: &Model = c.m;
    let q = m.term(project, t);
    let mut limit = q.borrowing.map(|b| q.nominal + b);
    let mut holders: Vec<usize> = vec![project];
    match m.projects[project].root {
        Some(root) if preemptible => {
            let members = &m.members[root];
            if limit.is_none() && members.iter().all(|&k| m.term(k, t).lending.is_none()) {
                // without lending limits a borrower is admitted once the tree's members hold
                // no more than their nominal quotas together (`QuotaBook.admits`)
                holders = members.clone();
                limit = Some(holders.iter().map(|&k| m.term(k, t).nominal).sum());
            }
        }
        _ => limit = Some(q.nominal),
    }
    let used = holders
        .iter()
        .map(|&k| c.st.cap.used[m.pt(k, t)])
        .sum::<f64>();
    let mut ends: Vec<(f64, f64)> = Vec::new();
    for &k in &holders {
        for &i in &c.st.held[m.pt(k, t)] {
            if holds(c, i) {
                if let Some(e) = expected_end(c.st, i, c.now) {
                    let p = c.st.runs[i].placement.as_ref().expect("active");
                    ends.push((e, p.amount()));
                }
            }
        }
    }
    for (i, p) in &c.admissions {
        let r = &c.st.runs[*i];
        if p.ty == t && holders.contains(&r.project) {
            if let Some(mr) = r.max_runtime {
                ends.push((c.now + mr, p.amount()));
            }
        }
    }
    sort_pairs(&mut ends);
    let mut cum = Vec::with_capacity(ends.len());
    let mut s = 0.0;
    for &(_, a) in &ends {
        s += a;
        cum.push(s);
    }
    QuotaTerm {
        single: (holders.len() == 1).then_some(holders[0]),
        used,
        limit,
        ends,
        cum,
    }
}

/// When the holders will have released enough of the quota for `need` more
/// (`backfill.quota_eta`).
pub fn quota_eta(term: &QuotaTerm, need: f64, now: f64) -> Result<f64, NoEta> {
    let Some(limit) = term.limit else {
        return Err(NoEta::CohortLends);
    };
    let short = term.used + need - limit;
    if short <= EPS {
        return Ok(now);
    }
    let i = term.cum.partition_point(|&x| x < short - EPS);
    match term.ends.get(i) {
        Some(&(end, _)) => Ok(end),
        None => Err(NoEta::QuotaUnknown(term.single)),
    }
}
