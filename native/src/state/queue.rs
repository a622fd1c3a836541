//! A project's queues: one per request shape, each sorted by order key (`State`'s first
//! invariant), with what a cycle reads of every queue without reading its runs.
//!
//! Invariants: a queue is never empty (the last run out removes it, and the project's later
//! queues move up one); each queue's `slot` in `State::dormancy` names its place, and is
//! woken whenever its head changes (a verdict is of the head: `verdict`); `State::by_age`
//! holds each queue's `age_key` as its class and oldest run are now, once.

use std::cmp::Reverse;
use std::collections::VecDeque;

use super::{age_cmp, float_order, key_cmp, Run, State, TypeList};
use crate::nofit;
use crate::verdict::Blocked;

#[derive(Clone, PartialEq, Eq)]
pub struct QueueKey {
    pub class: i64,
    pub level: i64,
    pub gpus: usize,
    pub nodes: usize,
    /// The run's `gpu_types` as it named them (`Run::request_types`), not the cluster's
    /// types it accepts: `state.shape_key` keeps `("a", "b")`, `("b", "a")` and `("a",
    /// "tpu")` apart. Host CPU and memory are in the key, as there: a run asking for less
    /// is not held behind a head asking for more (a queue blocked at its head waits whole,
    /// `cycle._turn`).
    pub request_types: u32,
    pub pinned: Option<usize>,
    pub topology: Option<usize>,
    pub topology_required: bool,
    pub host: (i64, i64),
    pub shape: (u8, usize, u64, Option<i64>),
    pub preemptible: bool,
}

pub struct Queue {
    pub key: QueueKey,
    pub runs: VecDeque<usize>,
    /// Its run that has waited longest (`age_cmp`): the head unless under `shortest`.
    pub oldest: usize,
    /// That run's (submit time, seq), kept here so that `backfill::anchor` compares every
    /// queue's oldest run without reading the run (a cache miss per queue at 50,000 runs).
    pub oldest_age: (f64, i64),
    /// Its runs' types (`Run::types`: alike, as their request is), and whether its head was
    /// found to admit nothing with the queue (`verdict`; at 0: never), kept here so that a
    /// cycle tells a blocked queue without reading its head; reset when the head changes.
    pub types: TypeList,
    pub blocked: Blocked,
    /// Its slot in `State::dormancy`.
    pub slot: u32,
}

/// A queue in `State::by_age`: (class, highest first; its oldest run's submit time and seq,
/// oldest first; its slot).
pub type AgeKey = (Reverse<i64>, u64, i64, u32);

impl Queue {
    pub fn age_key(&self) -> AgeKey {
        let (submitted, seq) = self.oldest_age;
        (
            Reverse(self.key.class),
            float_order(submitted),
            seq,
            self.slot,
        )
    }
}

impl State {
    /// A run joins its queue.
    pub fn enqueue(&mut self, mut run: Run) -> Result<(), String> {
        let key = queue_key(&run);
        let (order, project) = (run.key, run.project);
        run.queued = true;
        let next = self.requests.len() as u32;
        run.request = *self
            .requests
            .entry((nofit::key(&run, 0), run.accepts))
            .or_insert(next);
        let i = self.register(run)?;
        let qs = &mut self.queues[project];
        let q = match qs.iter().position(|q| q.key == key) {
            Some(j) => &mut qs[j],
            None => {
                let slot = self.dormancy.open(project, qs.len());
                qs.push(Queue {
                    key,
                    runs: VecDeque::new(),
                    oldest: i,
                    oldest_age: (self.runs[i].submitted_at, self.runs[i].seq),
                    types: self.runs[i].types.clone(),
                    blocked: Blocked::default(),
                    slot,
                });
                let q = qs.last_mut().expect("just pushed");
                self.by_age.insert(q.age_key());
                q
            }
        };
        let runs = &self.runs;
        let at = q
            .runs
            .partition_point(|&r| key_cmp(&runs[r].key, &order).is_le());
        q.runs.insert(at, i);
        if at == 0 {
            q.blocked = Blocked::default(); // (a new head: not judged yet)
            self.dormancy.stir(q.slot);
        }
        if age_cmp(&runs[i], &runs[q.oldest]).is_lt() {
            self.by_age.remove(&q.age_key());
            q.oldest = i;
            q.oldest_age = (runs[i].submitted_at, runs[i].seq);
            self.by_age.insert(q.age_key());
        }
        Ok(())
    }

    /// Take a queued run out of its queue (admitted, or withdrawn).
    pub fn dequeue(&mut self, i: usize) {
        let key = queue_key(&self.runs[i]);
        let qs = &mut self.queues[self.runs[i].project];
        if let Some(j) = qs.iter().position(|q| q.key == key) {
            let q = &mut qs[j];
            // from the head: admitted runs are nearly always there
            if let Some(at) = q.runs.iter().position(|&x| x == i) {
                q.runs.remove(at);
                if at == 0 {
                    q.blocked = Blocked::default();
                    self.dormancy.stir(q.slot);
                }
            }
            if q.oldest == i {
                let runs = &self.runs;
                if let Some(&o) = q.runs.iter().min_by(|&&a, &&b| age_cmp(&runs[a], &runs[b])) {
                    self.by_age.remove(&q.age_key());
                    q.oldest = o;
                    q.oldest_age = (runs[o].submitted_at, runs[o].seq);
                    self.by_age.insert(q.age_key());
                }
            }
            if q.runs.is_empty() {
                self.by_age.remove(&q.age_key());
                self.dormancy.close(q.slot);
                qs.remove(j);
                for (k, later) in qs.iter().enumerate().skip(j) {
                    self.dormancy.moved_to(later.slot, k);
                }
            }
        }
        self.runs[i].queued = false;
    }
}

pub(super) fn queue_key(r: &Run) -> QueueKey {
    QueueKey {
        class: r.class,
        level: r.key.0,
        gpus: r.gpus,
        nodes: r.nodes,
        request_types: r.request_types,
        pinned: r.pinned,
        topology: r.topology,
        topology_required: r.topology_required,
        host: (r.cpu_milli, r.host_memory_mb),
        shape: r.shape.key(),
        preemptible: r.preemptible,
    }
}
