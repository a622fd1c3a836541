//! What a cycle reads, kept up to date by events (`mlops_gpu.core.state.State`; a slot that
//! holds part of a shared device frees no whole device when its run ends: not on the
//! timelines).
//!
//! Invariants:
//! - a queued run is in exactly one queue of its project: the runs with the same class, LAS
//!   level, GPUs per node, nodes, GPU types as named, pinned backend and preemptibility (only a
//!   preemptible run may borrow; host requests are in it, as in `state.shape_key`), sorted
//!   by order key
//!   ((0, max_runtime or infinity, seq) under `shortest`, (LAS level, submit time, seq) under
//!   `las`, else (0, submit time, seq));
//! - `pools[pt(p, t)]` maps class -> the preemptible active runs of project `p` on type `t`
//!   that are not being preempted (the victim candidates), with their expected ends sorted,
//!   and how many of them reported a checkpoint (`Pool::checkpointed`);
//! - a run being preempted (`going`) holds nothing: not in `cap` (its devices are free, or
//!   held by the run admitted in its place; the cycle that chose it gave them back), not on
//!   the timelines, not a victim candidate; it stays known until it finishes;
//! - `ends[node]` holds (end, GPUs) of each active run with a fixed expected end (start +
//!   max_runtime); `moving[node]` those whose end moves with the clock (run id, seconds after
//!   now, GPUs): one without a start yet ends max_runtime after now (kept by `timeline`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::capacity::{Capacity, Placement};
use crate::dormancy::Dormancy;
use crate::model::Model;
use crate::nofit;
use crate::parts::Shape;

mod queue;
mod timeline;
mod type_list;

pub use queue::{AgeKey, Queue};
pub use type_list::TypeList;

/// (`repr(C)`, the fields a cycle reads of every queue head first: its order key, project,
/// class, types, size and shape, within the first cache lines of the run, so that judging a
/// head costs fewer cache misses at 50,000 runs; the order of the others does not matter)
#[repr(C)]
pub struct Run {
    pub key: Key,
    pub project: usize,
    pub class: i64,
    /// The cluster's types the run accepts, ascending (`State.types_of`).
    pub types: TypeList,
    pub gpus: usize,
    pub nodes: usize,
    pub max_runtime: Option<f64>,
    /// Whole GPUs, MIG slices or part of a shared device (`parts`).
    pub shape: Shape,
    /// The topology key its nodes must share a value of (`topology_key`), and whether they
    /// must (else it is preferred).
    pub topology: Option<usize>,
    pub preemptible: bool,
    pub queued: bool,
    /// What placement reads of it (`nofit::key` less the type, and `accepts`), interned when
    /// it joins a queue (`State::enqueue`): runs that ask alike are placed alike.
    pub request: u32,
    pub id: String,
    /// Its `gpu_types` names, interned (`fragmentation::Mix::intern`; 0: any, or no mix kept).
    pub accepts: u32,
    /// Its `gpu_types` as named, in its order (unsorted, duplicates kept), interned by the
    /// engine: its queue's identity (`QueueKey`).
    pub request_types: u32,
    pub pinned: Option<usize>,
    pub topology_required: bool,
    /// Host CPU (millicores) and memory (MB) it asks for on each of its nodes.
    pub cpu_milli: i64,
    pub host_memory_mb: i64,
    pub last_checkpoint_at: Option<f64>,
    /// GPU-seconds held over earlier attempts (`Run.attained_gpu_s`)
    pub attained: f64,
    pub placement: Option<Placement>,
    pub admitted_at: Option<f64>,
    pub started_at: Option<f64>,
    pub going: bool,
    /// When it came to hold its placement, as a count of such events (admitted or loaded):
    /// the order of the Python state's `active` dict, in which the ETA book sums the GPUs
    /// held without max_runtime (fractional shares: the same order, the same float).
    pub activated: u64,
    /// Its age (with `id`): the anchor is the blocked run that has waited longest.
    pub submitted_at: f64,
    pub seq: i64,
}

impl Run {
    /// GPUs charged before it is placed (`placement.request_amount`): its slices' share, its
    /// fraction (a memory cap alone counts as a whole GPU until placed), whole GPUs, or none
    /// (a CPU-only run).
    pub fn amount(&self) -> f64 {
        match self.shape {
            Shape::Whole => (self.gpus * self.nodes) as f64,
            Shape::Mig { share, .. } => self.gpus as f64 * share,
            Shape::Shared { fraction, .. } => fraction.unwrap_or(1.0),
            Shape::Cpu => 0.0,
        }
    }

    /// (host CPU, host memory) it asks for on each node.
    pub fn host(&self) -> (i64, i64) {
        (self.cpu_milli, self.host_memory_mb)
    }

    pub fn start(&self) -> Option<f64> {
        self.started_at.or(self.admitted_at)
    }
}

/// (submit time, seq, id): the smallest has waited longest (`state.age_of`).
pub fn age_cmp(a: &Run, b: &Run) -> std::cmp::Ordering {
    a.submitted_at
        .partial_cmp(&b.submitted_at)
        .expect("no NaN")
        .then(a.seq.cmp(&b.seq))
        .then(a.id.cmp(&b.id))
}

