//! Expected GPU fragmentation of a node for the mix of run shapes (FGD), as
//! `mlops_gpu.core.fragmentation` computes it, to the last bit (`pyfloat`).
//!
//! A node's `Sig` (module `sig`, with its transitions) is its free share per device that still
//! has some (largest first; whole free devices count 1.0), its free host CPU and memory (None:
//! not tracked) and its GPU type. For
//! one `Shape`, the fragment is the free share the shape could not use (all of it when the
//! shape does not fit at all); a node's expected fragmentation is the mix-weighted sum over
//! the shapes.
//!
//! Invariants (those of the Python `Mix`):
//! - `Mix` counts the shapes of the slots held on GPUs exactly (`add`/`remove` are inverses),
//!   so its weights depend only on which runs are active, never on the order they came;
//! - the weights: the commonest shapes (ties by shape, compared as Python compares the shape
//!   tuples: the accepted type names as strings), at most `TOP_K`, until they cover `COVERAGE`
//!   of the runs, each share rounded to 1/`QUANTUM` (ties to even); recomputed lazily, and the
//!   memo of node fragmentation by `Sig` is cleared only when they change;
//! - a shape's accepted types are interned (`AcceptSet`: the run's `gpu_types` names sorted,
//!   duplicates kept, as `slot_shape` keeps them), numbered in the order they were first seen:
//!   a number is an identity, never an order (orders compare the names).
//!
//! The prior (`Snapshot.shape_prior`, the packing simulator's) adds fixed counts to the
//! active runs' (`add_prior`): any finite, non-negative counts, whole or not. A prior shape
//! is keyed by its accepted types sorted (as an active run's), shapes equal but for that
//! order are one, their counts summed in the prior's order; every sum of counts runs in the
//! ranked order (count descending, then shape), as `Mix.weights` sums them, so no sum
//! depends on the order shapes came in.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::pyfloat;

mod sig;

pub use sig::{after_host, after_share, after_whole, Sig};

/// At most this many shapes weighed (`fragmentation.TOP_K`, where the choice is argued).
pub const TOP_K: usize = 128;
pub const COVERAGE: f64 = 0.95;
pub const QUANTUM: f64 = 1000.0;
pub const EPS: f64 = 1e-9;

/// The GPU types a run accepted, as its shape carries them.
#[derive(Clone)]
pub struct AcceptSet {
    /// The run's `gpu_types`, sorted, duplicates kept (empty: any type).
    pub names: Vec<String>,
    /// How many distinct names (`len(set(accepts))`).
    pub distinct: usize,
    /// The cluster's types among them, ascending (the type numbers of `Model`).
    pub types: Vec<usize>,
}

/// (GPUs per node, share of each GPU (1.0: whole), host CPU millicores, host memory MB,
/// accepted types): `fragmentation.Shape`. The share is kept as its bits (for hashing).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Shape {
    pub gpus: usize,
    pub share_bits: u64,
    pub cpu: i64,
    pub mem: i64,
    pub accepts: u32,
}

impl Shape {
    pub fn share(&self) -> f64 {
        f64::from_bits(self.share_bits)
    }
}

/// What the weights give, recomputed lazily after a change of the counts.
#[derive(Clone, Default)]
struct Derived {
    stale: bool,
    weights: Vec<(Shape, f64)>,
    cpu_per_gpu: Option<f64>,
    memo: HashMap<Sig, f64>,
    /// GPUs held per cluster type by runs restricted to some types (`Mix.restricted`).
    restricted: Option<Vec<f64>>,
}

/// `fragmentation.Mix`.
pub struct Mix {
    /// Whether fragmentation-aware placement is on (`policy.placement: fragmentation` on a
    /// cluster where it can matter); the mix is kept only then.
    pub enabled: bool,
    /// `sum()` as CPython 3.12 and later computes it (`pyfloat::sum`).
    pub compensated: bool,
    n_types: usize,
    counts: HashMap<Shape, i64>,
    /// The prior's shapes and counts, in its order (`Mix.prior`).
    prior: Vec<(Shape, f64)>,
    sets: Vec<AcceptSet>,
    ids: HashMap<Vec<String>, u32>,
    /// (a `Mutex`, not a `RefCell`, only so that the engine is `Sync` for PyO3: one thread
    /// uses it at a time)
    derived: Mutex<Derived>,
}

/// (a copy for an explanation pass, `Capacity` being cloned: the derived values with it)
impl Clone for Mix {
    fn clone(&self) -> Mix {
        Mix {
            enabled: self.enabled,
            compensated: self.compensated,
            n_types: self.n_types,
            counts: self.counts.clone(),
            prior: self.prior.clone(),
            sets: self.sets.clone(),
            ids: self.ids.clone(),
            derived: Mutex::new(self.derived().clone()),
        }
    }
}

