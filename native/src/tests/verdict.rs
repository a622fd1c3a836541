//! `verdict`: a queue found to admit nothing is skipped in later cycles only while nothing it
//! depends on moved. Each test blocks a run in a first cycle (remembered), changes one thing
//! the verdict read, and needs the run admitted in the next cycle: each fails if that change
//! does not stamp what the verdict compares (a checkpoint, a member's borrowing, a give-back
//! of quota, a give-back next to a victim's GPUs). Each runs twice: with cycles that pass a
//! known-blocked queue over at its turn, and with the engine's, which leave it out asleep
//! until a stamp it watches moves (`dormancy`: each fails there if the change wakes no one).

use super::{busy, cycle, cycle_asleep, model, plain_node, run, whole, Decided, LOW, NORMAL};
use crate::model::{Model, Project, Term};
use crate::state::State;

fn project(nominal: f64, root: Option<usize>) -> Project {
    let term = Term {
        nominal,
        borrowing: None,
        lending: None,
    };
    Project {
        weight: 1.0,
        root,
        terms: vec![term],
    }
}

/// Run `id` of `project` holds `devs` of node 0 since 0.
fn hold(m: &Model, st: &mut State, id: &str, project: usize, devs: Vec<u16>, preemptible: bool) {
    let mut r = run(id, 0, NORMAL, devs.len(), Some(10_000.0));
    (r.project, r.preemptible) = (project, preemptible);
    (r.admitted_at, r.started_at) = (Some(0.0), Some(0.0));
    st.hold(m, r, whole(0, devs), false).expect("hold");
}

