//! `mlops_gpu_native`: the scheduling core's incremental engine in Rust.
//!
//! The same decisions as `mlops_gpu.core.engine.Incremental` for the requests and policies it
//! serves (whole GPUs without topology or host resources, no budgets, nodes without MIG or
//! shared devices); `mlops_gpu/core/native.py` checks that, turns names into indices and
//! builds the `Decision`. Pure: the clock comes in each call.

mod backfill;
mod capacity;
mod cycle;
mod model;
mod placement;
mod preempt;
mod quota;
mod state;
#[cfg(test)]
mod tests;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::model::{Model, Node, Order, Policy, Project, Term};
use crate::state::{Run, State};

type NodeSpec = (usize, usize, usize, bool);
type TermSpec = (f64, Option<f64>, Option<f64>);
type ProjectSpec = (f64, Option<usize>, Vec<TermSpec>);
type PolicySpec = (
    String,
    Vec<f64>,
    bool,
    bool,
    f64,
    bool,
    bool,
    f64,
    f64,
    bool,
);
type Slots = Vec<(usize, Vec<u16>)>;

#[pyclass]
struct Engine {
    m: Model,
    st: State,
}

#[pymethods]
impl Engine {
    /// Indices as `native.py` numbers them: types, backends, nodes and projects by name.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        n_types: usize,
        nodes: Vec<NodeSpec>,
        multi_node: Vec<bool>,
        projects: Vec<ProjectSpec>,
        members: Vec<Vec<usize>>,
        capacity_by_type: Vec<f64>,
        of_type: Vec<Vec<usize>>,
        policy: PolicySpec,
    ) -> PyResult<Self> {
        let nodes: Vec<Node> = nodes
            .into_iter()
            .map(|(ty, backend, ndev, schedulable)| Node {
                ty,
                backend,
                ndev,
                schedulable,
            })
            .collect();
        if nodes
            .iter()
            .any(|n| n.ty >= n_types || n.backend >= multi_node.len())
        {
            return Err(PyValueError::new_err(
                "a node names an unknown GPU type or backend",
            ));
        }
        let mut groups: Vec<(usize, usize)> = nodes
            .iter()
            .filter(|n| n.schedulable)
            .map(|n| (n.ty, n.backend))
            .collect();
        groups.sort_unstable();
        groups.dedup();
        let projects = projects
            .into_iter()
            .map(|(weight, root, terms)| Project {
                weight,
                root,
                terms: terms
                    .into_iter()
                    .map(|(nominal, borrowing, lending)| Term {
                        nominal,
                        borrowing,
                        lending,
                    })
                    .collect(),
            })
            .collect();
        let (
            order,
            las_thresholds,
            strict_fifo,
            fair_share,
            half_life_s,
            preemption,
            backfill,
            ratio,
            min_runtime_s,
            preempt_uncheckpointed,
        ) = policy;
        if min_runtime_s.is_nan() || ratio.is_nan() {
            return Err(PyValueError::new_err(
                "policy: min_runtime_before_preemption_s and shortest_preempt_ratio must be numbers",
            ));
        }
        let order = match order.as_str() {
            "shortest" => Order::Shortest,
            "submit" => Order::Submit,
            "las" => Order::Las,
            other => {
                return Err(PyValueError::new_err(format!(
                    "policy.order: expected shortest, submit or las, got {other:?}"
                )))
            }
        };
        let m = Model {
            n_types,
            nodes,
            multi_node,
            projects,
            members,
            capacity_by_type,
            of_type,
            groups,
            policy: Policy {
                order,
                las_thresholds,
                strict_fifo,
                fair_share,
                half_life_s,
                preemption,
                backfill,
                shortest_preempt_ratio: ratio,
                min_runtime_s,
                preempt_uncheckpointed,
            },
        };
        let st = State::new(&m);
        Ok(Engine { m, st })
    }

    /// A run joins its project's queue.
    fn submit(&mut self, run: RunArgs) -> PyResult<()> {
        let run = self.run(run)?;
        self.st.enqueue(run).map_err(PyValueError::new_err)
    }

    /// A run that already holds GPUs (loaded from a store): `slots` are (node, device numbers)
    /// on `backend` and `ty`, `held` all the GPUs it holds (some may be on nodes the cluster no
    /// longer has); `going`: it is being preempted, and then holds nothing (its devices are
    /// free here, or held by the run admitted in its place).
    #[allow(clippy::too_many_arguments)]
    fn add_active(
        &mut self,
        run: RunArgs,
        backend: usize,
        ty: usize,
        slots: Slots,
        held: usize,
        admitted_at: Option<f64>,
        started_at: Option<f64>,
        going: bool,
    ) -> PyResult<()> {
        let m = &self.m;
        let bad = |(n, d): &(usize, Vec<u16>)| {
            *n >= m.nodes.len() || d.iter().any(|&x| x as usize >= m.nodes[*n].ndev)
        };
        if ty >= m.n_types || backend >= m.multi_node.len() || slots.iter().any(bad) {
            return Err(PyValueError::new_err(format!(
                "run {}: its placement names an unknown type, backend, node or device",
                (run.0).0
            )));
        }
        let mut run = self.run(run)?;
        run.admitted_at = admitted_at;
        run.started_at = started_at;
        let p = capacity::Placement {
            ty,
            backend,
            slots,
            gpus: held,
        };
        self.st
            .hold(&self.m, run, p, going)
            .map_err(PyValueError::new_err)
    }

    /// A queued run leaves its queue without running (cancelled, or changed in the store).
    fn withdraw(&mut self, id: &str) -> PyResult<()> {
        match self.st.by_id.get(id) {
            Some(&i) if self.st.runs[i].queued => {
                self.st.dequeue(i);
                Ok(())
            }
            _ => Err(PyValueError::new_err(format!("run {id} is not queued"))),
        }
    }

    /// An active run reported a checkpoint at `at` (what a same-class preemption asks of a
    /// victim, and where its lost work starts).
    fn checkpoint(&mut self, id: &str, at: f64) -> PyResult<()> {
        match self.st.by_id.get(id) {
            Some(&i) if self.st.runs[i].placement.is_some() && !at.is_nan() => {
                self.st.runs[i].last_checkpoint_at = Some(at);
                Ok(())
            }
            _ => Err(PyValueError::new_err(format!(
                "run {id} is not active, or the time is NaN"
            ))),
        }
    }

    /// GPUs held per (project, type), project-major.
    fn used(&self) -> Vec<f64> {
        self.st.cap.used.clone()
    }

    /// An active run ended: its GPUs are free.
    fn finish(&mut self, id: &str) -> PyResult<()> {
        let i = *self
            .st
            .by_id
            .get(id)
            .ok_or_else(|| PyValueError::new_err(format!("run {id} is not active")))?;
        self.st.finish(&self.m, i).map_err(PyValueError::new_err)
    }

    /// One cycle at `now`, applied to the state; `history`: decayed GPU-seconds per
    /// (project, type), project-major. Returns the admissions (run id, backend, type, slots of
    /// (node, device numbers)) and the preemptions (victim id, the run it makes room for, which
    /// is among the admissions, and the GPU-seconds the victim loses).
    #[pyo3(signature = (now, history=None))]
    #[allow(clippy::type_complexity)]
    fn cycle(
        &mut self,
        now: f64,
        history: Option<Vec<f64>>,
    ) -> PyResult<(
        Vec<(String, usize, usize, Slots)>,
        Vec<(String, String, f64)>,
    )> {
        if history
            .as_ref()
            .is_some_and(|h| h.len() != self.st.cap.used.len())
        {
            return Err(PyValueError::new_err(
                "history: one value per (project, GPU type)",
            ));
        }
        let m = &self.m;
        let mut c = cycle::Cycle::new(m, &mut self.st, now, history.as_deref());
        c.run();
        let (admissions, preemptions) = (
            std::mem::take(&mut c.admissions),
            std::mem::take(&mut c.preemptions),
        );
        drop(c);
        let mut out_a = Vec::with_capacity(admissions.len());
        for (i, p) in admissions {
            out_a.push((self.st.runs[i].id.clone(), p.backend, p.ty, p.slots.clone()));
            self.st.activate(m, i, p, now);
        }
        let mut out_p = Vec::with_capacity(preemptions.len());
        for (v, i, lost) in preemptions {
            out_p.push((self.st.runs[v].id.clone(), self.st.runs[i].id.clone(), lost));
            self.st.mark_going(m, v);
        }
        Ok((out_a, out_p))
    }

    /// The run that held the reservation after the last cycle and still waits (it keeps it
    /// next cycle: `Snapshot.anchor`), or None.
    fn anchor(&self) -> Option<String> {
        let i = self.st.anchor?;
        let r = &self.st.runs[i];
        r.queued.then(|| r.id.clone())
    }
}

