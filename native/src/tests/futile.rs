//! `preempt::Futile`, the memo of whole-GPU victim searches that found no candidate: one run's
//! empty search must not answer for a run of the same project, class and shape with more
//! candidates. On one 8-GPU node, a low-class run holds 1 GPU and a checkpointed run of the
//! queued runs' class holds 7. Run "a" (max_runtime 1,000,000 s) is met first and finds no
//! candidate: the 7-GPU run does not go on for longer than a's max_runtime, and the low run's
//! GPU is not enough. Run "b" (100 s), in another queue (other host CPU), may take the 7-GPU
//! run, and must.

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
    b.cpu_milli = 1; // (its own queue)
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