fn queue(st: &mut State, id: &str, project: usize, gpus: usize, preemptible: bool) {
    let mut r = run(id, 9, NORMAL, gpus, Some(100.0));
    (r.project, r.preemptible) = (project, preemptible);
    st.enqueue(r).expect("enqueue");
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// A cycle applied: the tests' (`tests::cycle`) and the engine's (`tests::cycle_asleep`).
type Cycler = fn(&Model, &mut State, f64) -> Decided;
const CYCLES: [Cycler; 2] = [cycle, cycle_asleep];

#[test]
fn a_first_checkpoint_makes_a_same_class_victim() {
    for cycle in CYCLES {
        let m = model(600.0, false);
        // "v" holds the node with no checkpoint: "r" is over quota with no possible victim
        let mut st = busy(&m, NORMAL, Some(10_000.0), 0.0, None);
        assert_eq!(cycle(&m, &mut st, 1000.0), (Vec::new(), Vec::new()));
        st.checkpoint(&m, 0, 500.0);
        let (admitted, preempted) = cycle(&m, &mut st, 1001.0);
        assert_eq!(admitted, names(&["r"]));
        assert_eq!(preempted.len(), 1);
    }
}

#[test]
fn quota_given_back_admits_a_run_it_refused() {
    for cycle in CYCLES {
        let mut m = model(0.0, false);
        m.projects = vec![project(4.0, None)];
        let mut st = State::new(&m);
        hold(&m, &mut st, "a", 0, (0..4).collect(), false);
        queue(&mut st, "r", 0, 2, false); // (not preemptible: it may not borrow)
        assert_eq!(cycle(&m, &mut st, 10.0), (Vec::new(), Vec::new()));
        st.finish(&m, 0).expect("finish");
        assert_eq!(cycle(&m, &mut st, 11.0).0, names(&["r"]));
    }
}

/// Projects P (0) and B (1) in one cohort, X (2) alone, on one 8-GPU node; P's nominal quota
/// is the whole node, B's 2, X's 2.
fn cohort() -> Model {
    let mut m = model(0.0, false);
    m.projects = vec![
        project(8.0, Some(0)),
        project(2.0, Some(0)),
        project(2.0, None),
    ];
    m.members = vec![vec![0, 1]];
    m.nodes = vec![plain_node(8)];
    m
}

/// `cohort` on two 4-GPU nodes: P's runs on node 0's devices 0 and 1 (`p_holds`), B's "bb"
/// on its device 2 (B within its nominal 2), X's 3 GPUs on node 1; "r" (P, `r_gpus`
/// GPUs) waits, and B's "b1" and "b2" (1 GPU each). A first cycle (checked) admits both of
/// B's, which take the free GPU of each node, the second borrowing, and not "r".
fn b_starts_borrowing(
    cycle: Cycler,
    r_gpus: usize,
    p_holds: impl FnOnce(&Model, &mut State),
) -> (Model, State) {
    let mut m = cohort();
    m.nodes = vec![plain_node(4), plain_node(4)];
    m.of_type = vec![vec![0, 1]];
    let mut st = State::new(&m);
    p_holds(&m, &mut st);
    hold(&m, &mut st, "bb", 1, vec![2], true);
    let mut x = run("x", 0, NORMAL, 3, None);
    (x.project, x.preemptible) = (2, false);
    st.hold(&m, x, whole(1, vec![0, 1, 2]), false)
        .expect("hold");
    queue(&mut st, "r", 0, r_gpus, true);
    queue(&mut st, "b1", 1, 1, true);
    queue(&mut st, "b2", 1, 1, true);
    let (admitted, _) = cycle(&m, &mut st, 10.0);
    assert_eq!(admitted.len(), 2, "{admitted:?}");
    assert!(!admitted.contains(&"r".to_string()));
    (m, st)
}

#[test]
fn a_member_that_starts_borrowing_becomes_a_victim_from_the_next_cycle() {
    for cycle in CYCLES {
        // "r" (P, within nominal, 2 GPUs) finds no place and no victim in the first cycle
        let p_holds = |m: &Model, st: &mut State| hold(m, st, "p", 0, vec![0, 1], false);
        let (m, mut st) = b_starts_borrowing(cycle, 2, p_holds);
        // B borrowed as this cycle began: its runs are P's possible victims now
        let (admitted, preempted) = cycle(&m, &mut st, 11.0);
        assert_eq!(admitted, names(&["r"]));
        assert!(!preempted.is_empty());
    }
}

#[test]
fn a_give_back_next_to_a_victim_can_complete_a_plan() {
    for cycle in CYCLES {
        let m = cohort();
        let mut st = State::new(&m);
        hold(&m, &mut st, "b", 1, vec![0, 1, 2], true); // B borrows 1
        hold(&m, &mut st, "x", 2, vec![3, 4], false);
        hold(&m, &mut st, "p", 0, vec![5, 6, 7], false);
        // "r" (P, within nominal) needs 4: b's 3 GPUs are not enough
        queue(&mut st, "r", 0, 4, true);
        assert_eq!(cycle(&m, &mut st, 10.0), (Vec::new(), Vec::new()));
        // x ends (another tree's quota, 2 GPUs: fewer than "r" needs), next to b's 3
        st.finish(&m, 1).expect("finish");
        let (admitted, preempted) = cycle(&m, &mut st, 11.0);
        assert_eq!(admitted, names(&["r"]));
        assert_eq!(preempted.len(), 1);
        assert_eq!(preempted[0].0, "b");
    }
}

#[test]
fn quota_given_back_to_exactly_what_it_lacked_admits_the_run() {
    for cycle in CYCLES {
        let mut m = model(0.0, false);
        m.projects = vec![project(4.0, None)];
        let mut st = State::new(&m);
        for (k, id) in ["a", "b", "c"].into_iter().enumerate() {
            hold(&m, &mut st, id, 0, vec![k as u16], false);
        }
        // "r" needs 3 with 3 of its 4 held: it lacks 2 GPUs of quota (not preemptible: it may
        // not borrow)
        queue(&mut st, "r", 0, 3, false);
        assert_eq!(cycle(&m, &mut st, 10.0), (Vec::new(), Vec::new()));
        st.finish(&m, 0).expect("finish"); // 1 back: it still lacks 1
        assert_eq!(cycle(&m, &mut st, 11.0), (Vec::new(), Vec::new()));
        st.finish(&m, 1).expect("finish"); // the second: none lacks
        assert_eq!(cycle(&m, &mut st, 12.0).0, names(&["r"]));
    }
}

#[test]
fn quota_another_member_gives_back_counts_for_the_tree() {
    for cycle in CYCLES {
        // P (nominal 2) and B (nominal 6) in one cohort, two 8-GPU nodes
        let mut m = cohort();
        m.projects = vec![project(2.0, Some(0)), project(6.0, Some(0))];
        m.nodes = vec![plain_node(8), plain_node(8)];
        m.of_type = vec![vec![0, 1]];
        let mut st = State::new(&m);
        hold(&m, &mut st, "b1", 1, (0..4).collect(), false);
        hold(&m, &mut st, "b2", 1, vec![4], false);
        // "r" (P, 4 GPUs) borrows 2 where B lends 1: the tree lacks 1
        queue(&mut st, "r", 0, 4, true);
        assert_eq!(cycle(&m, &mut st, 10.0), (Vec::new(), Vec::new()));
        st.finish(&m, 1).expect("finish"); // B gives 1 back: it lends 2
        assert_eq!(cycle(&m, &mut st, 11.0).0, names(&["r"]));
    }
}

#[test]
fn a_node_given_back_its_gpus_admits_a_run_it_had_no_place_for() {
    for cycle in CYCLES {
        let mut m = model(0.0, false);
        m.projects = vec![project(16.0, None)]; // (quota is not what it waits for)
        let mut st = State::new(&m);
        hold(&m, &mut st, "a", 0, (0..6).collect(), false); // (no victim: not preemptible)
        queue(&mut st, "r", 0, 4, false);
        assert_eq!(cycle(&m, &mut st, 10.0), (Vec::new(), Vec::new()));
        st.finish(&m, 0).expect("finish");
        assert_eq!(cycle(&m, &mut st, 11.0).0, names(&["r"]));
    }
}

#[test]
fn a_member_that_starts_borrowing_completes_a_plan_a_search_lacked() {
    for cycle in CYCLES {
        // "r" (P, 3 GPUs) finds no plan with "low" alone in the first cycle
        let p_holds = |m: &Model, st: &mut State| {
            hold(m, st, "p", 0, vec![0], false);
            let mut low = run("low", 0, LOW, 1, None); // P's own lower class: a victim
            (low.admitted_at, low.started_at) = (Some(0.0), Some(0.0));
            st.hold(m, low, whole(0, vec![1]), false).expect("hold");
        };
        let (m, mut st) = b_starts_borrowing(cycle, 3, p_holds);
        // B borrowed as this cycle began: with its runs on node 0 gone too, "r" fits there
        let (admitted, preempted) = cycle(&m, &mut st, 11.0);
        assert_eq!(admitted, names(&["r"]));
        assert!(preempted.len() >= 2, "{preempted:?}");
    }
}
