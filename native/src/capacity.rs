//! Free devices and quota usage (`mlops_gpu.core.capacity.Capacity`; MIG slices and shared
//! devices are booked by `parts`).
//!
//! Invariants:
//! - `free[node]` lists the node's free device numbers in the node's device order;
//! - `buckets[g][k]` lists, by name, the schedulable nodes of group `g` (a (type, backend)
//!   pair of `Model::groups`) with exactly `k` free devices: best fit is the first node of the
//!   first non-empty bucket at or above the need;
//! - `used[pt(p, t)]` is the GPUs project `p` holds of type `t`: `used_units` over `UNIT`,
//!   the amounts summed as integers, so it depends only on who holds what, never on the order
//!   runs came and went in (`Capacity.used`; issue 25);
//! - `cpu_free[node]` / `mem_free[node]`: host resources not held (None: not tracked);
//! - `take` and `release` are exact inverses (a preemption trial undoes itself);
//! - a device or MIG slice is free only when no active run holds it: `again[(node, device)]`
//!   counts the holders beyond the first (only runs loaded from a store name a device another
//!   holds, `core/held.py`), and giving one back while others hold it frees nothing
//!   (`Capacity.again`); a shared device counts as one holder however many shared runs hold
//!   parts of it;
//! - a shared device's fraction in `shared` is `share_units[(node, device)]` over `UNIT`: the
//!   shares summed as integers, so it depends only on who holds the device, never on the
//!   order they came and went in (`Capacity.share_units`);
//! - every give-back goes through `release`, which tells `nofit` (its memo of requests that
//!   found no place is exact only so) and stamps `stamps` (what a queue's remembered verdict
//!   compares, `verdict`), as every take stamps who borrows.

use std::collections::HashMap;

use crate::fragmentation::{Mix, Shape};
use crate::model::Model;
use crate::nofit::NoFit;
use crate::parts::{self, SlotShare};
use crate::pyfloat;
use crate::verdict::Stamps;

mod node_set;

pub use node_set::{ones, NodeSet};

/// Where a run runs: one backend, one type, one slot (node, devices) per gang member on a node
/// of the cluster, and the GPUs it holds in all (`Placement.gpu_amount`; a run loaded from a
/// store may hold GPUs on a node that has left the inventory: counted here, in no slot).
#[derive(Clone, Debug)]
pub struct Placement {
    pub ty: usize,
    pub backend: usize,
    pub slots: Vec<(usize, Vec<u16>)>,
    pub gpus: usize,
    /// Host CPU (millicores) and memory (MB) it holds on each slot's node.
    pub host: (i64, i64),
    /// Per slot, the share of each device it holds (`parts`); empty: whole devices.
    pub shares: Vec<SlotShare>,
    /// Its run's accepted GPU types (`Mix::intern`), for the shape it adds to `Capacity::mix`.
    pub accepts: u32,
    /// What it is charged where that is not its slots' amount: a run loaded from the store
    /// with slots on nodes the cluster no longer has, or placed on a GPU type the cluster no
    /// longer has (0: its quota there is nobody's to read), as `Capacity.take` books it.
    pub charged: Option<f64>,
}

impl Placement {
    /// GPUs charged (`Placement.gpu_amount`: whole GPUs count 1, shares and slices their part).
    pub fn amount(&self) -> f64 {
        if let Some(a) = self.charged {
            return a;
        }
        if self.shares.is_empty() {
            return self.gpus as f64;
        }
        let slots = self.slots.iter().zip(&self.shares);
        slots.fold(0.0, |a, ((_, d), s)| a + d.len() as f64 * s.fraction)
    }

    /// The share slot `k` holds of each of its devices.
    pub fn share(&self, k: usize) -> SlotShare {
        self.shares.get(k).copied().unwrap_or(SlotShare::WHOLE)
    }
}

/// Parts of a GPU that `used` counts in (`capacity.UNIT`): 2^16 x 3^2 x 5^6 x 7, so sevenths
/// (MIG slices), fractions and memory shares of usual GPU sizes are whole units.
pub const UNIT: f64 = 64_512_000_000.0;

/// A placement's GPU amount in `UNIT`s (Python's `round(amount * UNIT)`: ties to even).
pub fn units(amount: f64) -> i64 {
    (amount * UNIT).round_ties_even() as i64
}

