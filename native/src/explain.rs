//! Why each pending run waits (`mlops_gpu.core.cycle_explain.explain`): a reason code with its
//! parameters, and an estimated start time (`eta`), for every run a cycle met and did not
//! admit. The sentences are rendered in Python from the codes and parameters
//! (`mlops_gpu/core/reason_text.py`), one table for both engines.
//!
//! A cycle run for an explanation keeps a `Log`: the runs in the order it met them, each with
//! the range of its queue that shares its reason (its followers); the runs it judged surely
//! blocked without trying them (`lazy`: their reason is worked out at the end of the cycle, as
//! `cycle_explain._diagnose`); under strict FIFO the ranges held behind a blocked head. A reason is
//! worked out when its run is judged (quota usage, free blocks and borrowers are those of that
//! moment), and the ETAs once the cycle has ended, in the order met (`eta::EtaBook`).
//!
//! Invariant: the same reasons, parameters and ETAs as the Python core's cycle on the same state
//! (`tests/test_native_core.py` compares them at every cycle of random workloads).

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::backfill::{ever_fits, Reservation};
use crate::cycle::{Cycle, Range};
use crate::eta::{expected_end, holds, quota_eta, quota_term, EtaBook, NoEta, QuotaTerm};
use crate::quota::{admits, cohort_sums, within_nominal};
use crate::state::key_cmp;

const EPS: f64 = 1e-9;
/// At most this many runs are named per borrower and kind (`lent.SHOWN`).
const SHOWN: usize = 5;
/// At most this many runs are named in an unknown reservation's wait (`Cycle._unknown_why`).
const SHOWN_UNKNOWN: usize = 10;

/// Why a run is over quota on one type (`QuotaBook.problem`): `kind` is `limit` (nominal plus
/// borrowing limit reached; `value`: its usage), `alone` (no cohort; usage), `nominal` (not
/// preemptible: nominal only; usage) or `cohort` (`value`: what the cohort has idle to lend);
/// `amount`: what the run would add (its placement's share where it was placed on the type,
/// else its request's: `cycle._try`).
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaProblem {
    pub gpu_type: usize,
    pub kind: &'static str,
    pub value: f64,
    pub amount: f64,
}

/// A cohort member borrowing a type a waiting run's project lends (`QuotaBook.borrowers`);
/// with `lent`, the runs through which it borrows (`lent.Held`): the first `SHOWN` by id of
/// those that are preemptible and of those that are not, with their expected ends, and how
/// many there are of each.
#[derive(Clone, Debug, PartialEq)]
pub struct Borrower {
    pub gpu_type: usize,
    pub project: usize,
    pub amount: f64,
    pub reclaimable: Vec<(String, Option<f64>)>,
    pub n_reclaimable: usize,
    pub fixed: Vec<(String, Option<f64>)>,
    pub n_fixed: usize,
}

/// A reason code and its parameters; which fields a code reads:
/// - `unschedulable`: `subject`, `types`;
/// - `quota`: `subject`, `types`, `quota`;
/// - `no_capacity`: `subject`, `types`, `blocks`, `borrowers`, `lent`;
/// - `reserved`: `subject`, `types`, `gpus_held` (else quota held: `res_project`,
///   `res_type`), `anchor`, `at`;
/// - `queued_behind`: `anchor` (the blocked head), `res_project` (its project).
///
/// `subject` is the run whose request the sentence describes (every run sharing the reason
/// has the same request).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Reason {
    pub code: &'static str,
    pub subject: String,
    pub types: Vec<usize>,
    pub quota: Vec<QuotaProblem>,
    pub blocks: Vec<(usize, usize)>,
    pub borrowers: Vec<Borrower>,
    pub lent: bool,
    pub gpus_held: bool,
    pub anchor: String,
    pub at: f64,
    pub res_project: usize,
    pub res_type: usize,
}