/// A run as `native.py` passes it: (id, seq, project, class, GPUs per node, nodes, accepted
/// types, pinned backend, max_runtime) and (preemptible, grace, submit time, last checkpoint,
/// attained GPU-seconds).
type RunArgs = (
    (
        String,
        i64,
        usize,
        i64,
        usize,
        usize,
        Vec<usize>,
        Option<usize>,
        Option<f64>,
    ),
    (bool, f64, f64, Option<f64>, f64),
);

impl Engine {
    /// A run as the engine keeps it, checked.
    fn run(&self, args: RunArgs) -> PyResult<Run> {
        let (spec, terms) = args;
        let (id, seq, project, class, gpus, nodes, types, pinned, max_runtime) = spec;
        let (preemptible, grace_s, submitted_at, last_checkpoint_at, attained) = terms;
        if project >= self.m.projects.len() || types.iter().any(|&t| t >= self.m.n_types) {
            return Err(PyValueError::new_err(format!(
                "run {id}: unknown project or GPU type"
            )));
        }
        let numbers = [
            Some(submitted_at),
            max_runtime,
            last_checkpoint_at,
            Some(grace_s),
        ];
        if numbers.iter().flatten().any(|x| x.is_nan()) || gpus == 0 || nodes == 0 {
            return Err(PyValueError::new_err(format!(
                "run {id}: a time is NaN, or it asks for no GPU or no node"
            )));
        }
        let policy = &self.m.policy;
        let key = match policy.order {
            Order::Shortest => (0, max_runtime.unwrap_or(f64::INFINITY), seq),
            Order::Submit => (0, submitted_at, seq),
            Order::Las => (policy.las_level(attained), submitted_at, seq),
        };
        Ok(Run {
            id,
            project,
            class,
            gpus,
            nodes,
            types,
            pinned,
            max_runtime,
            preemptible,
            last_checkpoint_at,
            attained,
            key,
            placement: None,
            admitted_at: None,
            started_at: None,
            going: false,
            queued: false,
            submitted_at,
            seq,
        })
    }
}

#[pymodule]
fn mlops_gpu_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Engine>()?;
    Ok(())
}
