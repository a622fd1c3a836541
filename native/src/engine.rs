//! The engine's public face: the settings and runs it takes, and what a cycle decides, as
//! named structures (defined in `spec`, re-exported here); no Python here (the PyO3 crate in
//! `native/py` only converts).
//!
//! Invariants: every index in a `Settings` or `RunSpec` is checked here, once, on the way in
//! (an unknown type, backend, node, device or project is an error, never a panic later);
//! times are checked not NaN; an `Engine` owns its state and is changed only by its methods.

use crate::budget::{self, BudgetSpent};
use crate::capacity;
use crate::cycle;
use crate::explain;
use crate::model::{Model, Node, Order, Policy, Project, Term};
use crate::parts;
pub use crate::spec::{
    Admitted, Held, NodeSpec, PolicySpec, Preempted, PriorShape, ProjectSpec, QuotaSpec, RunSpec,
    Settings, Slot,
};
use crate::state::{Run, State};
use crate::verdict;

/// The incremental engine: events in, one cycle's decision out (applied to its state).
pub struct Engine {
    m: Model,
    st: State,
    /// Runs' `gpu_types` lists as named -> their number (`Run::request_types`).
    type_lists: std::collections::HashMap<Vec<String>, u32>,
}

impl Engine {
    pub fn new(s: Settings) -> Result<Self, String> {
        let n_types = s.n_types;
        let nodes: Vec<Node> = s
            .nodes
            .into_iter()
            .map(|n| Node {
                ty: n.gpu_type,
                backend: n.backend,
                ndev: n.devices,
                schedulable: n.schedulable,
                labels: n.labels,
                cpu_milli: n.cpu_milli,
                host_memory_mb: n.host_memory_mb,
            })
            .collect();
        if nodes
            .iter()
            .any(|n| n.ty >= n_types || n.backend >= s.multi_node.len())
        {
            return Err("a node names an unknown GPU type or backend".into());
        }
        let mut groups: Vec<(usize, usize)> = nodes
            .iter()
            .filter(|n| n.schedulable)
            .map(|n| (n.ty, n.backend))
            .collect();
        groups.sort_unstable();
        groups.dedup();
        let projects = s
            .projects
            .into_iter()
            .map(|p| Project {
                weight: p.weight,
                root: p.root,
                terms: p
                    .quotas
                    .into_iter()
                    .map(|q| Term {
                        nominal: q.nominal,
                        borrowing: q.borrowing_limit,
                        lending: q.lending_limit,
                    })
                    .collect(),
            })
            .collect();
        let p = s.policy;
        if p.borrower_share_ratio.is_nan() || p.borrower_share_ratio < 1.0 {
            return Err(format!(
                "policy.borrower_share_ratio: expected a number >= 1, got {}",
                p.borrower_share_ratio
            ));
        }
        if p.min_runtime_before_preemption_s.is_nan() || p.shortest_preempt_ratio.is_nan() {
            return Err(
                "policy: min_runtime_before_preemption_s and shortest_preempt_ratio must be numbers"
                    .into(),
            );
        }
        let ndev: Vec<usize> = nodes.iter().map(|n| n.ndev).collect();
        // (a shared node, whatever its backend, gives fragmentation-aware placement a cluster
        // to weigh, as host resources do: `Capacity.fragmentable`)
        let shared_nodes = s.parts.iter().any(|p| p.shared_node);
        let node_parts = parts::build(&ndev, s.parts)?;
        let order = match p.order.as_str() {
            "shortest" => Order::Shortest,
            "submit" => Order::Submit,
            "las" => Order::Las,
            other => {
                return Err(format!(
                    "policy.order: expected shortest, submit or las, got {other:?}"
                ))
            }
        };
        let m = Model {
            n_types,
            nodes,
            multi_node: s.multi_node,
            projects,
            members: s.members,
            capacity_by_type: s.capacity_by_type,
            of_type: s.of_type,
            groups,
            policy: Policy {
                order,
                las_thresholds: p.las_thresholds_gpu_s,
                strict_fifo: p.strict_fifo,
                fair_share: p.fair_share,
                half_life_s: p.half_life_s,
                preemption: p.preemption,
                backfill: p.backfill,
                shortest_preempt_ratio: p.shortest_preempt_ratio,
                min_runtime_s: p.min_runtime_before_preemption_s,
                preempt_uncheckpointed: p.preempt_uncheckpointed,
                shortest_preempt_borrowers: p.shortest_preempt_borrowers,
                borrower_share_ratio: p.borrower_share_ratio,
            },
            parts: node_parts,
        };
        let fgd = match p.placement.as_str() {
            "fragmentation" => {
                shared_nodes
                    || m.nodes
                        .iter()
                        .any(|n| n.cpu_milli.is_some() || n.host_memory_mb.is_some())
            }
            "best-fit" => false,
            other => {
                return Err(format!(
                    "policy.placement: expected best-fit or fragmentation, got {other:?}"
                ))
            }
        };
        let mut st = State::new(&m);
        st.cap.mix.enabled = fgd;
        st.cap.mix.compensated = s.compensated_sum;
        if fgd {
            for ps in &s.shape_prior {
                st.cap.mix.add_prior(ps)?;
            }
        }
        Ok(Engine {
            m,
            st,
            type_lists: Default::default(),
        })
    }