/// One pending run's explanation: its reason (an index into `Explanation::reasons`), its ETA,
/// and, without one, why (an index into `Explanation::no_eta`; None: the reason says it all).
#[derive(Clone, Debug, PartialEq)]
pub struct Pending {
    pub run_id: String,
    pub reason: usize,
    pub eta: Option<f64>,
    pub no_eta: Option<usize>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Explanation {
    pub reasons: Vec<Reason>,
    pub no_eta: Vec<NoEta>,
    pub pending: Vec<Pending>,
}

/// (project, queue, start, end): a range of a project's queue.
type Span = (usize, usize, usize, usize);

/// What a cycle records for its explanation (see the module docstring).
#[derive(Default)]
pub struct Log {
    met: Vec<(usize, Option<Span>)>,
    lazy: HashSet<usize>,
    reasons: HashMap<usize, Reason>,
    /// strict FIFO: (project, blocked head, queue, start, end)
    behind: Vec<(usize, usize, usize, usize, usize)>,
    heads: HashMap<usize, usize>,
}

impl Log {
    /// Run `i` was judged; `follow`: the rest of its queue that shares its reason.
    pub fn met(&mut self, i: usize, follow: Option<Span>) {
        self.met.push((i, follow));
    }

    /// Run `i` was judged surely blocked without a try (its reason waits for the end).
    pub fn lazy(&mut self, i: usize, follow: Span) {
        self.lazy.insert(i);
        self.met.push((i, Some(follow)));
    }

    /// Strict FIFO: `head` of project `p` is blocked; `ranges` (with `skip`, the head's range,
    /// starting after it) wait behind it. With `head` None, the head blocked earlier.
    pub fn hold_behind(&mut self, p: usize, head: Option<usize>, ranges: &[Range], skip: usize) {
        let head = match head {
            Some(h) => {
                self.heads.insert(p, h);
                h
            }
            None => self.heads[&p],
        };
        for (k, rg) in ranges.iter().enumerate() {
            let start = rg.lo + usize::from(k == skip);
            if start < rg.hi {
                self.behind.push((p, head, rg.queue, start, rg.hi));
            }
        }
    }

