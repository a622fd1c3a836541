//! `mlops_gpu_native`: the scheduling core's incremental engine in Rust, as a plain library
//! (no Python: `cargo test` here needs none). The PyO3 boundary is its own crate, `native/py`,
//! built by `pip install` as the module `mlops_gpu._engine`.
//!
//! The same decisions as the Python reference (`mlops_gpu.engines.reference.FromScratch`, `decide`
//! on a snapshot per cycle) for every request and policy (whole GPUs; MIG slices and shared
//! devices: `parts`, `mig`, `shared`; host CPU and memory: `capacity`; CPU-only runs:
//! `placement::place_cpu`; under fragmentation-aware placement, with or without a shape
//! prior: `fgd`, `fragmentation`, `type_choice`; budgets:
//! `budget`; topology: `topology`; borrowers preempted shortest-first: `preempt::borrowers`);
//! `mlops_gpu/engines/native.py` checks that, turns names into indices and
//! builds the `Decision`. Pure: the clock comes in each call. `engine` is the whole public
//! API (`Engine`, `Settings`, `RunSpec`, ...).

mod backfill;
pub mod budget;
mod capacity;
mod cycle;
mod dormancy;
pub mod engine;
mod eta;
pub mod explain;
mod fgd;
mod fragmentation;
mod mig;
mod model;
mod nofit;
pub mod parts;
mod placement;
mod preempt;
mod pyfloat;
mod quota;
mod shared;
mod spec;
mod state;
#[cfg(test)]
mod tests;
mod topology;
mod type_choice;
mod verdict;

pub use budget::BudgetSpent;
pub use engine::{
    Admitted, Engine, Held, NodeSpec, PolicySpec, Preempted, PriorShape, ProjectSpec, QuotaSpec,
    RunSpec, Settings, Slot,
};
pub use eta::NoEta;
pub use explain::{Borrower, Explanation, Pending, QuotaProblem, Reason};
pub use parts::{Shape, SlotShare};
