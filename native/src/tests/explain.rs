//! Explanations on one 8-GPU node and one project (`tests.rs`'s model): a blocked run and the
//! identical runs behind it share its reason, each with its own ETA from the running runs'
//! max_runtime (booked in turn, as a queue drains); a run waiting for runs without one has no
//! ETA and says why; a run over quota names the problem and waits for the quota too; a run
//! no node can host has neither. The Python core is the specification (`cycle_explain.explain`);
//! `tests/test_native_core.py` compares at large.

use super::{busy, model, run, NORMAL};
use crate::cycle::Cycle;
use crate::eta::NoEta;
use crate::explain::{self, Explanation, QuotaProblem};
use crate::model::Model;
use crate::state::State;

/// The explanation of a cycle at `now`.
fn explain(m: &Model, st: &mut State, now: f64) -> Explanation {
    let mut c = Cycle::new(m, st, now, None, Vec::new());
    c.log = Some(Box::default());
    c.run();
    explain::finish(&mut c)
}

/// The model with quota for everything asked here (a nominal of 32): runs wait for GPUs.
fn roomy() -> Model {
    let mut m = model(0.0, false);
    m.projects[0].terms[0].nominal = 32.0;
    m
}

/// (run, code, ETA) of each explained run, in the order booked.
fn rows(e: &Explanation) -> Vec<(String, &'static str, Option<f64>)> {
    e.pending
        .iter()
        .map(|p| (p.run_id.clone(), e.reasons[p.reason].code, p.eta))
        .collect()
}

#[test]
fn a_queue_shares_its_heads_reason_and_drains_in_turn() {
    let m = roomy();
    // "v" holds the node until 50; "r" (4 GPUs, 100 s) waits, and two like it behind it
    let mut st = busy(&m, NORMAL, Some(50.0), 0.0, None);
    st.enqueue(run("r2", 2, NORMAL, 4, Some(100.0)))
        .expect("enqueue");
    st.enqueue(run("r3", 3, NORMAL, 4, Some(100.0)))
        .expect("enqueue");
    let e = explain(&m, &mut st, 1.0);
    assert_eq!(
        rows(&e),
        vec![
            ("r".to_string(), "no_capacity", Some(50.0)),
            ("r2".to_string(), "no_capacity", Some(50.0)),
            ("r3".to_string(), "no_capacity", Some(150.0)), // once "r" ends
        ]
    );
    assert_eq!(e.reasons.len(), 1); // one reason, shared
    assert_eq!(e.reasons[0].blocks, vec![(0, 0)]);
    assert_eq!(e.reasons[0].subject, "r");
    // nothing applied: the cycle's trials are undone by the caller, and nothing was admitted
    assert!(st.runs.iter().filter(|r| r.id != "v").all(|r| r.queued));
}

#[test]
fn a_run_waiting_for_runs_without_max_runtime_has_no_eta_and_says_why() {
    let m = roomy();
    let mut st = busy(&m, NORMAL, None, 0.0, None);
    let e = explain(&m, &mut st, 1.0);
    assert_eq!(rows(&e), vec![("r".to_string(), "no_capacity", None)]);
    assert_eq!(e.no_eta, vec![NoEta::HeldUnknown(8.0)]);
    assert_eq!(e.pending[0].no_eta, Some(0));
}

#[test]
fn a_run_over_quota_names_the_problem_and_waits_for_the_quota() {
    let mut m = model(0.0, false);
    m.projects[0].terms[0].nominal = 10.0;
    // "v" holds 8 of 10 until 50: "r" (4) is over quota (no cohort) until then
    let mut st = busy(&m, NORMAL, Some(50.0), 0.0, None);
    let e = explain(&m, &mut st, 1.0);
    assert_eq!(rows(&e), vec![("r".to_string(), "quota", Some(50.0))]);
    let want = QuotaProblem {
        gpu_type: 0,
        kind: "alone",
        value: 8.0,
        amount: 4.0,
    };
    assert_eq!(e.reasons[0].quota, vec![want]);
    // with a nominal of 2 the run can never start while "v"'s 8 count: no ETA, and why
    m.projects[0].terms[0].nominal = 2.0;
    let mut st = busy(&m, NORMAL, Some(50.0), 0.0, None);
    let e = explain(&m, &mut st, 1.0);
    assert_eq!(rows(&e), vec![("r".to_string(), "quota", None)]);
    assert_eq!(e.no_eta, vec![NoEta::QuotaUnknown(Some(0))]);
}

#[test]
fn a_run_no_node_can_host_has_no_eta_and_no_why() {
    let m = roomy();
    let mut st = State::new(&m);
    st.enqueue(run("big", 0, NORMAL, 16, Some(10.0)))
        .expect("enqueue");
    let e = explain(&m, &mut st, 1.0);
    assert_eq!(rows(&e), vec![("big".to_string(), "unschedulable", None)]);
    assert_eq!(e.pending[0].no_eta, None);
}