/// A victim candidate: its expected end (infinite when unknown), and the GPUs it holds on
/// its first two nodes (node `NONE`: no such slot; `more`: it holds more nodes, read from
/// the run), so that a search reads the pool without visiting every run.
#[derive(Clone, Copy)]
pub struct Entry {
    pub end: f64,
    pub run: usize,
    pub held: [(u32, u32); 2],
    pub more: bool,
}

pub const NONE: u32 = u32::MAX;

/// The victim candidates of one class, sorted by (end, run), and how many of them reported a
/// checkpoint (a same-class victim must have, unless the policy preempts runs without one).
#[derive(Default)]
pub struct Pool {
    pub ends: Vec<Entry>,
    pub checkpointed: usize,
}

/// A run's place in its project's order: (LAS level, max_runtime or submit time, seq).
pub type Key = (i64, f64, i64);

/// `x` (not NaN) as a u64 that orders alike (`partial_cmp`: -0.0 is 0.0; a negative
/// number's bits, flipped, rise as it does).
pub fn float_order(x: f64) -> u64 {
    let bits = if x == 0.0 { 0 } else { x.to_bits() };
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | (1 << 63)
    }
}

pub fn key_cmp(a: &Key, b: &Key) -> std::cmp::Ordering {
    a.0.cmp(&b.0)
        .then(a.1.partial_cmp(&b.1).expect("order keys are never NaN"))
        .then(a.2.cmp(&b.2))
}

pub struct State {
    pub cap: Capacity,
    pub runs: Vec<Run>,
    pub by_id: HashMap<String, usize>,
    pub queues: Vec<Vec<Queue>>,
    pub pools: Vec<BTreeMap<i64, Pool>>,
    pub going: Vec<usize>,
    pub ends: Vec<Vec<(f64, u32)>>,
    pub moving: Vec<Vec<(usize, f64, u32)>>,
    /// Per (project, type): its active runs not being preempted (the quota hold reads them).
    pub held: Vec<Vec<usize>>,
    /// The run that held the reservation after the last cycle, if not admitted then
    /// (`State.anchor`).
    pub anchor: Option<usize>,
    /// The next `Run::activated`.
    pub activations: u64,
    /// `Run::request`'s numbers.
    pub requests: HashMap<(nofit::Key, u32), u32>,
    /// Which queues sleep (`verdict`).
    pub dormancy: Dormancy,
    /// Every queue by (class, highest first; then its oldest run's age, oldest first), as
    /// `backfill::anchor` looks for the oldest blocked run.
    pub by_age: BTreeSet<AgeKey>,
}

impl State {
    pub fn new(m: &Model) -> State {
        let cap = Capacity::new(m);
        State {
            dormancy: Dormancy::new(m, cap.stamps.caps()),
            by_age: BTreeSet::new(),
            cap,
            runs: Vec::new(),
            by_id: HashMap::new(),
            queues: (0..m.projects.len()).map(|_| Vec::new()).collect(),
            pools: (0..m.projects.len() * m.n_types)
                .map(|_| BTreeMap::new())
                .collect(),
            going: Vec::new(),
            ends: vec![Vec::new(); m.nodes.len()],
            moving: vec![Vec::new(); m.nodes.len()],
            held: vec![Vec::new(); m.projects.len() * m.n_types],
            anchor: None,
            activations: 0,
            requests: HashMap::new(),
        }
    }

    /// Number the run (a run id seen before, e.g. a requeued victim, reuses its slot).
    fn register(&mut self, run: Run) -> Result<usize, String> {
        match self.by_id.get(&run.id) {
            Some(&i) => {
                let old = &self.runs[i];
                if old.queued || old.placement.is_some() {
                    return Err(format!("run {} is already queued or active", run.id));
                }
                self.runs[i] = run;
                Ok(i)
            }
            None => {
                self.by_id.insert(run.id.clone(), self.runs.len());
                self.runs.push(run);
                Ok(self.runs.len() - 1)
            }
        }
    }

    /// An admitted run holds its placement (already booked in `cap` by the cycle).
    pub fn activate(&mut self, m: &Model, i: usize, p: Placement, now: f64) {
        self.dequeue(i);
        let r = &mut self.runs[i];
        r.placement = Some(p);
        r.admitted_at = Some(now);
        r.started_at = Some(now);
        r.going = false;
        r.activated = self.activations;
        self.activations += 1;
        self.timeline(m, i, true);
        self.held_by(m, i, true);
        if self.runs[i].preemptible {
            self.pool(m, i, true);
        }
    }

    fn held_by(&mut self, m: &Model, i: usize, add: bool) {
        let r = &self.runs[i];
        let ty = r.placement.as_ref().expect("an active run").ty;
        let list = &mut self.held[m.pt(r.project, ty)];
        if add {
            list.push(i);
        } else if let Some(at) = list.iter().position(|&x| x == i) {
            list.swap_remove(at);
        }
    }

