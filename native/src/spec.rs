//! The engine's named structures: what it takes (`Settings` and its parts, `RunSpec`, `Held`)
//! and what a cycle decides (`Admitted`, `Preempted`), types, backends, nodes and projects as
//! indices. Plain data: `engine` checks every index and time once, on the way in.

use crate::parts::{PartSpec, Shape, SlotShare};

/// One node (`mlops_gpu.model.Node`), its type and backend as indices.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub gpu_type: usize,
    pub backend: usize,
    /// Whole devices, numbered in the node's own device order.
    pub devices: usize,
    pub schedulable: bool,
    /// Per topology key: the number of the node's value (values numbered in name order per
    /// key), None where it lacks the key.
    pub labels: Vec<Option<u32>>,
    /// Host CPU (millicores) and memory (MB) it offers runs; None: not tracked.
    pub cpu_milli: Option<i64>,
    pub host_memory_mb: Option<i64>,
}

/// A project's quota on one GPU type (`mlops_gpu.model.Quota`).
#[derive(Clone, Copy, Debug)]
pub struct QuotaSpec {
    pub nominal: f64,
    pub borrowing_limit: Option<f64>,
    pub lending_limit: Option<f64>,
}

#[derive(Clone, Debug)]
pub struct ProjectSpec {
    pub weight: f64,
    /// The project's cohort tree (an index into `Settings::members`), if any.
    pub root: Option<usize>,
    /// One quota per GPU type, in type order.
    pub quotas: Vec<QuotaSpec>,
}

/// `mlops_gpu.core.PolicySettings`, the parts the engine reads.
#[derive(Clone, Debug)]
pub struct PolicySpec {
    /// `shortest`, `submit` or `las`.
    pub order: String,
    pub las_thresholds_gpu_s: Vec<f64>,
    pub strict_fifo: bool,
    pub fair_share: bool,
    pub half_life_s: f64,
    pub preemption: bool,
    pub backfill: bool,
    pub shortest_preempt_ratio: f64,
    pub min_runtime_before_preemption_s: f64,
    pub preempt_uncheckpointed: bool,
    /// `PolicySettings.shortest_preempt_borrowers` and `borrower_share_ratio` (>= 1).
    pub shortest_preempt_borrowers: bool,
    pub borrower_share_ratio: f64,
    /// `best-fit` or `fragmentation` (`fgd`: on where nodes track host CPU or memory).
    pub placement: String,
}

/// What an engine is built around (see `model.rs` for how the indices are numbered).
#[derive(Clone, Debug)]
pub struct Settings {
    pub n_types: usize,
    pub nodes: Vec<NodeSpec>,
    /// Per backend: whether a run may span nodes.
    pub multi_node: Vec<bool>,
    pub projects: Vec<ProjectSpec>,
    /// Per cohort tree: its projects in the snapshot's project order.
    pub members: Vec<Vec<usize>>,
    /// Per GPU type: the devices of every node of the type.
    pub capacity_by_type: Vec<f64>,
    /// Per GPU type: its nodes in the snapshot's node order.
    pub of_type: Vec<Vec<usize>>,
    pub policy: PolicySpec,
    /// The nodes with MIG slices or shared devices (`parts`).
    pub parts: Vec<PartSpec>,
    /// Whether Python's `sum()` of floats is compensated (CPython 3.12 and later: `pyfloat`).
    pub compensated_sum: bool,
    /// The workload's expected shapes (`Snapshot.shape_prior`), in its order; empty: none.
    pub shape_prior: Vec<PriorShape>,
}

/// One shape of a prior (`fragmentation.Shape` and its count): what fragmentation-aware
/// placement weighs beside the active runs' shapes.
#[derive(Clone, Debug)]
pub struct PriorShape {
    pub gpus: usize,
    /// The share of each GPU (1.0: whole), as the shape has it.
    pub share: f64,
    pub cpu_milli: i64,
    pub host_memory_mb: i64,
    /// The GPU types it accepts by name, in any order (empty: any), and those of the cluster.
    pub accepts: Vec<String>,
    pub gpu_types: Vec<usize>,
    /// How many runs of the shape it counts: finite, not negative, whole or not.
    pub count: f64,
}

/// A run as the engine queues it (`mlops_gpu.model.Run`).
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub id: String,
    pub seq: i64,
    pub project: usize,
    /// Its priority class's priority.
    pub priority: i64,
    /// GPUs per node, and nodes.
    pub gpus: usize,
    pub nodes: usize,
    /// The accepted GPU types, ascending.
    pub gpu_types: Vec<usize>,
    /// The backend it is pinned to (a number no node has: nothing can host it).
    pub backend: Option<usize>,
    /// The topology key (a number no node's labels reach: no node has it), and whether it is
    /// required (else preferred).
    pub topology_key: Option<usize>,
    pub topology_required: bool,
    /// Whole GPUs, MIG slices or part of a shared device.
    pub shape: Shape,
    /// Host CPU (millicores) and memory (MB) on each of its nodes (0: none asked).
    pub cpu_milli: i64,
    pub host_memory_mb: i64,
    pub max_runtime_s: Option<f64>,
    pub preemptible: bool,
    pub grace_s: f64,
    pub submitted_at: f64,
    pub last_checkpoint_at: Option<f64>,
    pub attained_gpu_s: f64,
    /// Its `gpu_types` as named (unsorted, duplicates kept; empty: any): the shape it adds to
    /// the fragmentation mix (`fragmentation::AcceptSet`).
    pub accepts: Vec<String>,
}

/// GPUs on one node: (node, device numbers).
pub type Slot = (usize, Vec<u16>);

/// Where a run already holds GPUs (loaded from a store).
#[derive(Clone, Debug)]
pub struct Held {
    pub backend: usize,
    pub gpu_type: usize,
    /// Slots on the nodes the cluster has.
    pub slots: Vec<Slot>,
    /// All the GPUs it holds (some may be on nodes the cluster no longer has).
    pub gpus: usize,
    pub admitted_at: Option<f64>,
    pub started_at: Option<f64>,
    /// It is being preempted, and then holds nothing (its devices are free here, or held by
    /// the run admitted in its place).
    pub going: bool,
    /// Per slot, the share of each device it holds (empty: whole devices; then every slot's
    /// node must be the cluster's).
    pub shares: Vec<SlotShare>,
    /// What it is charged where that is not its slots' amount (`capacity::Placement::charged`).
    pub charged: Option<f64>,
}

/// A run a cycle admitted, and where.
#[derive(Clone, Debug, PartialEq)]
pub struct Admitted {
    pub run_id: String,
    pub backend: usize,
    pub gpu_type: usize,
    pub slots: Vec<Slot>,
    /// The share of each device held: 1.0 for whole GPUs, the fraction of a shared device,
    /// a MIG slice's share.
    pub fraction: f64,
}

/// A run a cycle preempts, for a run admitted in the same cycle.
#[derive(Clone, Debug, PartialEq)]
pub struct Preempted {
    pub run_id: String,
    pub for_run_id: String,
    pub lost_gpu_s: f64,
    /// Taken by `policy.shortest_preempt_borrowers` (not reclaimed, not a lower class): the
    /// fair shares of the victim's project and the preemptor's as the plan was chosen.
    pub borrower_shares: Option<(f64, f64)>,
}
