//! `preempt::Futile`, the memo of whole-GPU victim searches that found no plan: one run's
//! empty search must not answer for a run of the same project, class and shape with more
//! candidates. On one 8-GPU node, a low-class run holds 1 GPU and a checkpointed run of the
//! queued runs' class holds 7. Run "a" (max_runtime 1,000,000 s) is met first and finds no
//! candidate: the 7-GPU run does not go on for longer than a's max_runtime, and the low run's
//! GPU is not enough. Run "b" (100 s), of the same request in another queue (its GPU types
//! named otherwise), may take the 7-GPU run, and must.

use super::{model, run, whole, LOW, NORMAL};
use crate::cycle::Cycle;
use crate::state::State;

#[test]
fn an_empty_search_does_not_answer_for_a_run_with_more_candidates() {
    let m = model(0.0, false);
    let mut st = State::new(&m);
    let mut low = run("low", 0, LOW, 1, Some(100_000.0));
    let mut long = run("long", 1, NORMAL, 7, Some(100_000.0));
    for r in [&mut low, &mut long] {
        (r.admitted_at, r.started_at, r.last_checkpoint_at) = (Some(0.0), Some(0.0), Some(10.0));
    }
    st.hold(&m, low, whole(0, vec![0]), false).expect("hold");
    st.hold(&m, long, whole(0, (1..8).collect()), false)
        .expect("hold");
    let mut a = run("a", 2, NORMAL, 4, Some(1_000_000.0));
    let mut b = run("b", 3, NORMAL, 4, Some(100.0));
    b.request_types = 1; // (its own queue, the same request)
    (a.key, b.key) = ((0, 1.0, 2), (0, 2.0, 3)); // a is met first
    st.enqueue(a).expect("enqueue");
    st.enqueue(b).expect("enqueue");
    let mut c = Cycle::new(&m, &mut st, 1000.0, None, Vec::new());
    c.run();
    let (admitted, taken) = (c.admissions.clone(), c.preemptions.clone());
    drop(c);
    let id = |i: usize| st.runs[i].id.as_str();
    assert_eq!(
        admitted.iter().map(|(i, _)| id(*i)).collect::<Vec<_>>(),
        ["b"]
    );
    assert_eq!(
        taken.iter().map(|t| (id(t.0), id(t.1))).collect::<Vec<_>>(),
        [("long", "b")]
    );
}

/// A run that may not borrow (not preemptible) finds no plan where one that may does: its
/// failure must not answer for it. Project 0 (nominal 2) lends from project 1 (nominal 6);
/// its low-class run borrows 6 of the 8 GPUs. "np" (not preemptible) is met first: with the
/// low run gone it would be over its nominal quota, which only a preemptible run may be.
#[test]
fn a_search_that_may_not_borrow_does_not_answer_for_one_that_may() {
    let mut m = model(0.0, false);
    let term = |nominal| crate::model::Term {
        nominal,
        borrowing: None,
        lending: None,
    };
    let member = |nominal| crate::model::Project {
        weight: 1.0,
        root: Some(0),
        terms: vec![term(nominal)],
    };
    m.projects = vec![member(2.0), member(6.0)];
    m.members = vec![vec![0, 1]];
    let mut st = State::new(&m);
    let mut low = run("low", 0, LOW, 6, Some(100_000.0));
    (low.admitted_at, low.started_at) = (Some(0.0), Some(0.0));
    st.hold(&m, low, whole(0, (0..6).collect()), false)
        .expect("hold");
    let mut np = run("np", 1, NORMAL, 4, Some(100.0));
    np.preemptible = false;
    st.enqueue(np).expect("enqueue");
    st.enqueue(run("pp", 2, NORMAL, 4, Some(200.0)))
        .expect("enqueue");
    let mut c = Cycle::new(&m, &mut st, 1000.0, None, Vec::new());
    c.run();
    let admitted: Vec<usize> = c.admissions.iter().map(|(i, _)| *i).collect();
    drop(c);
    let ids: Vec<&str> = admitted.iter().map(|&i| st.runs[i].id.as_str()).collect();
    assert_eq!(ids, ["pp"]);
}
