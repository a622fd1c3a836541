//! The anchor: the run a reservation is for (`anchor.anchor`), and the one a cycle keeps when
//! it had none or admitted it (`anchor.overtaken`); see `backfill`.

use std::cmp::Reverse;
use std::collections::HashMap;

use super::{ever_fits, quota_terms};
use crate::cycle::Cycle;
use crate::model::Model;
use crate::placement::{node_sets, place};
use crate::quota::admits;
use crate::state::{age_cmp, Run};

/// The types the run could ever be admitted on (`anchor._types`); none for MIG and shared
/// requests (only whole-GPU runs are reserved for).
fn types_of(m: &Model, r: &Run) -> Vec<usize> {
    if !r.shape.is_whole() {
        return Vec::new();
    }
    r.types
        .iter()
        .copied()
        .filter(|&t| ever_fits(m, r, t) && quota_terms(m, r, t).0)
        .collect()
}

/// The run the reservation is for, with its types (`anchor.anchor`).
pub fn anchor(c: &Cycle) -> Option<(usize, Vec<usize>)> {
    let (m, st) = (c.m, &*c.st);
    // (the level a spent budget serves a run at, not its class; None: it waits)
    let level = |i: usize| c.level(st.runs[i].project, st.runs[i].class);
    let better = |i: usize, b: &Option<(usize, Vec<usize>)>| match b {
        None => true,
        Some((j, _)) => {
            let (r, o) = (&st.runs[i], &st.runs[*j]);
            Reverse(level(i))
                .cmp(&Reverse(level(*j)))
                .then(age_cmp(r, o))
                .is_lt()
        }
    };
    let mut best: Option<(usize, Vec<usize>)> = None;
    if let Some(k) = st.anchor {
        if st.runs[k].queued && level(k).is_some() {
            let types = types_of(m, &st.runs[k]);
            if !types.is_empty() {
                best = Some((k, types));
            }
        }
    }
    // Queues by class, highest first, then their oldest run's age (`State::by_age`): a run's
    // level is at most its class, so once a queue's class is below the best's level, or
    // equal to it with a younger oldest run, no later queue is better.
    for &(Reverse(class), _, _, slot) in &st.by_age {
        let (p, j) = st.dormancy.place(slot);
        let q = &st.queues[p][j];
        // (its runs' project and class are the queue's: the level and the age kept in the
        // queue rule most queues out without reading their oldest run; a tie on both leaves
        // it to `better`, which reads the ids)
        let Some(at) = c.level(p, class) else {
            continue;
        };
        if let Some((j, _)) = &best {
            let o = &st.runs[*j];
            let best_level = level(*j).expect("the best run is served");
            let (submitted, seq) = q.oldest_age;
            let younger = (submitted.partial_cmp(&o.submitted_at).expect("no NaN"))
                .then(seq.cmp(&o.seq))
                .is_gt();
            if class < best_level || (class == best_level && younger) {
                break;
            }
            if Reverse(at)
                .cmp(&Reverse(best_level))
                .then(younger.cmp(&false))
                .is_gt()
            {
                continue; // (worse)
            }
        }
        let i = q.oldest;
        if !better(i, &best) {
            continue;
        }
        // Blocked: on none of the types it could ever be admitted on (`types_of`) do both
        // quota admit it and a node set take it now (`anchor._blocked`). (Judged on those
        // types only: a node set that takes it now on a type an empty cluster could not host
        // it on, for want of host CPU or memory, does not make it open.)
        // (`ever_fits` asked last, and only of a run with host requests: it walks the type's
        // nodes, and without them a node set that takes the run now is one an empty cluster
        // has)
        let r = &st.runs[i];
        let open = r.shape.is_whole()
            && r.types.iter().any(|&t| {
                quota_terms(m, r, t).0
                    && admits(m, &st.cap.used, r.project, t, r.amount(), r.preemptible)
                    && if r.topology.is_some() {
                        place(m, &st.cap, r, t, None).is_some()
                    } else {
                        node_sets(m, &st.cap, r, t)
                    }
                    && (r.host() == (0, 0) || ever_fits(m, r, t))
            });
        if open {
            continue;
        }
        let types = types_of(m, r);
        if !types.is_empty() {
            best = Some((i, types));
        }
    }
    best
}

/// The anchor kept after cycle `c` when it had none or admitted it (`anchor.overtaken`): of
/// the queued runs that could ever be admitted and that `c` overtook (it admitted a later run
/// of their class, not them), the one of the highest class that has waited longest.
pub fn overtaken(c: &Cycle) -> Option<usize> {
    let (m, st) = (c.m, &*c.st);
    let admitted = |i: usize| c.admissions.iter().any(|(a, _)| *a == i);
    let level = |i: usize| c.level(st.runs[i].project, st.runs[i].class);
    // level (a spent budget's, else the class) -> its latest admitted run
    let mut youngest: HashMap<i64, usize> = HashMap::new();
    for &(i, _) in &c.admissions {
        let Some(at) = level(i) else {
            continue; // (never: a run whose budget makes it wait is not served)
        };
        let y = youngest.entry(at).or_insert(i);
        if age_cmp(&st.runs[i], &st.runs[*y]).is_gt() {
            *y = i;
        }
    }
    let better = |i: usize, b: Option<usize>| match b {
        None => true,
        Some(j) => {
            let (r, o) = (&st.runs[i], &st.runs[j]);
            Reverse(level(i))
                .cmp(&Reverse(level(j)))
                .then(age_cmp(r, o))
                .is_lt()
        }
    };
    let mut best: Option<usize> = None;
    for (p, qs) in st.queues.iter().enumerate() {
        for q in qs {
            let Some(&y) = c.level(p, q.key.class).and_then(|at| youngest.get(&at)) else {
                continue;
            };
            let before = |i: usize| age_cmp(&st.runs[i], &st.runs[y]).is_lt();
            if !before(q.oldest) || !better(q.oldest, best) {
                continue;
            }
            // its oldest run not admitted (the queue's oldest, unless admitted)
            let i = if admitted(q.oldest) {
                let rest = q.runs.iter().copied().filter(|&x| !admitted(x));
                match rest.min_by(|&a, &b| age_cmp(&st.runs[a], &st.runs[b])) {
                    Some(i) => i,
                    None => continue,
                }
            } else {
                q.oldest
            };
            if before(i) && better(i, best) && !types_of(m, &st.runs[i]).is_empty() {
                best = Some(i);
            }
        }
    }
    best
}
