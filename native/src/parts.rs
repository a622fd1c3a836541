//! Parts of GPUs: MIG slices and shared devices (`mlops_gpu.model.Node.mig`/`shared`,
//! `ResourceRequest.shape`), and how `capacity::Capacity` books them (`Capacity.take` and
//! `release` in `mlops_gpu/core/capacity.py`).
//!
//! Invariants:
//! - a node's MIG slices are device numbers after its whole devices (`Node::ndev`), profile
//!   after profile in the node's order (`NodeParts::mig`), each profile's slices in the
//!   node's order; MIG profiles are numbered in the sorted order of their names across the
//!   cluster (a profile no node offers: a number no node has);
//! - `Capacity::mig_free[node][k]` lists the free slices of the node's `k`-th profile in the
//!   node's order; `Capacity::shared[node]` holds (device, fraction, memory MB) of every
//!   device shared runs hold, and such a device is not in `Capacity::free`;
//! - booking a slot and giving it back are exact inverses, with the float operations of the
//!   Python core in the same order (so the fractions held compare alike).

use crate::capacity::{units, Capacity, UNIT};
use crate::model::Model;

/// How a run takes GPUs (`ResourceRequest.shape`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Shape {
    /// `gpus` whole devices on each of `nodes` nodes.
    Whole,
    /// `gpus` slices of MIG profile `profile` on one node, each charged `share` of a GPU
    /// (`mig_share`).
    Mig { profile: usize, share: f64 },
    /// Part of one device: a fraction of it, a memory cap (MB), or both.
    Shared {
        fraction: Option<f64>,
        memory_mb: Option<i64>,
    },
    /// No GPU (`gpus` 0, one node): host CPU and/or memory only, on a node of one of its
    /// types (`placement._place_cpu`); it is charged no quota.
    Cpu,
}

impl Shape {
    pub fn is_whole(&self) -> bool {
        matches!(self, Shape::Whole)
    }

    /// Whether a placement's amount is the request's wherever it lands: every shape but a
    /// memory-only shared request, charged its memory's share of the device it gets.
    pub fn amount_fixed(&self) -> bool {
        !matches!(self, Shape::Shared { fraction: None, .. })
    }

    /// What tells two shapes apart in a queue key (floats by their bits: equal requests are
    /// equal numbers).
    pub fn key(&self) -> (u8, usize, u64, Option<i64>) {
        match *self {
            Shape::Whole => (0, 0, 0, None),
            Shape::Mig { profile, share } => (1, profile, share.to_bits(), None),
            Shape::Shared {
                fraction,
                memory_mb,
            } => (
                2,
                usize::from(fraction.is_some()),
                fraction.unwrap_or(0.0).to_bits(),
                memory_mb,
            ),
            Shape::Cpu => (3, 0, 0, None),
        }
    }
}

/// The share of each device a slot holds (`NodeSlot.fraction`, `memory_mb`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlotShare {
    pub fraction: f64,
    pub memory_mb: Option<i64>,
}

impl SlotShare {
    pub const WHOLE: SlotShare = SlotShare {
        fraction: 1.0,
        memory_mb: None,
    };

    /// Whole devices (`fraction >= 1.0 and memory_mb is None`, as the Python core tests it).
    pub fn whole(&self) -> bool {
        self.fraction >= 1.0 && self.memory_mb.is_none()
    }
}

/// A node's MIG slices and sharing; the default: none.
#[derive(Clone, Debug, Default)]
pub struct NodeParts {
    /// Per MIG profile the node offers, in its order: (profile number, first slice number,
    /// slices).
    pub mig: Vec<(usize, u16, u16)>,
    /// Whether its backend places MIG requests (`BackendCapabilities.mig`).
    pub mig_placeable: bool,
    /// Whether shared requests may use its devices (`Node.shared` and the backend's
    /// `shared_gpus`).
    pub shared: bool,
    /// Memory of one device (`Node.gpu_memory_mb`).
    pub gpu_memory_mb: Option<i64>,
    /// Per whole device: its rank in the order of the devices' names (shared placement breaks
    /// ties by device name); empty when the node is not shared.
    pub name_rank: Vec<u32>,
}

