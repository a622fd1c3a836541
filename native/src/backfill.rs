//! EASY backfill (`mlops_gpu.core.backfill` and `parking.anchor`): the anchor, the oldest
//! highest-class queue head blocked by capacity alone as the cycle begins, gets the earliest
//! reservation its GPU types' timelines allow; a later run may use a reserved node only if it
//! ends before then, or if the node still frees the reserved GPUs in time.

use std::collections::HashMap;

use crate::cycle::Cycle;
use crate::model::Model;
use crate::placement::{eligible, node_sets};
use crate::quota::admits;
use crate::state::{key_cmp, State};

const EPS: f64 = 1e-9;

pub struct Reservation {
    pub at: f64,
    pub need: usize,
    pub nodes: HashMap<usize, Vec<(f64, u32)>>,
}

impl Reservation {
    /// May a run leaving `free_after` free on `node` start now without delaying the anchor?
    pub fn allows(&self, node: usize, free_after: usize, ends_at: Option<f64>) -> bool {
        let Some(line) = self.nodes.get(&node) else {
            return true;
        };
        if ends_at.is_some_and(|e| e <= self.at) {
            return true;
        }
        let released: u32 = line.iter().filter(|x| x.0 <= self.at).map(|x| x.1).sum();
        free_after + released as usize >= self.need
    }
}

/// The types on which quota would admit the queued run `i`, if no node set of them can take
/// it now; else empty (`parking._blocked_by_capacity`).
fn blocked_by_capacity(c: &Cycle, i: usize) -> Vec<usize> {
    let (m, st) = (c.m, &*c.st);
    let r = &st.runs[i];
    let used = &st.cap.used;
    let amount = r.amount();
    let mut admitted = Vec::new();
    for &t in &r.types {
        if amount > c.room(r.project, t) + EPS {
            continue;
        }
        let fits = node_sets(m, &st.cap, r, t);
        if admits(m, used, r.project, t, amount, r.preemptible) {
            if fits {
                return Vec::new();
            }
            admitted.push(t);
        }
    }
    admitted
}

/// The run the reservation is for, with its types: the highest-class, oldest queue head
/// blocked by capacity alone (ties to the lowest run id).
pub fn anchor(c: &Cycle) -> Option<(usize, Vec<usize>)> {
    let st = &*c.st;
    let mut best: Option<(usize, Vec<usize>)> = None;
    for qs in &st.queues {
        for q in qs {
            let h = q.runs[0];
            if let Some((b, _)) = &best {
                let (r, o) = (&st.runs[h], &st.runs[*b]);
                let earlier = (-r.class)
                    .cmp(&-o.class)
                    .then(key_cmp(&r.key, &o.key))
                    .then(r.id.cmp(&o.id));
                if earlier.is_ge() {
                    continue;
                }
            }
            let types = blocked_by_capacity(c, h);
            if !types.is_empty() {
                best = Some((h, types));
            }
        }
    }
    best
}

/// The earliest reservation for the queued run `i` on `types` (`backfill.reserve`).
pub fn reserve(m: &Model, st: &State, i: usize, types: &[usize], now: f64) -> Option<Reservation> {
    let r = &st.runs[i];
    let mut best: Option<Reservation> = None;
    for &t in types {
        // per backend, in the order their nodes first fit: (time, node)
        let mut by_backend: Vec<(usize, Vec<(f64, usize)>)> = Vec::new();
        for n in eligible(m, r, t) {
            if m.nodes[n].ndev < r.gpus {
                continue;
            }
            let (mut free, mut when) = (st.cap.free[n].len(), now);
            if free < r.gpus {
                (free, when) = st.reach(n, free, r.gpus, now);
            }
            if free >= r.gpus {
                let b = m.nodes[n].backend;
                match by_backend.iter_mut().find(|(x, _)| *x == b) {
                    Some((_, c)) => c.push((when, n)),
                    None => by_backend.push((b, vec![(when, n)])),
                }
            }
        }
        for (_, mut c) in by_backend {
            if c.len() < r.nodes {
                continue;
            }
            c.sort_by(|a, b| a.0.partial_cmp(&b.0).expect("no NaN").then(a.1.cmp(&b.1)));
            let chosen = &c[..r.nodes];
            let at = chosen[chosen.len() - 1].0;
            if best.as_ref().is_none_or(|b| at < b.at) {
                best = Some(Reservation {
                    at,
                    need: r.gpus,
                    nodes: chosen.iter().map(|&(_, n)| (n, st.lines(n, now))).collect(),
                });
            }
        }
    }
    best
}