    /// A run joins its project's queue.
    pub fn submit(&mut self, run: RunSpec) -> Result<(), String> {
        let run = self.run(run)?;
        self.st.enqueue(run)
    }

    /// A run that already holds GPUs (loaded from a store).
    pub fn add_active(&mut self, run: RunSpec, held: Held) -> Result<(), String> {
        let m = &self.m;
        let bad = |(n, d): &Slot| {
            *n >= m.nodes.len()
                || d.iter()
                    .any(|&x| x as usize >= parts::of(m, *n).end(m.nodes[*n].ndev))
        };
        let counted: usize = held.slots.iter().map(|(_, d)| d.len()).sum();
        let shares_bad = !held.shares.is_empty()
            && (held.shares.len() != held.slots.len()
                || (held.charged.is_none() && counted != held.gpus));
        if held.gpu_type >= m.n_types
            || held.backend >= m.multi_node.len()
            || held.slots.iter().any(bad)
            || shares_bad
        {
            return Err(format!(
                "run {}: its placement names an unknown type, backend, node or device",
                run.id
            ));
        }
        let mut run = self.run(run)?;
        run.admitted_at = held.admitted_at;
        run.started_at = held.started_at;
        let p = capacity::Placement {
            ty: held.gpu_type,
            backend: held.backend,
            slots: held.slots,
            gpus: held.gpus,
            host: run.host(),
            shares: held.shares,
            accepts: run.accepts,
            charged: held.charged,
        };
        self.st.hold(&self.m, run, p, held.going)
    }

    /// A queued run leaves its queue without running (cancelled, or changed in the store).
    pub fn withdraw(&mut self, id: &str) -> Result<(), String> {
        match self.st.by_id.get(id) {
            Some(&i) if self.st.runs[i].queued => {
                self.st.dequeue(i);
                Ok(())
            }
            _ => Err(format!("run {id} is not queued")),
        }
    }

    /// An active run reported a checkpoint at `at` (what a same-class preemption asks of a
    /// victim, and where its lost work starts).
    pub fn checkpoint(&mut self, id: &str, at: f64) -> Result<(), String> {
        match self.st.by_id.get(id) {
            Some(&i) if self.st.runs[i].placement.is_some() && !at.is_nan() => {
                self.st.checkpoint(&self.m, i, at);
                Ok(())
            }
            _ => Err(format!("run {id} is not active, or the time is NaN")),
        }
    }

    /// GPUs held per (project, type), project-major.
    pub fn used(&self) -> &[f64] {
        &self.st.cap.used
    }

    /// An active run ended: its GPUs are free.
    pub fn finish(&mut self, id: &str) -> Result<(), String> {
        let i = *self
            .st
            .by_id
            .get(id)
            .ok_or_else(|| format!("run {id} is not active"))?;
        self.st.finish(&self.m, i)
    }

    /// One cycle at `now`, applied to the state; `history`: decayed GPU-seconds per
    /// (project, type), project-major. Each preemption's `for_run_id` is among the admissions.
    /// `spent`: the projects whose budget for the current window is spent, and what that does
    /// (`budget`).
    pub fn cycle(
        &mut self,
        now: f64,
        history: Option<&[f64]>,
        spent: &[BudgetSpent],
    ) -> Result<(Vec<Admitted>, Vec<Preempted>), String> {
        if history.is_some_and(|h| h.len() != self.st.cap.used.len()) {
            return Err("history: one value per (project, GPU type)".into());
        }
        let n = self.m.projects.len();
        if let Some(b) = spent.iter().find(|b| b.project >= n) {
            return Err(format!("spent: unknown project {}", b.project));
        }
        let m = &self.m;
        let limits = budget::limits(n, spent);
        let (admissions, preemptions) = verdict::cycle(m, &mut self.st, now, history, &limits);
        let mut out_a = Vec::with_capacity(admissions.len());
        for (i, p) in admissions {
            out_a.push(Admitted {
                run_id: self.st.runs[i].id.clone(),
                backend: p.backend,
                gpu_type: p.ty,
                slots: p.slots.clone(),
                fraction: p.share(0).fraction,
            });
            self.st.activate(m, i, p, now);
        }
        let mut out_p = Vec::with_capacity(preemptions.len());
        for (v, i, lost, borrower_shares) in preemptions {
            out_p.push(Preempted {
                run_id: self.st.runs[v].id.clone(),
                for_run_id: self.st.runs[i].id.clone(),
                lost_gpu_s: lost,
                borrower_shares,
            });
            self.st.mark_going(m, v);
        }
        Ok((out_a, out_p))
    }

