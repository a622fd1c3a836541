//! What the engine hands back to Python: a cycle's admissions and preemptions (`Admitted`,
//! `Preempted`) and an explanation (`Explanation`, its `Reason`s), as read-only classes
//! converted from the library's structures (types and projects as indices).
//!
//! Invariants: a conversion copies, never drops or reorders: the explanation's reasons and
//! no-ETA reasons keep the library's order, and the pending runs the order booked.

use mlops_gpu_native as lib;
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyFloat, PyList, PyString, PyType};
use pyo3::PyTypeInfo;

/// A run a cycle admitted, and where: slots of (node, device numbers).
#[pyclass(frozen, get_all, module = "mlops_gpu._engine")]
pub(crate) struct Admitted {
    pub(crate) run_id: String,
    pub(crate) backend: usize,
    pub(crate) gpu_type: usize,
    pub(crate) slots: Vec<lib::Slot>,
    pub(crate) fraction: f64,
}

/// A run a cycle preempts, for `for_run_id`, admitted in the same cycle. `borrower_shares`:
/// taken by `policy.shortest_preempt_borrowers`, the fair shares of the victim's project and
/// the preemptor's as the plan was chosen (None: a lower class, its own project's, a reclaim).
#[pyclass(frozen, get_all, module = "mlops_gpu._engine")]
pub(crate) struct Preempted {
    pub(crate) run_id: String,
    pub(crate) for_run_id: String,
    pub(crate) lost_gpu_s: f64,
    pub(crate) borrower_shares: Option<(f64, f64)>,
}