    /// A run that holds `p` already (loaded from a store): booked in `cap`, its end on the
    /// timelines, and a victim candidate; unless it is being preempted (`going`): then it
    /// holds nothing.
    pub fn hold(
        &mut self,
        m: &Model,
        mut run: Run,
        p: Placement,
        going: bool,
    ) -> Result<(), String> {
        run.queued = false;
        let project = run.project;
        let i = self.register(run)?;
        let r = &mut self.runs[i];
        r.placement = Some(p);
        r.going = going;
        r.activated = self.activations;
        self.activations += 1;
        if going {
            self.going.push(i);
            return Ok(());
        }
        self.cap.take(
            m,
            project,
            self.runs[i].placement.as_ref().expect("just set"),
        );
        self.timeline(m, i, true);
        // charged nothing (placed on a GPU type the cluster no longer has): it holds no
        // quota whose end anyone waits for, as `State.held` files it under a type no run asks
        if self.runs[i].placement.as_ref().expect("just set").charged != Some(0.0) {
            self.held_by(m, i, true);
        }
        if self.runs[i].preemptible {
            self.pool(m, i, true);
        }
        Ok(())
    }

    /// The run was chosen as a victim: from now on it holds nothing (the cycle gave its
    /// devices back already), is no victim candidate and has no end on the timelines.
    pub fn mark_going(&mut self, m: &Model, i: usize) {
        if self.runs[i].going {
            return;
        }
        if self.runs[i].preemptible {
            self.pool(m, i, false);
        }
        self.timeline(m, i, false);
        self.held_by(m, i, false);
        self.runs[i].going = true;
        self.going.push(i);
    }

    pub fn finish(&mut self, m: &Model, i: usize) -> Result<(), String> {
        let Some(p) = self.runs[i].placement.clone() else {
            return Err(format!("run {} is not active", self.runs[i].id));
        };
        if self.runs[i].going {
            self.going.retain(|&g| g != i); // it held nothing
        } else {
            self.cap.release(m, self.runs[i].project, &p);
            self.timeline(m, i, false);
            self.held_by(m, i, false);
            if self.runs[i].preemptible {
                self.pool(m, i, false);
            }
        }
        let r = &mut self.runs[i];
        r.placement = None;
        r.going = false;
        Ok(())
    }

    /// The run's expected end if fixed (start + max_runtime), else None.
    fn fixed_end(&self, i: usize) -> Option<f64> {
        let r = &self.runs[i];
        match (r.max_runtime, r.start()) {
            (Some(mr), Some(s)) => Some(s + mr),
            _ => None,
        }
    }

    fn pool(&mut self, m: &Model, i: usize, add: bool) {
        let r = &self.runs[i];
        let p = r.placement.as_ref().expect("an active run");
        // without a start its end moves with the clock: infinite keeps the latest end an
        // upper bound (`State._victim`)
        let end = self.fixed_end(i).unwrap_or(f64::INFINITY);
        let mut held = [(NONE, 0u32); 2];
        for (k, (n, d)) in p.slots.iter().take(2).enumerate() {
            held[k] = (*n as u32, d.len() as u32);
        }
        let entry = Entry {
            end,
            run: i,
            held,
            more: p.slots.len() > 2,
        };
        let checkpointed = usize::from(r.last_checkpoint_at.is_some());
        let pools = &mut self.pools[m.pt(r.project, p.ty)];
        let pool = pools.entry(r.class).or_default();
        let at = pool
            .ends
            .partition_point(|e| e.end < end || (e.end == end && e.run < i));
        if add {
            pool.ends.insert(at, entry);
            pool.checkpointed += checkpointed;
            let pt = m.pt(r.project, p.ty);
            self.cap.stamps.pool_grew(pt, r.class, checkpointed == 1);
        } else {
            if at < pool.ends.len() && pool.ends[at].run == i {
                pool.ends.remove(at);
                pool.checkpointed -= checkpointed;
            }
            if pool.ends.is_empty() {
                pools.remove(&r.class);
            }
        }
    }

    /// Active run `i` reported a checkpoint at `at` (its first: its pool counts it).
    pub fn checkpoint(&mut self, m: &Model, i: usize, at: f64) {
        let r = &self.runs[i];
        let first = r.last_checkpoint_at.is_none();
        if first && r.preemptible && !r.going {
            if let Some(p) = &r.placement {
                let pool = self.pools[m.pt(r.project, p.ty)].get_mut(&r.class);
                pool.expect("an active preemptible run is in its pool")
                    .checkpointed += 1;
                self.cap
                    .stamps
                    .pool_grew(m.pt(r.project, p.ty), r.class, true);
            }
        }
        self.runs[i].last_checkpoint_at = Some(at);
    }

    /// The latest expected end of a victim candidate of (project, type, class).
    pub fn latest_victim_end(&self, m: &Model, p: usize, t: usize, class: i64) -> Option<f64> {
        self.pools[m.pt(p, t)]
            .get(&class)
            .and_then(|pool| pool.ends.last().map(|x| x.end))
    }
}