impl NodeParts {
    /// The node's own index of MIG profile `profile` (None: it does not offer it).
    pub fn local(&self, profile: usize) -> Option<usize> {
        self.mig.iter().position(|&(p, _, _)| p == profile)
    }

    /// The node's own index of the profile slice `dev` belongs to (None: a whole device).
    pub fn profile_of(&self, dev: u16) -> Option<usize> {
        self.mig
            .iter()
            .position(|&(_, first, n)| dev >= first && dev < first + n)
    }

    /// Device numbers in all: whole devices and slices.
    pub fn end(&self, ndev: usize) -> usize {
        self.mig
            .iter()
            .map(|&(_, first, n)| (first + n) as usize)
            .max()
            .unwrap_or(ndev)
            .max(ndev)
    }
}

/// Per node, per its profiles: every slice free (`Capacity.mig_free` of an empty cluster).
pub fn mig_free(m: &Model) -> Vec<Vec<Vec<u16>>> {
    (0..m.nodes.len())
        .map(|n| {
            m.parts
                .get(n)
                .map(|p| {
                    p.mig
                        .iter()
                        .map(|&(_, first, k)| (first..first + k).collect())
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect()
}

/// The node's parts (the default for a node without any).
pub fn of(m: &Model, node: usize) -> &NodeParts {
    static NONE: std::sync::OnceLock<NodeParts> = std::sync::OnceLock::new();
    m.parts
        .get(node)
        .unwrap_or_else(|| NONE.get_or_init(NodeParts::default))
}

impl Capacity {
    /// Book a slot that is not plain whole devices on a node without slices, device by
    /// device (`Capacity.take`'s loop).
    pub fn take_parts(&mut self, m: &Model, node: usize, devs: &[u16], share: SlotShare) {
        let parts = of(m, node);
        for &dev in devs {
            if let Some(k) = parts.profile_of(dev) {
                let free = &mut self.mig_free[node][k];
                match free.iter().position(|&x| x == dev) {
                    Some(at) => {
                        free.remove(at);
                    }
                    // (held by another run already, one loaded from a store)
                    None => *self.again.entry((node, dev)).or_insert(0) += 1,
                }
            } else if share.whole() {
                self.take_devices(node, &[dev]);
            } else {
                let u = self.share_units.entry((node, dev)).or_insert(0);
                *u += units(share.fraction);
                let frac = *u as f64 / UNIT;
                let held = &mut self.shared[node];
                match held.iter_mut().find(|x| x.0 == dev) {
                    Some(x) => {
                        x.1 = frac;
                        x.2 += share.memory_mb.unwrap_or(0);
                    }
                    None => {
                        held.push((dev, frac, share.memory_mb.unwrap_or(0)));
                        self.take_devices(node, &[dev]); // (its first shared holder holds it)
                    }
                }
            }
        }
    }

    /// Give back what `take_parts` booked (`Capacity.release`'s loop).
    pub fn release_parts(&mut self, m: &Model, node: usize, devs: &[u16], share: SlotShare) {
        let parts = of(m, node);
        for &dev in devs {
            if let Some(k) = parts.profile_of(dev) {
                if !self.again.is_empty() && self.release_again(node, dev) {
                    continue; // (other runs hold it too)
                }
                let free = &mut self.mig_free[node][k];
                free.push(dev);
                free.sort_unstable();
            } else if share.whole() {
                self.free_devices(node, &[dev]);
            } else {
                let held = &mut self.shared[node];
                let Some(at) = held.iter().position(|x| x.0 == dev) else {
                    continue; // (never: it was booked)
                };
                let u = self.share_units.get(&(node, dev)).copied().unwrap_or(0);
                let u = u - units(share.fraction);
                let (frac, mem) = (u as f64 / UNIT, held[at].2 - share.memory_mb.unwrap_or(0));
                if frac <= 1e-9 && mem <= 0 {
                    held.remove(at);
                    self.share_units.remove(&(node, dev));
                    self.free_devices(node, &[dev]);
                } else {
                    held[at] = (dev, frac, mem);
                    self.share_units.insert((node, dev), u);
                }
            }
        }
    }
}

/// One MIG profile a node offers: its number (profiles numbered by name across the cluster)
/// and how many slices of it the node has.
#[derive(Clone, Copy, Debug)]
pub struct MigSpec {
    pub profile: usize,
    pub slices: usize,
}

/// A node's MIG slices and sharing (`Settings::parts`; nodes without one have neither).
#[derive(Clone, Debug)]
pub struct PartSpec {
    pub node: usize,
    /// Its profiles in the node's order; their slices are numbered after its whole devices.
    pub mig: Vec<MigSpec>,
    /// Whether its backend places MIG requests.
    pub mig_placeable: bool,
    /// Whether shared requests may use its devices (the node is shared, its backend shares).
    pub shared: bool,
    /// Whether the node is shared, whatever its backend (`Node.shared`): fragmentation-aware
    /// placement then weighs the cluster (`Capacity.fragmentable`).
    pub shared_node: bool,
    pub gpu_memory_mb: Option<i64>,
    /// Per whole device, its rank by name (empty: device order is name order).
    pub name_rank: Vec<u32>,
}

/// `Model::parts` from the specs, checked: known nodes, each once; device numbers that fit.
pub fn build(ndev: &[usize], specs: Vec<PartSpec>) -> Result<Vec<NodeParts>, String> {
    let mut out = vec![NodeParts::default(); if specs.is_empty() { 0 } else { ndev.len() }];
    let mut seen = vec![false; out.len()];
    for s in specs {
        if s.node >= ndev.len() || seen[s.node] {
            return Err(format!("parts: node {} is unknown or given twice", s.node));
        }
        seen[s.node] = true;
        let n = ndev[s.node];
        if !s.name_rank.is_empty() && s.name_rank.len() != n {
            return Err(format!("parts: node {}: one name rank per device", s.node));
        }
        let mut first = n;
        let mut mig = Vec::with_capacity(s.mig.len());
        for p in s.mig {
            if first + p.slices > u16::MAX as usize || mig.iter().any(|&(q, _, _)| q == p.profile) {
                return Err(format!(
                    "parts: node {}: too many slices, or a profile twice",
                    s.node
                ));
            }
            mig.push((p.profile, first as u16, p.slices as u16));
            first += p.slices;
        }
        out[s.node] = NodeParts {
            mig,
            mig_placeable: s.mig_placeable,
            shared: s.shared,
            gpu_memory_mb: s.gpu_memory_mb,
            name_rank: s.name_rank,
        };
    }
    Ok(out)
}

/// A run's shape, checked (the Python side validates requests; nothing here may panic later):
/// every shape but `Cpu` takes at least one GPU on at least one node, `Cpu` none on one node.
pub fn check(shape: &Shape, gpus: usize, nodes: usize) -> Result<(), String> {
    if (gpus == 0) != (*shape == Shape::Cpu) || nodes == 0 {
        return Err(
            "it asks for no node, or for no GPU without being CPU-only (or for GPUs being so)"
                .into(),
        );
    }
    match *shape {
        Shape::Whole => Ok(()),
        Shape::Cpu if nodes == 1 => Ok(()),
        Shape::Mig { share, .. } if nodes == 1 && share.is_finite() && share > 0.0 => Ok(()),
        Shape::Shared {
            fraction,
            memory_mb,
        } if nodes == 1
            && gpus == 1
            && (fraction.is_some() || memory_mb.is_some())
            && fraction.is_none_or(|f| f > 0.0 && f <= 1.0)
            && memory_mb.is_none_or(|x| x > 0) =>
        {
            Ok(())
        }
        _ => Err(
            "a MIG request takes slices on one node, a shared one part of one GPU (a \
                  fraction in (0, 1] and/or a positive memory cap), a CPU-only one one node"
                .into(),
        ),
    }
}