impl Mix {
    pub fn new(n_types: usize) -> Mix {
        Mix {
            enabled: false,
            compensated: false,
            n_types,
            counts: HashMap::new(),
            prior: Vec::new(),
            sets: vec![AcceptSet {
                names: Vec::new(),
                distinct: 0,
                types: Vec::new(),
            }],
            ids: HashMap::from([(Vec::new(), 0)]),
            derived: Mutex::new(Derived {
                stale: true,
                ..Default::default()
            }),
        }
    }

    /// The number of the accepted-types set `names` (a run's `gpu_types`), whose cluster
    /// types are `types` (ascending); 0 is "any type".
    pub fn intern(&mut self, mut names: Vec<String>, types: &[usize]) -> u32 {
        names.sort_unstable();
        if let Some(&id) = self.ids.get(&names) {
            return id;
        }
        let mut distinct = names.clone();
        distinct.dedup();
        let id = self.sets.len() as u32;
        self.sets.push(AcceptSet {
            distinct: distinct.len(),
            names: names.clone(),
            types: types.to_vec(),
        });
        self.ids.insert(names, id);
        id
    }

    pub fn set(&self, id: u32) -> &AcceptSet {
        &self.sets[id as usize]
    }

    /// Python's order of two shapes (tuples whose last item is a tuple of type names).
    pub fn cmp_shapes(&self, a: &Shape, b: &Shape) -> Ordering {
        a.gpus
            .cmp(&b.gpus)
            .then(a.share().total_cmp(&b.share()))
            .then(a.cpu.cmp(&b.cpu))
            .then(a.mem.cmp(&b.mem))
            .then_with(|| self.set(a.accepts).names.cmp(&self.set(b.accepts).names))
    }

    /// Add one shape of the prior (`Mix(prior)`), in the prior's order; its count must be
    /// finite and not negative (`Snapshot` refuses others).
    pub fn add_prior(&mut self, p: &crate::spec::PriorShape) -> Result<(), String> {
        if !(p.count.is_finite() && p.count >= 0.0) {
            return Err(format!(
                "shape_prior: a count must be finite and not negative, got {}",
                p.count
            ));
        }
        let accepts = if p.accepts.is_empty() {
            0
        } else {
            self.intern(p.accepts.clone(), &p.gpu_types)
        };
        let shape = Shape {
            gpus: p.gpus,
            share_bits: p.share.to_bits(),
            cpu: p.cpu_milli,
            mem: p.host_memory_mb,
            accepts,
        };
        match self.prior.iter_mut().find(|x| x.0 == shape) {
            Some(x) => x.1 += p.count, // (the same shape but for its types' order)
            None => self.prior.push((shape, p.count)),
        }
        self.derived.get_mut().expect("not poisoned").stale = true;
        Ok(())
    }

    pub fn add(&mut self, shape: Shape) {
        *self.counts.entry(shape).or_insert(0) += 1;
        self.changed(shape);
    }

    pub fn remove(&mut self, shape: Shape) {
        if let Some(n) = self.counts.get_mut(&shape) {
            *n -= 1;
            if *n <= 0 {
                self.counts.remove(&shape);
            }
        }
        self.changed(shape);
    }

    fn changed(&mut self, shape: Shape) {
        let d = self.derived.get_mut().expect("not poisoned");
        d.stale = true;
        if shape.accepts != 0 {
            d.restricted = None;
        }
    }