#[derive(Clone)]
pub struct Capacity {
    pub free: Vec<Vec<u16>>,
    pub buckets: Vec<Vec<NodeSet>>,
    pub group_of: Vec<Option<usize>>,
    pub used: Vec<f64>,
    /// `used` in `UNIT`s: what it is worked out from.
    pub used_units: Vec<i64>,
    /// Per node: host CPU (millicores) and memory (MB) not held by active runs (None: not
    /// tracked).
    pub cpu_free: Vec<Option<i64>>,
    pub mem_free: Vec<Option<i64>>,
    /// Per node, per its MIG profiles: the free slices; per node: the shared devices held
    /// (`parts`).
    pub mig_free: Vec<Vec<Vec<u16>>>,
    pub shared: Vec<Vec<(u16, f64, i64)>>,
    /// (node, device or slice) -> how many active runs hold it beyond the first.
    pub again: HashMap<(usize, u16), u32>,
    /// (node, shared device) -> the fraction held on it, in `UNIT`s.
    pub share_units: HashMap<(usize, u16), i64>,
    /// The shapes of the slots held on GPUs, kept while fragmentation-aware placement is on
    /// (`fragmentation`).
    pub mix: Mix,
    /// What placement found no room for until the next give-back where it could (`nofit`).
    pub nofit: NoFit,
    /// What a queue's remembered verdict depends on (`verdict`).
    pub stamps: Stamps,
    /// Per type: its nodes that offer MIG slices or sharing, in node order (the only ones a
    /// MIG or shared request walks: `placement::eligible`).
    pub parted: Vec<Vec<usize>>,
}

impl Capacity {
    pub fn new(m: &Model) -> Capacity {
        let mut group_of = vec![None; m.nodes.len()];
        // per group: its nodes' numbers (lowest, highest) and most devices
        let mut span = vec![(usize::MAX, 0, 0); m.groups.len()];
        for (i, n) in m.nodes.iter().enumerate() {
            if !n.schedulable {
                continue;
            }
            let g = m
                .groups
                .binary_search(&(n.ty, n.backend))
                .expect("group of a node");
            group_of[i] = Some(g);
            let s = &mut span[g];
            *s = (s.0.min(i), s.1.max(i), s.2.max(n.ndev));
        }
        let mut buckets: Vec<Vec<NodeSet>> = (span.iter())
            .map(|&(lo, hi, most)| match lo <= hi {
                true => vec![NodeSet::new(lo, hi); most + 1],
                false => Vec::new(),
            })
            .collect();
        for (i, n) in m.nodes.iter().enumerate() {
            if let Some(g) = group_of[i] {
                buckets[g][n.ndev].insert(i);
            }
        }
        Capacity {
            free: m
                .nodes
                .iter()
                .map(|n| (0..n.ndev as u16).collect())
                .collect(),
            buckets,
            group_of,
            used: vec![0.0; m.projects.len() * m.n_types],
            used_units: vec![0; m.projects.len() * m.n_types],
            cpu_free: m.nodes.iter().map(|n| n.cpu_milli).collect(),
            mem_free: m.nodes.iter().map(|n| n.host_memory_mb).collect(),
            mig_free: parts::mig_free(m),
            shared: vec![Vec::new(); m.nodes.len()],
            again: HashMap::new(),
            share_units: HashMap::new(),
            mix: Mix::new(m.n_types),
            nofit: NoFit::new(m),
            stamps: Stamps::new(m),
            parted: (m.of_type.iter())
                .map(|nodes| {
                    let parted = |&&n: &&usize| {
                        let p = parts::of(m, n);
                        p.shared || !p.mig.is_empty()
                    };
                    nodes.iter().filter(parted).copied().collect()
                })
                .collect(),
        }
    }

    fn rebucket(&mut self, node: usize, old: usize, new: usize) {
        if let Some(g) = self.group_of[node] {
            let b = &mut self.buckets[g];
            b[old].remove(node);
            b[new].insert(node);
        }
    }

    pub fn take(&mut self, m: &Model, project: usize, p: &Placement) {
        self.take_as(m, project, p, true);
    }

    pub fn release(&mut self, m: &Model, project: usize, p: &Placement) {
        self.release_as(m, project, p, true);
    }

    /// A trial gives an active run's devices and quota back (a victim search's): as
    /// `release`, but no verdict stamp moves, as `retake` takes them again before a verdict
    /// is read or taken (the trial leaves the state as it found it).
    pub fn release_for_trial(&mut self, m: &Model, project: usize, p: &Placement) {
        self.release_as(m, project, p, false);
    }

    /// The run a trial gave back (`release_for_trial`) takes its devices and quota again.
    pub fn retake(&mut self, m: &Model, project: usize, p: &Placement) {
        self.take_as(m, project, p, false);
    }

    fn take_as(&mut self, m: &Model, project: usize, p: &Placement, stamp: bool) {
        for (k, (node, devs)) in p.slots.iter().enumerate() {
            let share = p.share(k);
            if share.whole() && parts::of(m, *node).mig.is_empty() {
                self.take_devices(*node, devs);
            } else {
                self.take_parts(m, *node, devs, share);
            }
            self.book_host(*node, p.host, -1);
            if let Some(s) = self.shape(m, p, k) {
                self.mix.add(s);
            }
        }
        self.book(m.pt(project, p.ty), units(p.amount()));
        if stamp {
            let used = self.used[m.pt(project, p.ty)];
            self.stamps.took(m, project, p.ty, used);
        }
    }

