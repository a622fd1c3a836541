//! `policy.shortest_preempt_borrowers` (`preempt::borrowers`) on one 4-GPU node of a cohort of
//! a (0), b (1) and c (2), nominal 0, 1 and 3: b borrows c's idle nominal with four long runs;
//! a's short run (over its nominal) takes the one of them that loses least, only with the
//! rule on, and the victim comes back with both projects' shares. The Python twin is
//! `tests/core/test_borrowers.py`'s first case.

use super::{model, plain_node, run, whole};
use crate::cycle::Cycle;
use crate::model::{Model, Project, Term};
use crate::state::State;

fn world(on: bool) -> (Model, State) {
    let mut m = model(0.0, false);
    m.policy.shortest_preempt_ratio = 8.0;
    m.policy.shortest_preempt_borrowers = on;
    let member = |nominal: f64| Project {
        weight: 1.0,
        root: Some(0),
        terms: vec![Term {
            nominal,
            borrowing: None,
            lending: None,
        }],
    };
    m.projects = vec![member(0.0), member(1.0), member(3.0)];
    m.members = vec![vec![0, 1, 2]];
    m.nodes = vec![plain_node(4)];
    m.capacity_by_type = vec![4.0];
    let mut st = State::new(&m);
    for dev in 0..4u16 {
        let mut r = run(&format!("b{dev}"), 0, super::NORMAL, 1, Some(100_000.0));
        r.project = 1;
        r.admitted_at = Some(0.0);
        r.started_at = Some(0.0);
        r.last_checkpoint_at = Some(500.0 + f64::from(dev));
        st.hold(&m, r, whole(0, vec![dev]), false).expect("hold");
    }
    let mut s = run("s", 1, super::NORMAL, 1, Some(100.0));
    s.project = 0;
    st.enqueue(s).expect("enqueue");
    (m, st)
}

#[test]
fn a_short_run_takes_the_cheapest_long_run_of_a_borrower_above_its_share() {
    let (m, mut st) = world(true);
    let mut c = Cycle::new(&m, &mut st, 1000.0, None, Vec::new());
    c.run();
    let (admitted, taken) = (c.admissions.len(), c.preemptions.clone());
    drop(c);
    assert_eq!(admitted, 1);
    assert_eq!(taken.len(), 1);
    let (v, i, _, shares) = taken[0];
    assert_eq!(
        (st.runs[v].id.as_str(), st.runs[i].id.as_str()),
        ("b3", "s")
    );
    // b holds all 4 GPUs of a capacity of 4, a none
    assert_eq!(shares, Some((1.0, 0.0)));
}

#[test]
fn without_the_rule_it_waits() {
    let (m, mut st) = world(false);
    let (admitted, preempted) = super::cycle(&m, &mut st, 1000.0);
    assert!(admitted.is_empty() && preempted.is_empty());
}