    fn derived(&self) -> MutexGuard<'_, Derived> {
        self.derived.lock().expect("not poisoned")
    }

    fn sum<I: IntoIterator<Item = f64>>(&self, xs: I) -> f64 {
        pyfloat::sum(xs, self.compensated)
    }

    /// Bring the weights (and what follows from them) up to date (`Mix.weights`).
    fn refresh(&self) {
        if !self.derived().stale {
            return;
        }
        // the prior's counts plus the active runs' (`Mix.weights`)
        let mut ranked: Vec<(Shape, f64)> = self.prior.clone();
        let at: HashMap<Shape, usize> = ranked.iter().enumerate().map(|(k, x)| (x.0, k)).collect();
        for (s, &n) in &self.counts {
            match at.get(s) {
                Some(&k) => ranked[k].1 += n as f64,
                None => ranked.push((*s, n as f64)),
            }
        }
        ranked.sort_by(|a, b| {
            b.1.total_cmp(&a.1)
                .then_with(|| self.cmp_shapes(&a.0, &b.0))
        });
        // (summed in the ranked order, as `Mix.weights` sums them: counts need not be whole,
        // and a `HashMap`'s order is nobody's)
        let all = self.sum(ranked.iter().map(|x| x.1));
        ranked.truncate(TOP_K);
        let need = COVERAGE * all;
        let mut cum = 0.0;
        let mut top: Vec<(Shape, f64)> = Vec::new();
        for (s, n) in ranked {
            if cum >= need {
                break;
            }
            top.push((s, n));
            cum += n;
        }
        let total = self.sum(top.iter().map(|x| x.1));
        let w: Vec<(Shape, f64)> = top
            .into_iter()
            .map(|(s, n)| (s, pyfloat::round0(n / total * QUANTUM) / QUANTUM))
            .filter(|&(_, p)| p > 0.0)
            .collect();
        let mut d = self.derived();
        d.stale = false;
        if w != d.weights {
            d.memo.clear();
            let gpus = self.sum(w.iter().map(|(s, p)| p * s.gpus as f64 * s.share()));
            let cpu = self.sum(w.iter().map(|(s, p)| p * s.cpu as f64));
            d.cpu_per_gpu = (gpus > 0.0 && cpu > 0.0).then(|| cpu / gpus);
            d.weights = w;
        }
    }

    /// The mix's host CPU per GPU (millicores), or None without CPU requests.
    pub fn cpu_per_gpu(&self) -> Option<f64> {
        self.refresh();
        self.derived().cpu_per_gpu
    }

    /// How far a node in state `sig` is from the CPU per free GPU the mix needs, as a
    /// fraction of it, in steps of 1/4 (`Mix.imbalance`).
    pub fn imbalance(&self, sig: &Sig) -> f64 {
        let free = self.sum(sig.shares());
        let ratio = self.cpu_per_gpu();
        match (sig.cpu, ratio) {
            (Some(cpu), Some(ratio)) if free > EPS => {
                pyfloat::round0((cpu as f64 / free - ratio).abs() / ratio * 4.0) / 4.0
            }
            _ => 0.0,
        }
    }

    /// Expected fragment of a node in state `sig` under the current weights
    /// (`Mix.node_fragment`).
    pub fn node_fragment(&self, sig: &Sig) -> f64 {
        self.refresh();
        if let Some(&got) = self.derived().memo.get(sig) {
            return got;
        }
        let got = {
            let d = self.derived();
            self.sum(
                d.weights
                    .iter()
                    .map(|(s, p)| p * self.shape_fragment(sig, s)),
            )
        };
        self.derived().memo.insert(sig.clone(), got);
        got
    }

    /// The free GPU share of a node in state `sig` that a run of `shape` could not use
    /// (`fragmentation.shape_fragment`).
    pub fn shape_fragment(&self, sig: &Sig, shape: &Shape) -> f64 {
        let total = self.sum(sig.shares());
        if total <= EPS {
            return 0.0;
        }
        if shape.accepts != 0 && !self.set(shape.accepts).types.contains(&sig.ty) {
            return total;
        }
        if sig.cpu.is_some_and(|c| shape.cpu > c) || sig.mem.is_some_and(|m| shape.mem > m) {
            return total;
        }
        let share = shape.share();
        if share >= 1.0 - EPS {
            let whole = sig.shares().filter(|&x| x >= 1.0 - EPS).count();
            return if whole < shape.gpus {
                total
            } else {
                total - whole as f64
            };
        }
        let usable = self.sum(sig.shares().filter(|&x| x >= share - EPS));
        total - usable
    }

    /// GPUs held per cluster type by active runs that accept only some types: a run
    /// accepting k types counts 1/k of its GPU share on each, rounded to 1e-6
    /// (`Mix.restricted`; types outside the cluster are never read, so not kept).
    pub fn restricted(&self) -> Vec<f64> {
        if let Some(r) = &self.derived().restricted {
            return r.clone();
        }
        let mut shapes: Vec<(&Shape, i64)> = self
            .counts
            .iter()
            .filter(|(s, _)| s.accepts != 0)
            .map(|(s, &n)| (s, n))
            .collect();
        shapes.sort_by(|a, b| self.cmp_shapes(a.0, b.0));
        let mut out = vec![0.0; self.n_types];
        for (s, n) in shapes {
            let set = self.set(s.accepts);
            let each = (n * s.gpus as i64) as f64 * s.share() / set.distinct as f64;
            for &t in &set.types {
                out[t] += each;
            }
        }
        for v in out.iter_mut() {
            *v = pyfloat::round_to(*v, 6);
        }
        self.derived().restricted = Some(out.clone());
        out
    }
}

#[cfg(test)]
mod tests;