    pub fn wait(&mut self, i: usize, reason: Reason) {
        self.reasons.insert(i, reason);
    }
}

/// The reason of a run found blocked now (`cycle._try`'s end, `cycle_explain._diagnose`): over quota
/// on every type, else waiting for capacity. `types`: the run's types in the order they were
/// tried (`cycle._try` orders several by headroom and fragmentation; the sentence names them
/// so).
pub fn blocked(c: &Cycle, i: usize, types: &[usize], amounts: Option<&[f64]>) -> Reason {
    let (m, r) = (c.m, &c.st.runs[i]);
    // (the amount each type was judged by: a memory-only shared request placed on a device
    // is charged its memory's share there, unplaced a whole GPU)
    let quota: Vec<QuotaProblem> = types
        .iter()
        .enumerate()
        .filter_map(|(k, &t)| problem(c, i, t, amounts.map_or(r.amount(), |a| a[k])))
        .collect();
    if !quota.is_empty() && quota.len() == types.len() {
        return Reason {
            code: "quota",
            subject: r.id.clone(),
            types: types.to_vec(),
            quota,
            ..Reason::default()
        };
    }
    // (the types an empty cluster could host it on, in the run's own order: `State.ever_fits`)
    let fits: Vec<usize> = r
        .types
        .iter()
        .copied()
        .filter(|&t| ever_fits(m, r, t))
        .collect();
    if fits.is_empty() {
        return Reason {
            code: "unschedulable",
            subject: r.id.clone(),
            types: types.to_vec(),
            ..Reason::default()
        };
    }
    let used = &c.st.cap.used;
    let blocks = fits
        .iter()
        .map(|&t| {
            let top = m.of_type[t]
                .iter()
                .filter(|&&n| m.nodes[n].schedulable)
                .map(|&n| c.st.cap.free[n].len())
                .max()
                .unwrap_or(0);
            (t, top)
        })
        .collect();
    let mut borrowers = Vec::new();
    if let Some(root) = m.projects[r.project].root {
        for &t in &fits {
            let mut mine: Vec<(usize, f64)> = m.members[root]
                .iter()
                .filter(|&&k| k != r.project)
                .map(|&k| (k, (used[m.pt(k, t)] - m.term(k, t).nominal).max(0.0)))
                .filter(|&(_, b)| b > EPS)
                .collect();
            mine.sort_by_key(|&(k, _)| k); // (numbered in name order)
            for (k, b) in mine {
                borrowers.push(Borrower {
                    gpu_type: t,
                    project: k,
                    amount: b,
                    reclaimable: Vec::new(),
                    n_reclaimable: 0,
                    fixed: Vec::new(),
                    n_fixed: 0,
                });
            }
        }
    }
    let lent = !borrowers.is_empty() && within_nominal(m, used, r.project, fits[0], r.amount());
    if lent {
        for b in &mut borrowers {
            lent_runs(c, b);
        }
    }
    Reason {
        code: "no_capacity",
        subject: r.id.clone(),
        types: types.to_vec(),
        blocks,
        borrowers,
        lent,
        ..Reason::default()
    }
}

/// The runs through which `b` borrows (`lent.Held.runs`).
fn lent_runs(c: &Cycle, b: &mut Borrower) {
    let st = &*c.st;
    let mut runs: Vec<usize> = st.held[c.m.pt(b.project, b.gpu_type)]
        .iter()
        .copied()
        .filter(|&i| holds(c, i))
        .collect();
    runs.sort_by(|&x, &y| st.runs[x].id.cmp(&st.runs[y].id));
    for i in runs {
        let r = &st.runs[i];
        let (list, n) = if r.preemptible {
            (&mut b.reclaimable, &mut b.n_reclaimable)
        } else {
            (&mut b.fixed, &mut b.n_fixed)
        };
        *n += 1;
        if list.len() < SHOWN {
            list.push((r.id.clone(), expected_end(st, i, c.now)));
        }
    }
}

/// Why run `i` may not add its GPUs of `t` now, or None (`QuotaBook.problem`).
fn problem(c: &Cycle, i: usize, t: usize, amount: f64) -> Option<QuotaProblem> {
    let (m, r, used) = (c.m, &c.st.runs[i], &c.st.cap.used);
    if admits(m, used, r.project, t, amount, r.preemptible) {
        return None;
    }
    let q = m.term(r.project, t);
    let u = used[m.pt(r.project, t)];
    let (kind, value) = match (q.borrowing, m.projects[r.project].root) {
        (Some(b), _) if u + amount > q.nominal + b + EPS => ("limit", u),
        (_, None) => ("alone", u),
        _ if !r.preemptible => ("nominal", u),
        (_, Some(root)) => {
            let (borrowed, lendable) = cohort_sums(m, used, root, t, Some(r.project), 0.0, false);
            ("cohort", (lendable - borrowed).max(0.0))
        }
    };
    Some(QuotaProblem {
        gpu_type: t,
        kind,
        value,
        amount,
    })
}

/// The reason of a run that fits but for the reservation (`cycle._try`): free GPUs are held
/// (`gpus_held`) or its project's quota is.
pub fn reserved(c: &Cycle, i: usize, gpus_held: bool, types: &[usize]) -> Reason {
    let res = c.reservation.as_ref().expect("reserved");
    let (res_project, res_type) = res.quota.map_or((0, 0), |q| (q.0, q.1));
    let r = &c.st.runs[i];
    Reason {
        code: "reserved",
        subject: r.id.clone(),
        types: types.to_vec(),
        gpus_held,
        anchor: c.st.runs[res.run].id.clone(),
        at: res.at,
        res_project,
        res_type,
        ..Reason::default()
    }
}

/// The explanation of cycle `c`, which ran with a `Log` (`cycle_explain.explain`, less the runs the
/// Python side explains itself: invalid, in backoff, or waiting for their budget).
pub fn finish(c: &mut Cycle) -> Explanation {
    let mut log = c.log.take().expect("a cycle run to explain");
    let admitted: HashSet<usize> = c.admissions.iter().map(|(i, _)| *i).collect();
    let mut b = Booker {
        etas: EtaBook::new(c),
        terms: HashMap::default(),
        out: Explanation::default(),
    };
    let met = std::mem::take(&mut log.met);
    for (i, follow) in met {
        if log.lazy.contains(&i) {
            let why = blocked(c, i, &c.st.runs[i].types, None);
            log.reasons.insert(i, why);
        }
        if admitted.contains(&i) {
            continue;
        }
        let Some(reason) = log.reasons.remove(&i) else {
            continue;
        };
        let k = b.out.reasons.len();
        b.out.reasons.push(reason);
        b.book(c, i, k);
        if let Some((p, q, start, end)) = follow {
            for j in start..end {
                b.book(c, c.st.queues[p][q].runs[j], k);
            }
        }
    }
    // strict FIFO's held runs, in their queue's order
    let mut held: Vec<(usize, usize, usize)> = Vec::new();
    for &(p, head, q, start, end) in &log.behind {
        for j in start..end {
            held.push((c.st.queues[p][q].runs[j], p, head));
        }
    }
    held.sort_by(|a, b| key_cmp(&c.st.runs[a.0].key, &c.st.runs[b.0].key));
    let mut behind: HashMap<(usize, usize), usize> = HashMap::default();
    for (i, p, head) in held {
        let k = *behind.entry((p, head)).or_insert_with(|| {
            b.out.reasons.push(Reason {
                code: "queued_behind",
                anchor: c.st.runs[head].id.clone(),
                res_project: p,
                ..Reason::default()
            });
            b.out.reasons.len() - 1
        });
        b.book(c, i, k);
    }
    b.out
}

struct Booker {
    etas: EtaBook,
    /// `Cycle._quota_terms`: per (project, type, preemptible)
    terms: HashMap<(usize, usize, bool), QuotaTerm>,
    out: Explanation,
}

impl Booker {
    /// Run `i`'s ETA with reason `k` (`Cycle.explain.booked`).
    fn book(&mut self, c: &Cycle, i: usize, k: usize) {
        let r = &c.st.runs[i];
        let code = self.out.reasons[k].code;
        let mut pending = Pending {
            run_id: r.id.clone(),
            reason: k,
            eta: None,
            no_eta: None,
        };
        if code == "unschedulable" {
            self.out.pending.push(pending);
            return;
        }
        let got = self.etas.book(&r.types, r.amount(), r.max_runtime);
        let (mut eta, mut why) = match got {
            Ok(e) => (Some(e), None),
            Err(w) => (None, Some(w)),
        };
        if code == "quota" {
            let (at, w) = self.quota_eta(c, i);
            why = w;
            eta = match (at, eta) {
                (Some(a), Some(e)) => Some(a.max(e)),
                _ => at,
            };
        }
        if let Some(res) = c.reservation.as_ref().filter(|res| res.run == i) {
            // the reservation's time is a bound it keeps; the estimate may be earlier
            if res.at.is_finite() {
                if eta.is_none_or(|e| e >= res.at) {
                    (eta, why) = (Some(res.at), None);
                }
            } else if eta.is_none() {
                why = Some(unknown_why(c, res));
            }
        }
        pending.eta = eta;
        if eta.is_none() {
            let w = why.unwrap_or(NoEta::Plain);
            let at = match self.out.no_eta.iter().position(|x| *x == w) {
                Some(at) => at,
                None => {
                    self.out.no_eta.push(w);
                    self.out.no_eta.len() - 1
                }
            };
            pending.no_eta = Some(at);
        }
        self.out.pending.push(pending);
    }

