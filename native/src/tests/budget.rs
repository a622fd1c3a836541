//! Spent budgets on one 8-GPU node and one project (`tests.rs`'s model): `wait` serves none
//! of the project's runs; `lower` serves them at the lower class, where the project's order
//! (shortest first), not their classes, decides between them. The Python core is the
//! specification (`CycleBooks.level_of`); `tests/test_native_core.py` compares at large.

use super::{cycle, cycle_with, model, run, NORMAL};
use crate::budget::{level, limits, BudgetSpent, Limit};
use crate::state::State;

const HIGH: i64 = 2;
const LOW: i64 = 0;

/// A high-class 8-GPU run of 100 s and a normal-class 8-GPU run of 10 s wait: only one fits.
fn two_waiting(m: &crate::model::Model) -> State {
    let mut st = State::new(m);
    st.enqueue(run("high", 0, HIGH, 8, Some(100.0)))
        .expect("enqueue");
    st.enqueue(run("normal", 1, NORMAL, 8, Some(10.0)))
        .expect("enqueue");
    st
}

#[test]
fn levels_follow_the_budget() {
    assert_eq!(level(Limit::Free, HIGH), Some(HIGH));
    assert_eq!(level(Limit::Wait, HIGH), None);
    assert_eq!(level(Limit::Lower(LOW), HIGH), Some(LOW));
    assert_eq!(level(Limit::Lower(NORMAL), LOW), Some(LOW)); // never raised
    let spent = [BudgetSpent {
        project: 1,
        lower_to: None,
    }];
    assert_eq!(limits(2, &spent), vec![Limit::Free, Limit::Wait]);
}

#[test]
fn without_a_spent_budget_the_higher_class_goes_first() {
    let m = model(0.0, true);
    let mut st = two_waiting(&m);
    assert_eq!(cycle(&m, &mut st, 1.0).0, vec!["high".to_string()]);
}

#[test]
fn a_spent_budget_that_waits_serves_none_of_its_runs() {
    let m = model(0.0, true);
    let mut st = two_waiting(&m);
    let got = cycle_with(&m, &mut st, 1.0, vec![Limit::Wait]);
    assert_eq!(got, (vec![], vec![]));
    assert!(st.runs.iter().all(|r| r.queued));
}

#[test]
fn a_spent_budget_that_lowers_serves_both_classes_in_one_pass_by_the_order() {
    let m = model(0.0, true);
    let mut st = two_waiting(&m);
    let got = cycle_with(&m, &mut st, 1.0, vec![Limit::Lower(LOW)]);
    assert_eq!(got.0, vec!["normal".to_string()]); // the shorter, though of the lower class
}