    fn release_as(&mut self, m: &Model, project: usize, p: &Placement, stamp: bool) {
        for (k, (node, devs)) in p.slots.iter().enumerate() {
            let share = p.share(k);
            if share.whole() && parts::of(m, *node).mig.is_empty() {
                self.free_devices(*node, devs);
            } else {
                self.release_parts(m, *node, devs, share);
            }
            self.book_host(*node, p.host, 1);
            self.nofit.given_back(m, *node);
            if let Some(s) = self.shape(m, p, k) {
                self.mix.remove(s);
            }
        }
        self.book(m.pt(project, p.ty), -units(p.amount()));
        if !stamp {
            return;
        }
        self.stamps.quota_back(m, project, p.ty, p.amount());
        for (node, _) in &p.slots {
            self.stamps.node_back(m, *node, self.free[*node].len());
        }
    }

    fn book(&mut self, k: usize, units: i64) {
        self.used_units[k] += units;
        self.used[k] = self.used_units[k] as f64 / UNIT;
    }

    /// Take the devices that are free (one that is not is held by another run already, one
    /// loaded from a store: counted in `again`), moving the node between buckets once.
    pub(crate) fn take_devices(&mut self, node: usize, devs: &[u16]) {
        let before = self.free[node].len();
        for &d in devs {
            let free = &mut self.free[node];
            match free.binary_search(&d) {
                Ok(i) => {
                    free.remove(i);
                }
                Err(_) => *self.again.entry((node, d)).or_insert(0) += 1,
            }
        }
        let after = self.free[node].len();
        if after != before {
            self.rebucket(node, before, after);
        }
    }

    /// One of several holders of device `d` gives it back: true (it stays held) when others
    /// still hold it.
    pub(crate) fn release_again(&mut self, node: usize, d: u16) -> bool {
        match self.again.get_mut(&(node, d)) {
            None => false,
            Some(n) => {
                *n -= 1;
                if *n == 0 {
                    self.again.remove(&(node, d));
                }
                true
            }
        }
    }

    /// Give back the devices that are taken, in device order, with one bucket move (one
    /// that other runs hold too stays held).
    pub(crate) fn free_devices(&mut self, node: usize, devs: &[u16]) {
        let before = self.free[node].len();
        for d in devs {
            if !self.again.is_empty() && self.release_again(node, *d) {
                continue;
            }
            let free = &mut self.free[node];
            if let Err(i) = free.binary_search(d) {
                free.insert(i, *d);
            }
        }
        let after = self.free[node].len();
        if after != before {
            self.rebucket(node, before, after);
        }
    }

    /// Book (`sign` -1) or give back (+1) a slot's host resources where the node tracks them.
    fn book_host(&mut self, node: usize, (cpu, mem): (i64, i64), sign: i64) {
        if let Some(c) = self.cpu_free[node].as_mut() {
            *c += sign * cpu;
        }
        if let Some(x) = self.mem_free[node].as_mut() {
            *x += sign * mem;
        }
    }

    /// The mix shape of slot `k` of `p` (`capacity.slot_shape`: GPUs, share rounded to 1e-6,
    /// host CPU and memory, accepted types), where the mix is kept and the slot holds GPUs
    /// that are not MIG slices (`Capacity._host`).
    fn shape(&self, m: &Model, p: &Placement, k: usize) -> Option<Shape> {
        let (node, devs) = &p.slots[k];
        let first = *devs.first()?;
        if !self.mix.enabled || parts::of(m, *node).profile_of(first).is_some() {
            return None;
        }
        Some(Shape {
            gpus: devs.len(),
            share_bits: pyfloat::round_to(p.share(k).fraction, 6).to_bits(),
            cpu: p.host.0,
            mem: p.host.1,
            accepts: p.accepts,
        })
    }

    /// Whether the node has the run's host CPU and memory free (`Capacity.host_fits`).
    pub fn host_fits(&self, node: usize, (cpu, mem): (i64, i64)) -> bool {
        if cpu == 0 && mem == 0 {
            return true;
        }
        self.cpu_free[node].is_none_or(|c| cpu <= c) && self.mem_free[node].is_none_or(|x| mem <= x)
    }

    /// How many schedulable nodes of group `g` have `gpus` or more free devices.
    pub fn count_at_least(&self, g: usize, gpus: usize) -> usize {
        self.buckets[g].iter().skip(gpus).map(|b| b.len()).sum()
    }
}
