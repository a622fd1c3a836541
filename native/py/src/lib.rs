//! `mlops_gpu._engine`: the PyO3 boundary of the engine in `native/` (the library crate
//! `mlops_gpu_native`), and nothing else: each class here wraps one of the library's named
//! structures, built with keyword arguments, and every error is a `ValueError` (what a cycle
//! or an explanation hands back: `decision`; MIG and shared-GPU classes: `parts`).
//! `mlops_gpu/_engine.pyi` types it for mypy; `mlops_gpu/engines/native.py` is its one caller.

mod decision;
mod parts;

use mlops_gpu_native as lib;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use decision::{explanation, Admitted, Explanation, Preempted, Reason};

fn err(e: String) -> PyErr {
    PyValueError::new_err(e)
}

/// One node: its GPU type and backend as indices, its whole devices.
#[pyclass(frozen, module = "mlops_gpu._engine")]
#[derive(Clone)]
struct NodeSpec(lib::NodeSpec);

#[pymethods]
impl NodeSpec {
    #[new]
    #[pyo3(signature = (
        *, gpu_type, backend, devices, schedulable, labels, cpu_milli, host_memory_mb
    ))]
    fn new(
        gpu_type: usize,
        backend: usize,
        devices: usize,
        schedulable: bool,
        labels: Vec<Option<u32>>,
        cpu_milli: Option<i64>,
        host_memory_mb: Option<i64>,
    ) -> Self {
        NodeSpec(lib::NodeSpec {
            gpu_type,
            backend,
            devices,
            schedulable,
            labels,
            cpu_milli,
            host_memory_mb,
        })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// A project's quota on one GPU type.
#[pyclass(frozen, module = "mlops_gpu._engine")]
#[derive(Clone)]
struct QuotaSpec(lib::QuotaSpec);

#[pymethods]
impl QuotaSpec {
    #[new]
    #[pyo3(signature = (*, nominal, borrowing_limit, lending_limit))]
    fn new(nominal: f64, borrowing_limit: Option<f64>, lending_limit: Option<f64>) -> Self {
        QuotaSpec(lib::QuotaSpec {
            nominal,
            borrowing_limit,
            lending_limit,
        })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// A project: its fair-share weight, cohort tree and one quota per GPU type.
#[pyclass(frozen, module = "mlops_gpu._engine")]
#[derive(Clone)]
struct ProjectSpec(lib::ProjectSpec);

#[pymethods]
impl ProjectSpec {
    #[new]
    #[pyo3(signature = (*, weight, root, quotas))]
    fn new(weight: f64, root: Option<usize>, quotas: Vec<QuotaSpec>) -> Self {
        ProjectSpec(lib::ProjectSpec {
            weight,
            root,
            quotas: quotas.into_iter().map(|q| q.0).collect(),
        })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// The policy settings the engine reads.
#[pyclass(frozen, module = "mlops_gpu._engine")]
#[derive(Clone)]
struct PolicySpec(lib::PolicySpec);

#[pymethods]
impl PolicySpec {
    #[new]
    #[pyo3(signature = (
        *, order, las_thresholds_gpu_s, strict_fifo, fair_share, half_life_s, preemption,
        backfill, shortest_preempt_ratio, min_runtime_before_preemption_s,
        preempt_uncheckpointed, placement, shortest_preempt_borrowers,
        borrower_share_ratio
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        order: String,
        las_thresholds_gpu_s: Vec<f64>,
        strict_fifo: bool,
        fair_share: bool,
        half_life_s: f64,
        preemption: bool,
        backfill: bool,
        shortest_preempt_ratio: f64,
        min_runtime_before_preemption_s: f64,
        preempt_uncheckpointed: bool,
        placement: String,
        shortest_preempt_borrowers: bool,
        borrower_share_ratio: f64,
    ) -> Self {
        PolicySpec(lib::PolicySpec {
            order,
            las_thresholds_gpu_s,
            strict_fifo,
            fair_share,
            half_life_s,
            preemption,
            backfill,
            shortest_preempt_ratio,
            min_runtime_before_preemption_s,
            preempt_uncheckpointed,
            shortest_preempt_borrowers,
            borrower_share_ratio,
            placement,
        })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// One shape of a prior and its count (`fragmentation.Shape`; `Snapshot.shape_prior`).
#[pyclass(frozen, module = "mlops_gpu._engine")]
#[derive(Clone)]
struct PriorShape(lib::PriorShape);

#[pymethods]
impl PriorShape {
    #[new]
    #[pyo3(signature = (*, gpus, share, cpu_milli, host_memory_mb, accepts, gpu_types, count))]
    fn new(
        gpus: usize,
        share: f64,
        cpu_milli: i64,
        host_memory_mb: i64,
        accepts: Vec<String>,
        gpu_types: Vec<usize>,
        count: f64,
    ) -> Self {
        PriorShape(lib::PriorShape {
            gpus,
            share,
            cpu_milli,
            host_memory_mb,
            accepts,
            gpu_types,
            count,
        })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// What an engine is built around.
#[pyclass(frozen, module = "mlops_gpu._engine")]
#[derive(Clone)]
struct Settings(lib::Settings);

#[pymethods]
impl Settings {
    #[new]
    #[pyo3(signature = (
        *, n_types, nodes, multi_node, projects, members, capacity_by_type, of_type, policy,
        parts=Vec::new(), shape_prior=Vec::new()
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        n_types: usize,
        nodes: Vec<NodeSpec>,
        multi_node: Vec<bool>,
        projects: Vec<ProjectSpec>,
        members: Vec<Vec<usize>>,
        capacity_by_type: Vec<f64>,
        of_type: Vec<Vec<usize>>,
        policy: PolicySpec,
        parts: Vec<parts::PartSpec>,
        shape_prior: Vec<PriorShape>,
    ) -> Self {
        Settings(lib::Settings {
            n_types,
            nodes: nodes.into_iter().map(|n| n.0).collect(),
            multi_node,
            projects: projects.into_iter().map(|p| p.0).collect(),
            members,
            capacity_by_type,
            of_type,
            policy: policy.0,
            parts: parts.into_iter().map(|p| p.0).collect(),
            // this interpreter's sum() of floats, which the fragmentation scores must match
            compensated_sum: py.version_info() >= (3, 12),
            shape_prior: shape_prior.into_iter().map(|p| p.0).collect(),
        })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// A run as the engine queues it.
#[pyclass(frozen, module = "mlops_gpu._engine")]
#[derive(Clone)]
struct RunSpec(lib::RunSpec);

#[pymethods]
impl RunSpec {
    #[new]
    #[pyo3(signature = (
        *, id, seq, project, priority, gpus, nodes, gpu_types, backend, topology_key,
        topology_required, cpu_milli, host_memory_mb, max_runtime_s, preemptible, grace_s,
        submitted_at, last_checkpoint_at, attained_gpu_s, accepts, shape=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        id: String,
        seq: i64,
        project: usize,
        priority: i64,
        gpus: usize,
        nodes: usize,
        gpu_types: Vec<usize>,
        backend: Option<usize>,
        topology_key: Option<usize>,
        topology_required: bool,
        cpu_milli: i64,
        host_memory_mb: i64,
        max_runtime_s: Option<f64>,
        preemptible: bool,
        grace_s: f64,
        submitted_at: f64,
        last_checkpoint_at: Option<f64>,
        attained_gpu_s: f64,
        accepts: Vec<String>,
        shape: Option<parts::ShapeSpec>,
    ) -> Self {
        RunSpec(lib::RunSpec {
            id,
            seq,
            project,
            priority,
            gpus,
            nodes,
            gpu_types,
            backend,
            topology_key,
            topology_required,
            cpu_milli,
            host_memory_mb,
            max_runtime_s,
            preemptible,
            grace_s,
            submitted_at,
            last_checkpoint_at,
            attained_gpu_s,
            shape: shape.map_or(lib::Shape::Whole, |s| s.0),
            accepts,
        })
    }

    #[getter]
    fn id(&self) -> &str {
        &self.0.id
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// Where a run already holds GPUs.
#[pyclass(frozen, module = "mlops_gpu._engine")]
#[derive(Clone)]
struct Held(lib::Held);

#[pymethods]
impl Held {
    #[new]
    #[pyo3(signature = (
        *, backend, gpu_type, slots, gpus, admitted_at, started_at, going, shares=None,
        charged=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        backend: usize,
        gpu_type: usize,
        slots: Vec<lib::Slot>,
        gpus: usize,
        admitted_at: Option<f64>,
        started_at: Option<f64>,
        going: bool,
        shares: Option<Vec<parts::SlotShare>>,
        charged: Option<f64>,
    ) -> Self {
        Held(lib::Held {
            backend,
            gpu_type,
            slots,
            gpus,
            admitted_at,
            started_at,
            going,
            shares: shares
                .unwrap_or_default()
                .into_iter()
                .map(|s| s.0)
                .collect(),
            charged,
        })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// A project whose budget for the current window is spent: its runs are served at class
/// value `lower_to`, or wait (None).
#[pyclass(frozen, module = "mlops_gpu._engine")]
#[derive(Clone)]
struct BudgetSpent(lib::BudgetSpent);

#[pymethods]
impl BudgetSpent {
    #[new]
    #[pyo3(signature = (*, project, lower_to))]
    fn new(project: usize, lower_to: Option<i64>) -> Self {
        BudgetSpent(lib::BudgetSpent { project, lower_to })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// The incremental engine (`lib::Engine`).
#[pyclass(module = "mlops_gpu._engine")]
struct Engine(lib::Engine);

#[pymethods]
impl Engine {
    #[new]
    fn new(settings: &Settings) -> PyResult<Self> {
        lib::Engine::new(settings.0.clone())
            .map(Engine)
            .map_err(err)
    }

    fn submit(&mut self, run: &RunSpec) -> PyResult<()> {
        self.0.submit(run.0.clone()).map_err(err)
    }

    fn add_active(&mut self, run: &RunSpec, held: &Held) -> PyResult<()> {
        self.0
            .add_active(run.0.clone(), held.0.clone())
            .map_err(err)
    }

    fn withdraw(&mut self, id: &str) -> PyResult<()> {
        self.0.withdraw(id).map_err(err)
    }

    fn checkpoint(&mut self, id: &str, at: f64) -> PyResult<()> {
        self.0.checkpoint(id, at).map_err(err)
    }

    fn used(&self) -> Vec<f64> {
        self.0.used().to_vec()
    }

    fn finish(&mut self, id: &str) -> PyResult<()> {
        self.0.finish(id).map_err(err)
    }

    /// The run that keeps the reservation next cycle (`Snapshot.anchor`), or None.
    fn anchor(&self) -> Option<String> {
        self.0.anchor()
    }

    /// Name the run that keeps the reservation next cycle (None: no run), e.g. after a
    /// rebuild around other nodes.
    #[pyo3(signature = (id=None))]
    fn set_anchor(&mut self, id: Option<&str>) -> PyResult<()> {
        self.0.set_anchor(id).map_err(err)
    }

    /// Why each queued run waits, as a cycle at `now` would leave it (nothing applied).
    #[pyo3(signature = (now, history=None, spent=None))]
    fn explain(
        &mut self,
        py: Python<'_>,
        now: f64,
        history: Option<Vec<f64>>,
        spent: Option<Vec<BudgetSpent>>,
    ) -> PyResult<Explanation> {
        let spent: Vec<lib::BudgetSpent> =
            spent.unwrap_or_default().into_iter().map(|b| b.0).collect();
        let e = self
            .0
            .explain(now, history.as_deref(), &spent)
            .map_err(err)?;
        explanation(py, e)
    }

    #[pyo3(signature = (now, history=None, spent=None))]
    fn cycle(
        &mut self,
        now: f64,
        history: Option<Vec<f64>>,
        spent: Option<Vec<BudgetSpent>>,
    ) -> PyResult<(Vec<Admitted>, Vec<Preempted>)> {
        let spent: Vec<lib::BudgetSpent> =
            spent.unwrap_or_default().into_iter().map(|b| b.0).collect();
        let (admitted, preempted) = self.0.cycle(now, history.as_deref(), &spent).map_err(err)?;
        let admitted = admitted
            .into_iter()
            .map(|a| Admitted {
                run_id: a.run_id,
                backend: a.backend,
                gpu_type: a.gpu_type,
                slots: a.slots,
                fraction: a.fraction,
            })
            .collect();
        let preempted = preempted
            .into_iter()
            .map(|p| Preempted {
                run_id: p.run_id,
                for_run_id: p.for_run_id,
                lost_gpu_s: p.lost_gpu_s,
                borrower_shares: p.borrower_shares,
            })
            .collect();
        Ok((admitted, preempted))
    }
}

#[pymodule]
fn _engine(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NodeSpec>()?;
    m.add_class::<QuotaSpec>()?;
    m.add_class::<ProjectSpec>()?;
    m.add_class::<PolicySpec>()?;
    m.add_class::<Settings>()?;
    m.add_class::<PriorShape>()?;
    m.add_class::<RunSpec>()?;
    m.add_class::<Held>()?;
    m.add_class::<Admitted>()?;
    m.add_class::<Preempted>()?;
    m.add_class::<Reason>()?;
    m.add_class::<Explanation>()?;
    m.add_class::<BudgetSpent>()?;
    m.add_class::<Engine>()?;
    parts::register(m)?;
    Ok(())
}