    /// The earliest time the quota run `i` waits for frees on any of its types
    /// (`cycle_explain._quota_eta`), or why there is none.
    fn quota_eta(&mut self, c: &Cycle, i: usize) -> (Option<f64>, Option<NoEta>) {
        let r = &c.st.runs[i];
        let mut best: (Option<f64>, Option<NoEta>) = (None, Some(NoEta::Plain));
        for &t in &r.types {
            let term = self
                .terms
                .entry((r.project, t, r.preemptible))
                .or_insert_with(|| quota_term(c, r.project, t, r.preemptible));
            match quota_eta(term, r.amount(), c.now) {
                Ok(e) if best.0.is_none_or(|b| e < b) => best = (Some(e), None),
                Ok(_) => {}
                Err(w) => {
                    if best.0.is_none() {
                        best = (None, Some(w));
                    }
                }
            }
        }
        best
    }
}

/// Why a reservation's time is unknown: the runs without max_runtime it waits for, on its
/// nodes and, where its quota waits, its project's on its type (`Cycle._unknown_why`).
fn unknown_why(c: &Cycle, res: &Reservation) -> NoEta {
    let st = &*c.st;
    let mut names: Vec<&str> = Vec::new();
    for held in &st.held {
        for &i in held {
            let r = &st.runs[i];
            if r.max_runtime.is_some() {
                continue;
            }
            let p = r.placement.as_ref().expect("active");
            let on_node = p.slots.iter().any(|(n, _)| res.unknown_nodes.contains(n));
            let by_quota =
                res.quota_unknown && res.quota.is_some_and(|q| q.0 == r.project && q.1 == p.ty);
            if on_node || by_quota {
                names.push(&r.id);
            }
        }
    }
    names.sort_unstable();
    let n = names.len();
    NoEta::Reserved(
        names
            .into_iter()
            .take(SHOWN_UNKNOWN)
            .map(String::from)
            .collect(),
        n,
    )
}