    /// Why each queued run waits, as a cycle at `now` would leave it (nothing is applied): its
    /// reason code and parameters and its ETA (`explain`); the arguments are `cycle`'s.
    pub fn explain(
        &mut self,
        now: f64,
        history: Option<&[f64]>,
        spent: &[BudgetSpent],
    ) -> Result<explain::Explanation, String> {
        if history.is_some_and(|h| h.len() != self.st.cap.used.len()) {
            return Err("history: one value per (project, GPU type)".into());
        }
        let n = self.m.projects.len();
        if let Some(b) = spent.iter().find(|b| b.project >= n) {
            return Err(format!("spent: unknown project {}", b.project));
        }
        // a cycle changes the state only through `cap` and the kept anchor: both restored
        let (cap, anchor) = (self.st.cap.clone(), self.st.anchor);
        let limits = budget::limits(n, spent);
        let mut c = cycle::Cycle::new(&self.m, &mut self.st, now, history, limits);
        c.log = Some(Box::default());
        c.run();
        let out = explain::finish(&mut c);
        drop(c);
        (self.st.cap, self.st.anchor) = (cap, anchor);
        Ok(out)
    }

    /// The run that held the reservation after the last cycle and still waits (it keeps it
    /// next cycle: `Snapshot.anchor`), or None.
    pub fn anchor(&self) -> Option<String> {
        let i = self.st.anchor?;
        let r = &self.st.runs[i];
        r.queued.then(|| r.id.clone())
    }

    /// The run that keeps the reservation next cycle, as `anchor` named it before the engine
    /// was rebuilt around other nodes (`FromScratch.set_nodes` keeps its anchor the same
    /// way); None clears it. A run that is not queued here is an error.
    pub fn set_anchor(&mut self, id: Option<&str>) -> Result<(), String> {
        self.st.anchor = match id {
            None => None,
            Some(id) => match self.st.by_id.get(id) {
                Some(&i) if self.st.runs[i].queued => Some(i),
                _ => return Err(format!("anchor: run {id} is not queued")),
            },
        };
        Ok(())
    }

    /// A run as the engine keeps it, checked.
    fn run(&mut self, r: RunSpec) -> Result<Run, String> {
        let id = r.id;
        if r.project >= self.m.projects.len() || r.gpu_types.iter().any(|&t| t >= self.m.n_types) {
            return Err(format!("run {id}: unknown project or GPU type"));
        }
        let numbers = [
            Some(r.submitted_at),
            r.max_runtime_s,
            r.last_checkpoint_at,
            Some(r.grace_s),
        ];
        parts::check(&r.shape, r.gpus, r.nodes).map_err(|e| format!("run {id}: {e}"))?;
        if numbers.iter().flatten().any(|x| x.is_nan()) {
            return Err(format!("run {id}: a time is NaN"));
        }
        let policy = &self.m.policy;
        let key = match policy.order {
            Order::Shortest => (0, r.max_runtime_s.unwrap_or(f64::INFINITY), r.seq),
            Order::Submit => (0, r.submitted_at, r.seq),
            Order::Las => (policy.las_level(r.attained_gpu_s), r.submitted_at, r.seq),
        };
        let next = self.type_lists.len() as u32;
        let request_types = *self.type_lists.entry(r.accepts.clone()).or_insert(next);
        let mix = &mut self.st.cap.mix;
        let accepts = if mix.enabled && !r.accepts.is_empty() {
            mix.intern(r.accepts, &r.gpu_types)
        } else {
            0
        };
        Ok(Run {
            accepts,
            request_types,
            id,
            project: r.project,
            class: r.priority,
            gpus: r.gpus,
            nodes: r.nodes,
            types: r.gpu_types.into(),
            pinned: r.backend,
            topology: r.topology_key,
            topology_required: r.topology_required,
            shape: r.shape,
            cpu_milli: r.cpu_milli,
            host_memory_mb: r.host_memory_mb,
            max_runtime: r.max_runtime_s,
            preemptible: r.preemptible,
            last_checkpoint_at: r.last_checkpoint_at,
            attained: r.attained_gpu_s,
            key,
            placement: None,
            admitted_at: None,
            started_at: None,
            going: false,
            queued: false,
            request: 0, // (numbered as it joins a queue)
            activated: 0,
            submitted_at: r.submitted_at,
            seq: r.seq,
        })
    }
}
