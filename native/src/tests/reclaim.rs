//! Reclaim that ends, cheaply (issue 24 item 2), on one 4-GPU node shared by projects b (0)
//! and l (1) of one cohort, 2 GPUs of nominal quota each, borrowing unlimited: only a
//! preemptible run borrows; runs within nominal quota, of every class, come before borrowers
//! of any class; a reclaim takes the borrower's lowest class first. The Python twins are in
//! `tests/core/test_reclaim.py`.

use super::{cycle, model, plain_node, run, whole};
use crate::model::{Model, Project, Term};
use crate::state::State;

const HIGH: i64 = 2;
const B: usize = 0;
const L: usize = 1;

fn cohort() -> Model {
    let mut m = model(0.0, true);
    let term = Term {
        nominal: 2.0,
        borrowing: None,
        lending: None,
    };
    let member = || Project {
        weight: 1.0,
        root: Some(0),
        terms: vec![term],
    };
    m.projects = vec![member(), member()];
    m.members = vec![vec![B, L]];
    m.nodes = vec![plain_node(4)];
    m.capacity_by_type = vec![4.0];
    m
}

/// Run `id` of `project` holds device `dev` since `started`.
fn hold(m: &Model, st: &mut State, id: &str, project: usize, class: i64, dev: u16, started: f64) {
    let mut r = run(id, 0, class, 1, None);
    r.project = project;
    r.admitted_at = Some(started);
    r.started_at = Some(started);
    st.hold(m, r, whole(0, vec![dev]), false).expect("hold");
}

fn queue(st: &mut State, id: &str, seq: i64, project: usize, class: i64, preemptible: bool) {
    let mut r = run(id, seq, class, 1, None);
    r.project = project;
    r.preemptible = preemptible;
    st.enqueue(r).expect("enqueue");
}

#[test]
fn a_run_that_is_not_preemptible_does_not_borrow() {
    let m = cohort();
    let mut st = State::new(&m);
    hold(&m, &mut st, "b1", B, super::NORMAL, 0, 0.0);
    hold(&m, &mut st, "b2", B, super::NORMAL, 1, 0.0);
    queue(&mut st, "nb", 1, B, super::NORMAL, false);
    queue(&mut st, "pb", 2, B, super::NORMAL, true);
    let (admitted, preempted) = cycle(&m, &mut st, 10.0);
    assert_eq!(admitted, vec!["pb".to_string()]);
    assert!(preempted.is_empty());
    // the lender's run (2 GPUs: the free one and the borrowed one) takes its nominal back
    // from the preemptible borrower
    let mut l1 = run("l1", 3, super::NORMAL, 2, None);
    l1.project = L;
    st.enqueue(l1).expect("enqueue");
    let (admitted, preempted) = cycle(&m, &mut st, 11.0);
    assert_eq!(admitted, vec!["l1".to_string()]);
    assert_eq!(preempted.len(), 1);
    assert_eq!(preempted[0].0, "pb");
}

#[test]
fn runs_within_nominal_of_every_class_come_before_borrowers_of_any() {
    let m = cohort();
    let mut st = State::new(&m);
    hold(&m, &mut st, "b1", B, HIGH, 0, 0.0);
    hold(&m, &mut st, "b2", B, HIGH, 1, 0.0);
    hold(&m, &mut st, "l1", L, super::LOW, 2, 0.0);
    queue(&mut st, "bh", 1, B, HIGH, true); // would borrow l's idle GPU
    queue(&mut st, "l2", 2, L, super::LOW, true); // within l's nominal
    let (admitted, preempted) = cycle(&m, &mut st, 10.0);
    assert_eq!(admitted, vec!["l2".to_string()]);
    assert!(preempted.is_empty());
}

#[test]
fn a_reclaim_takes_the_borrowers_lowest_class_first() {
    let m = cohort();
    let mut st = State::new(&m);
    // b's low runs lose more work (started first) than its high ones: a victim of the high
    // class would, requeued, preempt a low one in turn
    hold(&m, &mut st, "bl1", B, super::LOW, 0, 0.0);
    hold(&m, &mut st, "bl2", B, super::LOW, 1, 0.0);
    hold(&m, &mut st, "bh1", B, HIGH, 2, 5.0);
    hold(&m, &mut st, "bh2", B, HIGH, 3, 5.0);
    queue(&mut st, "l1", 1, L, super::NORMAL, true);
    let (admitted, preempted) = cycle(&m, &mut st, 10.0);
    assert_eq!(admitted, vec!["l1".to_string()]);
    assert_eq!(preempted.len(), 1);
    assert_eq!(preempted[0].0, "bl1");
}