/// A reason code and its parameters (`lib::Reason`: which fields each code reads); types and
/// projects as indices. `quota`: (type, kind, value, amount); `blocks`: (type, largest free block);
/// `borrowers`: (type, project, GPUs borrowed, reclaimable runs shown, how many, runs not
/// preemptible shown, how many), each run as (id, expected end or None).
#[pyclass(frozen, get_all, module = "mlops_gpu._engine")]
pub(crate) struct Reason {
    pub(crate) code: &'static str,
    pub(crate) subject: String,
    pub(crate) types: Vec<usize>,
    pub(crate) quota: Vec<(usize, &'static str, f64, f64)>,
    pub(crate) blocks: Vec<(usize, usize)>,
    pub(crate) borrowers: Vec<BorrowerTuple>,
    pub(crate) lent: bool,
    pub(crate) gpus_held: bool,
    pub(crate) anchor: String,
    pub(crate) at: f64,
    pub(crate) res_project: usize,
    pub(crate) res_type: usize,
}

type Shown = Vec<(String, Option<f64>)>;
type BorrowerTuple = (usize, usize, f64, Shown, usize, Shown, usize);

/// Why runs have no ETA (`lib::NoEta`): (kind, GPUs, project, run ids shown, how many).
type NoEtaTuple = (&'static str, f64, Option<usize>, Vec<String>, usize);

/// An explanation (`lib::Explanation`): the reasons and no-ETA reasons, each once, and per
/// pending run (in the order booked) its id, reason, ETA and no-ETA reason.
#[pyclass(frozen, get_all, module = "mlops_gpu._engine")]
pub(crate) struct Explanation {
    pub(crate) reasons: Vec<Py<Reason>>,
    pub(crate) no_eta: Vec<NoEtaTuple>,
    pub(crate) run_ids: Vec<String>,
    pub(crate) reason: Vec<usize>,
    pub(crate) eta: Vec<Option<f64>>,
    pub(crate) why: Vec<Option<usize>>,
}

fn no_eta(w: lib::NoEta) -> NoEtaTuple {
    match w {
        lib::NoEta::HeldUnknown(g) => ("held_unknown", g, None, Vec::new(), 0),
        lib::NoEta::NotEnough => ("not_enough", 0.0, None, Vec::new(), 0),
        lib::NoEta::CohortLends => ("cohort_lends", 0.0, None, Vec::new(), 0),
        lib::NoEta::QuotaUnknown(p) => ("quota_unknown", 0.0, p, Vec::new(), 0),
        lib::NoEta::Plain => ("plain", 0.0, None, Vec::new(), 0),
        lib::NoEta::Reserved(names, n) => ("reserved", 0.0, None, names, n),
    }
}

pub(crate) fn explanation(py: Python<'_>, e: lib::Explanation) -> PyResult<Explanation> {
    let reasons = e
        .reasons
        .into_iter()
        .map(|r| {
            Py::new(
                py,
                Reason {
                    code: r.code,
                    subject: r.subject,
                    types: r.types,
                    quota: r
                        .quota
                        .into_iter()
                        .map(|q| (q.gpu_type, q.kind, q.value, q.amount))
                        .collect(),
                    blocks: r.blocks,
                    borrowers: r
                        .borrowers
                        .into_iter()
                        .map(|b| {
                            let (t, p, a) = (b.gpu_type, b.project, b.amount);
                            (t, p, a, b.reclaimable, b.n_reclaimable, b.fixed, b.n_fixed)
                        })
                        .collect(),
                    lent: r.lent,
                    gpus_held: r.gpus_held,
                    anchor: r.anchor,
                    at: r.at,
                    res_project: r.res_project,
                    res_type: r.res_type,
                },
            )
        })
        .collect::<PyResult<Vec<_>>>()?;
    let n = e.pending.len();
    let mut out = Explanation {
        reasons,
        no_eta: e.no_eta.into_iter().map(no_eta).collect(),
        run_ids: Vec::with_capacity(n),
        reason: Vec::with_capacity(n),
        eta: Vec::with_capacity(n),
        why: Vec::with_capacity(n),
    };
    for p in e.pending {
        out.run_ids.push(p.run_id);
        out.reason.push(p.reason);
        out.eta.push(p.eta);
        out.why.push(p.no_eta);
    }
    Ok(out)
}

#[pymethods]
impl Explanation {
    /// One object of `cls` per pending run, in the order booked, with its `run_id`,
    /// `reason_code` (`codes[k]` for reason `k`), `reason` (`sentences`, one per pending run)
    /// and `eta` set as `object.__setattr__` sets them, without its `__init__` (a frozen
    /// dataclass with slots: `PendingReason`). At 50,000 pending runs this is several times
    /// faster than making them in Python, which was the largest part of `explain_all`.
    fn pending_objects<'py>(
        &self,
        py: Python<'py>,
        cls: &Bound<'py, PyType>,
        codes: Vec<Bound<'py, PyAny>>,
        sentences: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        if sentences.len() != self.run_ids.len() || codes.len() != self.reasons.len() {
            return Err(PyValueError::new_err(format!(
                "pending_objects: {} sentences for {} runs, {} codes for {} reasons",
                sentences.len(),
                self.run_ids.len(),
                codes.len(),
                self.reasons.len()
            )));
        }
        let new = PyAny::type_object(py).getattr(intern!(py, "__new__"))?;
        let names = [
            intern!(py, "run_id"),
            intern!(py, "reason_code"),
            intern!(py, "reason"),
            intern!(py, "eta"),
        ];
        let mut out = Vec::with_capacity(self.run_ids.len());
        for (k, sentence) in sentences.into_iter().enumerate() {
            let obj = new.call1((cls,))?;
            let eta = match self.eta[k] {
                Some(e) => PyFloat::new(py, e).into_any(),
                None => py.None().into_bound(py),
            };
            let values = [
                PyString::new(py, &self.run_ids[k]).into_any(),
                codes[self.reason[k]].clone(),
                sentence,
                eta,
            ];
            for (name, value) in names.iter().zip(values.iter()) {
                // SAFETY: three live references; the generic setter is what
                // `object.__setattr__` calls (it reaches the class's slot descriptors)
                let rc = unsafe {
                    pyo3::ffi::PyObject_GenericSetAttr(obj.as_ptr(), name.as_ptr(), value.as_ptr())
                };
                if rc != 0 {
                    return Err(PyErr::fetch(py));
                }
            }
            out.push(obj);
        }
        PyList::new(py, out)
    }
}
