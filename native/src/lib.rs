//! `mlops_gpu_native`: the scheduling core's incremental engine in Rust.
//!
//! The same decisions as `mlops_gpu.core.engine.Incremental` for the requests and policies it
//! serves (whole GPUs without topology or host resources, `order` `shortest` or `submit`, no
//! budgets, nodes without MIG or shared devices); `mlops_gpu/core/native.py` checks that,
//! turns names into indices and builds the `Decision`. Pure: the clock comes in each call.

mod backfill;
mod capacity;
mod cycle;
mod model;
mod placement;
mod preempt;
mod quota;
mod state;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::model::{Model, Node, Policy, Project, Term};
use crate::state::{Run, State};

type NodeSpec = (usize, usize, usize, bool);
type TermSpec = (f64, Option<f64>, Option<f64>);
type ProjectSpec = (f64, Option<usize>, Vec<TermSpec>);
type PolicySpec = (bool, bool, bool, f64, bool, bool, f64);
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
        let (shortest, strict_fifo, fair_share, half_life_s, preemption, backfill, ratio) = policy;
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
                shortest,
                strict_fifo,
                fair_share,
                half_life_s,
                preemption,
                backfill,
                shortest_preempt_ratio: ratio,
            },
        };
        let st = State::new(&m);
        Ok(Engine { m, st })
    }

    /// A run joins its project's queue.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (id, seq, project, class, gpus, nodes, types, pinned, max_runtime,
                        preemptible, grace_s, submitted_at, last_checkpoint_at))]
    fn submit(
        &mut self,
        id: String,
        seq: i64,
        project: usize,
        class: i64,
        gpus: usize,
        nodes: usize,
        types: Vec<usize>,
        pinned: Option<usize>,
        max_runtime: Option<f64>,
        preemptible: bool,
        grace_s: f64,
        submitted_at: f64,
        last_checkpoint_at: Option<f64>,
    ) -> PyResult<()> {
        let spec = (
            id,
            seq,
            project,
            class,
            gpus,
            nodes,
            types,
            pinned,
            max_runtime,
        );
        let run = self.run(spec, preemptible, grace_s, submitted_at, last_checkpoint_at)?;
        self.st.enqueue(run).map_err(PyValueError::new_err)
    }

    /// A run that already holds GPUs (loaded from a store): `slots` are (node, device numbers)
    /// on `backend` and `ty`, `held` all the GPUs it holds (some may be on nodes the cluster no
    /// longer has); `going`: it is being preempted.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (id, seq, project, class, gpus, nodes, types, pinned, max_runtime,
                        preemptible, grace_s, submitted_at, last_checkpoint_at, backend, ty,
                        slots, held, admitted_at, started_at, going))]
    fn add_active(
        &mut self,
        id: String,
        seq: i64,
        project: usize,
        class: i64,
        gpus: usize,
        nodes: usize,
        types: Vec<usize>,
        pinned: Option<usize>,
        max_runtime: Option<f64>,
        preemptible: bool,
        grace_s: f64,
        submitted_at: f64,
        last_checkpoint_at: Option<f64>,
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
                "run {id}: its placement names an unknown type, backend, node or device"
            )));
        }
        let spec = (
            id,
            seq,
            project,
            class,
            gpus,
            nodes,
            types,
            pinned,
            max_runtime,
        );
        let mut run = self.run(spec, preemptible, grace_s, submitted_at, last_checkpoint_at)?;
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
    /// (node, device numbers)) and the preemptions (victim id, the run it makes room for).
    #[pyo3(signature = (now, history=None))]
    #[allow(clippy::type_complexity)]
    fn cycle(
        &mut self,
        now: f64,
        history: Option<Vec<f64>>,
    ) -> PyResult<(Vec<(String, usize, usize, Slots)>, Vec<(String, String)>)> {
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
        for (v, i) in preemptions {
            out_p.push((self.st.runs[v].id.clone(), self.st.runs[i].id.clone()));
            self.st.mark_going(m, v);
        }
        Ok((out_a, out_p))
    }
}

type RunSpec = (
    String,
    i64,
    usize,
    i64,
    usize,
    usize,
    Vec<usize>,
    Option<usize>,
    Option<f64>,
);

impl Engine {
    /// A run as the engine keeps it, checked.
    fn run(
        &self,
        spec: RunSpec,
        preemptible: bool,
        grace_s: f64,
        submitted_at: f64,
        last_checkpoint_at: Option<f64>,
    ) -> PyResult<Run> {
        let (id, seq, project, class, gpus, nodes, types, pinned, max_runtime) = spec;
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
        let first = if self.m.policy.shortest {
            max_runtime.unwrap_or(f64::INFINITY)
        } else {
            submitted_at
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
            grace_s,
            last_checkpoint_at,
            key: (first, seq),
            placement: None,
            admitted_at: None,
            started_at: None,
            going: false,
            queued: false,
        })
    }
}

#[pymodule]
fn mlops_gpu_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Engine>()?;
    Ok(())
}
