//! The node timelines (`State.ends`/`State.moving` and `State.lines`): when each node's whole
//! devices come free as the active runs end, what backfill's reservation and the ETAs walk.
//!
//! Invariants: `ends[node]` holds (end, GPUs) of each active run with a fixed expected end
//! (start + max_runtime), sorted; `moving[node]` those whose end moves with the clock (run,
//! seconds after now, GPUs): one without a start yet ends max_runtime after now. A run
//! without a max_runtime, a run being preempted and a slot on part of a shared device are on
//! no timeline. `lines` and `reach` read them at a clock, never change them.

use super::State;
use crate::model::Model;

impl State {
    /// Add (or take back) active run `i`'s whole devices to the timelines of its nodes: at
    /// its fixed end, or among the moving ends.
    pub(super) fn timeline(&mut self, _m: &Model, i: usize, add: bool) {
        let r = &self.runs[i];
        debug_assert!(
            !r.going,
            "a run being preempted has no end on the timelines"
        );
        let (fixed, offset) = match (r.max_runtime, r.start()) {
            (None, _) => return,
            (Some(mr), None) => (None, mr),
            (Some(mr), Some(s)) => (Some(s + mr), 0.0),
        };
        let p = r.placement.as_ref().expect("an active run");
        for (k, (node, devs)) in p.slots.iter().enumerate() {
            if !p.share(k).whole() {
                continue; // (a shared device frees nothing whole when one of its runs ends)
            }
            let n = devs.len() as u32;
            match fixed {
                None => {
                    let mv = &mut self.moving[*node];
                    if add {
                        mv.push((i, offset, n));
                    } else {
                        mv.retain(|x| x.0 != i);
                    }
                }
                Some(end) => {
                    let line = &mut self.ends[*node];
                    let item = (end, n);
                    let at = line.partition_point(|x| x.0 < end || (x.0 == end && x.1 < n));
                    if add {
                        line.insert(at, item);
                    } else if at < line.len() && line[at] == item {
                        line.remove(at);
                    }
                }
            }
        }
    }

    /// The node's (expected end, GPUs released) timeline at `now`, sorted (`State.lines`).
    pub fn lines(&self, node: usize, now: f64) -> Vec<(f64, u32)> {
        let mut out: Vec<(f64, u32)> = self.ends[node]
            .iter()
            .map(|&(e, n)| (if e > now { e } else { now }, n))
            .collect();
        let moving = &self.moving[node];
        out.extend(moving.iter().map(|&(_, off, n)| (now + off, n)));
        if !moving.is_empty() || out.first().is_some_and(|x| x.0 <= now) {
            out.sort_by(|a, b| a.0.partial_cmp(&b.0).expect("no NaN").then(a.1.cmp(&b.1)));
        }
        out
    }

    /// Walking the node's timeline at `now` from `free` GPUs free: the GPUs free and the time
    /// once `need` are free, or all it ever frees and its last end (`backfill.reach_on` over
    /// `lines`). Without moving ends the fixed ends are walked in place, clamped: clamping
    /// keeps their order, and ends tied at `now` in another order change neither the time
    /// `need` is reached nor whether it ever is.
    pub fn reach(&self, node: usize, free: usize, need: usize, now: f64) -> (usize, f64) {
        if self.moving[node].is_empty() {
            let clamped = self.ends[node]
                .iter()
                .map(|&(e, n)| (if e > now { e } else { now }, n));
            return walk(clamped, free, need, now);
        }
        walk(self.lines(node, now).into_iter(), free, need, now)
    }
}

/// Walking a timeline (end, GPUs released) in order from `free` GPUs free at `now`: the GPUs
/// free and the end at which `need` are, or all it frees and its last end.
fn walk(
    line: impl Iterator<Item = (f64, u32)>,
    mut free: usize,
    need: usize,
    now: f64,
) -> (usize, f64) {
    let mut when = now;
    for (end, n) in line {
        free += n as usize;
        when = end;
        if free >= need {
            break;
        }
    }
    (free, when)
}
