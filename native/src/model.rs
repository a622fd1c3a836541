//! The cluster, projects and policy a native engine schedules for, interned to indices.
//!
//! Invariants (the Python side, `mlops_gpu/engines/native.py`, builds it so):
//! - GPU types, backends, nodes and projects are numbered in the sorted order of their names,
//!   so comparing indices compares names (the Python core breaks ties by name);
//! - `of_type[t]` lists the nodes of type `t` in the snapshot's node order (the order
//!   `placement.eligible_nodes` walks);
//! - `members[root]` lists a cohort tree's projects in the snapshot's project order;
//! - every quota term is whole GPUs; usage adds slices' shares and fractions too, in the
//!   Python core's order of takes and releases (the same float operations), so it compares
//!   alike.

/// One node: `ndev` whole devices (numbered in the node's own device order).
pub struct Node {
    pub ty: usize,
    pub backend: usize,
    pub ndev: usize,
    pub schedulable: bool,
    /// Per topology key: the number of the node's value for it (values numbered in name
    /// order per key), None where the node lacks the key.
    pub labels: Vec<Option<u32>>,
    /// Host CPU (millicores) and memory (MB) the node offers runs; None: not tracked.
    pub cpu_milli: Option<i64>,
    pub host_memory_mb: Option<i64>,
}

/// A project's quota on one GPU type (`mlops_gpu.model.Quota`).
#[derive(Clone, Copy)]
pub struct Term {
    pub nominal: f64,
    pub borrowing: Option<f64>,
    pub lending: Option<f64>,
}

pub struct Project {
    pub weight: f64,
    pub root: Option<usize>,
    /// One term per GPU type (a type without a quota entry: nominal 0, borrowing limit 0).
    pub terms: Vec<Term>,
}

/// The order inside a priority class and project (`PolicySettings.order`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Order {
    Shortest,
    Submit,
    /// least attained service, by level (`las_thresholds`)
    Las,
}

pub struct Policy {
    pub order: Order,
    /// GPU-seconds of attained service that start each next LAS level, ascending.
    pub las_thresholds: Vec<f64>,
    pub strict_fifo: bool,
    pub fair_share: bool,
    pub half_life_s: f64,
    pub preemption: bool,
    pub backfill: bool,
    pub shortest_preempt_ratio: f64,
    /// Seconds a run must have run before a run of its own project and class may preempt it
    /// (`PolicySettings.min_runtime_before_preemption_s`).
    pub min_runtime_s: f64,
    /// Whether a run of the same project and class may preempt a run that never reported a
    /// checkpoint (`PolicySettings.preempt_uncheckpointed`).
    pub preempt_uncheckpointed: bool,
    /// Under `shortest` with preemption: a run may also take a long run of another project of
    /// its cohort tree that borrowed as the cycle began (`preempt::borrowers`).
    pub shortest_preempt_borrowers: bool,
    /// The margin (>= 1) by which the victim's project's fair share must stay above the
    /// preemptor's project's (`PolicySettings.borrower_share_ratio`).
    pub borrower_share_ratio: f64,
}

pub struct Model {
    pub n_types: usize,
    pub nodes: Vec<Node>,
    /// Per backend: `BackendCapabilities.multi_node`.
    pub multi_node: Vec<bool>,
    pub projects: Vec<Project>,
    pub members: Vec<Vec<usize>>,
    /// Per GPU type: the devices of every node of the type (`Capacity.capacity_by_type`).
    pub capacity_by_type: Vec<f64>,
    pub of_type: Vec<Vec<usize>>,
    /// The (type, backend) pairs with schedulable nodes, sorted: the free-count index's keys.
    pub groups: Vec<(usize, usize)>,
    pub policy: Policy,
    /// Per node: its MIG slices and sharing (`parts`; shorter than `nodes`: none on the rest).
    pub parts: Vec<crate::parts::NodeParts>,
}

impl Policy {
    /// A run's LAS level: how many thresholds its attained service reached
    /// (`fairshare.las_level`).
    pub fn las_level(&self, attained_gpu_s: f64) -> i64 {
        self.las_thresholds
            .partition_point(|&t| t <= attained_gpu_s) as i64
    }
}

impl Model {
    pub fn term(&self, project: usize, ty: usize) -> Term {
        self.projects[project].terms[ty]
    }

    /// Index of project `p`'s usage of type `t` in per-(project, type) vectors.
    #[inline]
    pub fn pt(&self, p: usize, t: usize) -> usize {
        p * self.n_types + t
    }
}
