//! Unit tests of the preemption rules on one 8-GPU node and one project (nominal 8): a run is
//! admitted in the cycle that chooses its victims, the victims hold nothing from then on, and a
//! victim of the preemptor's own project and class must have checkpointed, have run the
//! guaranteed minimum and (under `shortest`) have a known end far enough away. The Python
//! core is the specification; `tests/test_native_core.py` compares the two engines at large.

mod borrowers;
mod budget;
mod dormancy;
mod explain;
mod futile;
mod host;
mod nofit;
mod parts;
mod reclaim;
mod topology;
mod verdict;

use crate::capacity::Placement;
use crate::cycle::Cycle;
use crate::model::{Model, Node, Order, Policy, Project, Term};
use crate::state::{Run, State};

const LOW: i64 = 0;
const NORMAL: i64 = 1;

/// A schedulable node of type 0 with `ndev` whole devices and no labels or host resources.
fn plain_node(ndev: usize) -> Node {
    Node {
        ty: 0,
        backend: 0,
        ndev,
        schedulable: true,
        labels: Vec::new(),
        cpu_milli: None,
        host_memory_mb: None,
    }
}

/// Whole devices `devs` of node `node`, type 0, booked as a run holds them.
fn whole(node: usize, devs: Vec<u16>) -> Placement {
    Placement {
        ty: 0,
        backend: 0,
        gpus: devs.len(),
        slots: vec![(node, devs)],
        host: (0, 0),
        shares: Vec::new(),
        accepts: 0,
        charged: None,
    }
}

fn model(min_runtime_s: f64, preempt_uncheckpointed: bool) -> Model {
    let term = Term {
        nominal: 8.0,
        borrowing: None,
        lending: None,
    };
    Model {
        n_types: 1,
        nodes: vec![plain_node(8)],
        multi_node: vec![true],
        projects: vec![Project {
            weight: 1.0,
            root: None,
            terms: vec![term],
        }],
        members: Vec::new(),
        capacity_by_type: vec![8.0],
        of_type: vec![vec![0]],
        groups: vec![(0, 0)],
        policy: Policy {
            order: Order::Shortest,
            las_thresholds: vec![3600.0],
            strict_fifo: false,
            fair_share: true,
            half_life_s: 3600.0,
            preemption: true,
            backfill: false,
            shortest_preempt_ratio: 1.0,
            min_runtime_s,
            preempt_uncheckpointed,
            shortest_preempt_borrowers: false,
            borrower_share_ratio: 1.0,
        },
        parts: Vec::new(),
    }
}

fn run(id: &str, seq: i64, class: i64, gpus: usize, max_runtime: Option<f64>) -> Run {
    Run {
        id: id.to_string(),
        project: 0,
        class,
        gpus,
        nodes: 1,
        types: vec![0].into(),
        accepts: 0,
        request_types: 0,
        pinned: None,
        topology: None,
        topology_required: false,
        shape: crate::parts::Shape::Whole,
        cpu_milli: 0,
        host_memory_mb: 0,
        max_runtime,
        preemptible: true,
        last_checkpoint_at: None,
        attained: 0.0,
        key: (0, max_runtime.unwrap_or(f64::INFINITY), seq),
        placement: None,
        admitted_at: None,
        started_at: None,
        going: false,
        queued: false,
        request: 0,
        activated: 0,
        submitted_at: 0.0,
        seq,
    }
}

/// A state where run "v" (class `class`) holds devices 0..8 of the node since `started`, with
/// a checkpoint at `checkpoint`, and run "r" (class normal, 4 GPUs, max_runtime 100 s) waits.
fn busy(
    m: &Model,
    class: i64,
    victim_runtime: Option<f64>,
    started: f64,
    checkpoint: Option<f64>,
) -> State {
    let mut st = State::new(m);
    let mut v = run("v", 0, class, 8, victim_runtime);
    v.admitted_at = Some(started);
    v.started_at = Some(started);
    v.last_checkpoint_at = checkpoint;
    let p = whole(0, (0..8).collect());
    st.hold(m, v, p, false).expect("hold");
    st.enqueue(run("r", 1, NORMAL, 4, Some(100.0)))
        .expect("enqueue");
    st
}

/// One cycle at `now`, applied: (admitted run ids, (victim, preemptor, lost GPU-s)).
fn cycle(m: &Model, st: &mut State, now: f64) -> (Vec<String>, Vec<(String, String, f64)>) {
    cycle_with(m, st, now, Vec::new())
}

/// `cycle`, with per-project budget limits.
fn cycle_with(
    m: &Model,
    st: &mut State,
    now: f64,
    limits: Vec<crate::budget::Limit>,
) -> (Vec<String>, Vec<(String, String, f64)>) {
    let mut c = Cycle::new(m, st, now, None, limits);
    c.run();
    let admissions = std::mem::take(&mut c.admissions);
    let preemptions = std::mem::take(&mut c.preemptions);
    drop(c);
    apply(m, st, now, admissions, preemptions)
}

/// `cycle` as the engine runs it (`verdict::cycle`): the queues known blocked as it begins
/// are left out (asleep, `dormancy`), where `cycle` passes each over at its turn.
fn cycle_asleep(m: &Model, st: &mut State, now: f64) -> Decided {
    let (admissions, preemptions) = crate::verdict::cycle(m, st, now, None, &[]);
    apply(m, st, now, admissions, preemptions)
}

/// (admitted run ids, (victim, preemptor, lost GPU-s)).
type Decided = (Vec<String>, Vec<(String, String, f64)>);

/// Apply a cycle's decision to `st`: its ids.
fn apply(
    m: &Model,
    st: &mut State,
    now: f64,
    admissions: Vec<(usize, Placement)>,
    preemptions: Vec<crate::cycle::Taken>,
) -> Decided {
    let ids = admissions
        .iter()
        .map(|(i, _)| st.runs[*i].id.clone())
        .collect();
    let out = preemptions
        .iter()
        .map(|&(v, i, lost, _)| (st.runs[v].id.clone(), st.runs[i].id.clone(), lost))
        .collect();
    for (i, p) in admissions {
        st.activate(m, i, p, now);
    }
    for (v, _, _, _) in preemptions {
        st.mark_going(m, v);
    }
    (ids, out)
}

#[test]
fn the_preemptor_is_admitted_with_its_victim_which_then_holds_nothing() {
    let m = model(600.0, false);
    // a long same-class run, checkpointed at 500, running since 0: at 1000 it may go
    let mut st = busy(&m, NORMAL, Some(10_000.0), 0.0, Some(500.0));
    let (admitted, preempted) = cycle(&m, &mut st, 1000.0);
    assert_eq!(admitted, vec!["r".to_string()]);
    // 8 GPUs x 500 s since its checkpoint
    assert_eq!(preempted, vec![("v".into(), "r".into(), 4000.0)]);
    // only the preemptor's 4 GPUs are held; the other 4 of the victim's are free
    assert_eq!(st.cap.used, vec![4.0]);
    assert_eq!(st.cap.free[0].len(), 4);
    assert!(st.pools[0]
        .values()
        .all(|p| p.ends.iter().all(|e| e.run != 0)));
    // the victim's exit gives nothing back a second time
    st.finish(&m, 0).expect("finish");
    assert_eq!(st.cap.used, vec![4.0]);
    assert_eq!(st.cap.free[0].len(), 4);
    assert!(st.going.is_empty());
}

#[test]
fn a_same_class_victim_without_max_runtime_is_not_infinitely_long() {
    let m = model(0.0, true);
    let mut st = busy(&m, NORMAL, None, 0.0, Some(500.0));
    assert_eq!(cycle(&m, &mut st, 1000.0), (vec![], vec![]));
    assert_eq!(st.cap.used, vec![8.0]);
}

#[test]
fn a_same_class_victim_must_have_checkpointed_unless_the_policy_says_so() {
    for (uncheckpointed, taken) in [(false, false), (true, true)] {
        let m = model(600.0, uncheckpointed);
        let mut st = busy(&m, NORMAL, Some(10_000.0), 0.0, None);
        let (_, preempted) = cycle(&m, &mut st, 1000.0);
        assert_eq!(preempted.len(), usize::from(taken), "{uncheckpointed}");
        if taken {
            assert_eq!(preempted[0].2, 8000.0); // since its start: no checkpoint
        }
    }
}

#[test]
fn a_same_class_victim_must_have_run_the_guaranteed_minimum() {
    let m = model(600.0, false);
    for (now, taken) in [(599.0, false), (600.0, true)] {
        let mut st = busy(&m, NORMAL, Some(10_000.0), 0.0, Some(10.0));
        let (admitted, preempted) = cycle(&m, &mut st, now);
        assert_eq!(preempted.len(), usize::from(taken), "at {now}");
        assert_eq!(admitted.len(), usize::from(taken), "at {now}");
    }
}

#[test]
fn a_lower_class_victim_needs_neither_checkpoint_nor_minimum_nor_end() {
    let m = model(600.0, false);
    // just started, no checkpoint, no max_runtime
    let mut st = busy(&m, LOW, None, 990.0, None);
    let (admitted, preempted) = cycle(&m, &mut st, 1000.0);
    assert_eq!(admitted, vec!["r".to_string()]);
    assert_eq!(preempted, vec![("v".into(), "r".into(), 80.0)]);
}

#[test]
fn a_run_loaded_as_being_preempted_holds_nothing() {
    let m = model(600.0, false);
    let mut st = State::new(&m);
    let mut v = run("v", 0, NORMAL, 8, Some(50.0));
    v.admitted_at = Some(0.0);
    let p = whole(0, (0..8).collect());
    st.hold(&m, v, p, true).expect("hold");
    assert_eq!(st.cap.used, vec![0.0]);
    assert_eq!(st.cap.free[0].len(), 8);
    assert!(st.ends[0].is_empty() && st.moving[0].is_empty());
    st.enqueue(run("r", 1, NORMAL, 8, Some(100.0)))
        .expect("enqueue");
    let (admitted, preempted) = cycle(&m, &mut st, 10.0);
    assert_eq!((admitted, preempted.len()), (vec!["r".to_string()], 0));
    st.finish(&m, 0).expect("finish");
    assert_eq!(st.cap.used, vec![8.0]);
}

// -- issue 24: starvation (`tests/core/test_starvation.py` is the Python side) -------------

/// The model with backfill on and the project's nominal quota `nominal`.
fn backfill_model(nominal: f64) -> Model {
    let mut m = model(600.0, false);
    m.policy.backfill = true;
    m.projects[0].terms[0].nominal = nominal;
    m
}

/// `n` one-GPU runs holding devices 0..n since 0, each with `max_runtime`.
fn holders(m: &Model, n: usize, max_runtime: Option<f64>) -> State {
    let mut st = State::new(m);
    for d in 0..n {
        let mut h = run(&format!("h{d}"), d as i64, NORMAL, 1, max_runtime);
        h.admitted_at = Some(0.0);
        h.started_at = Some(0.0);
        let p = whole(0, vec![d as u16]);
        st.hold(m, h, p, false).expect("hold");
    }
    st
}

fn queued(st: &mut State, id: &str, seq: i64, gpus: usize, mr: Option<f64>, at: f64) {
    let mut r = run(id, seq, NORMAL, gpus, mr);
    r.submitted_at = at;
    st.enqueue(r).expect("enqueue");
}

#[test]
fn the_reservation_goes_to_the_oldest_blocked_run_not_the_orders_head() {
    let m = backfill_model(16.0);
    let mut st = holders(&m, 7, Some(50.0));
    queued(&mut st, "big", 10, 8, Some(1000.0), 0.0);
    // the order's head among the blocked: a reservation for it would let "tiny" in
    queued(&mut st, "medium", 11, 2, Some(60.0), 5.0);
    queued(&mut st, "tiny", 12, 1, Some(100.0), 6.0); // ends at 110, after 50
    assert_eq!(cycle(&m, &mut st, 10.0), (vec![], vec![]));
    assert_eq!(st.anchor.map(|i| st.runs[i].id.clone()), Some("big".into()));
}

#[test]
fn runs_without_max_runtime_make_a_reservation_of_unknown_time_that_nothing_takes() {
    let m = backfill_model(16.0);
    let mut st = holders(&m, 7, None);
    queued(&mut st, "big", 10, 8, None, 0.0);
    queued(&mut st, "open", 11, 1, None, 1.0);
    queued(&mut st, "short", 12, 1, Some(5.0), 2.0);
    let mut c = Cycle::new(&m, &mut st, 10.0, None, Vec::new());
    assert!(c.reservation.as_ref().is_some_and(|r| r.at.is_infinite()));
    c.run();
    assert!(c.admissions.is_empty());
}

#[test]
fn the_quota_the_anchor_waits_for_is_held_and_the_kept_anchor_starts_first() {
    let m = backfill_model(8.0); // the quota is the node, as `mlops-gpu init` writes it
    let mut st = holders(&m, 4, Some(50.0));
    queued(&mut st, "big", 10, 8, Some(1000.0), 0.0);
    queued(&mut st, "long", 11, 1, Some(500.0), 1.0); // would hold quota past 50
    queued(&mut st, "quick", 12, 1, Some(30.0), 2.0); // ends at 40: it may
    assert_eq!(cycle(&m, &mut st, 10.0).0, vec!["quick".to_string()]);
    for id in ["h0", "h1", "h2", "h3", "quick"] {
        st.finish(&m, st.by_id[id]).expect("finish"); // they end
    }
    // everything is free: under `shortest` "long" comes first, but "big" keeps its reservation
    assert_eq!(cycle(&m, &mut st, 60.0).0, vec!["big".to_string()]);
}

#[test]
fn a_queue_keeps_its_oldest_runs_age_through_enqueues_and_dequeues() {
    // (`backfill::anchor` compares queues by this copy, not by the run)
    let m = backfill_model(16.0);
    let mut st = holders(&m, 0, None);
    let kept = |st: &State| {
        let q = &st.queues[0][0];
        let o = &st.runs[q.oldest];
        assert_eq!(q.oldest_age, (o.submitted_at, o.seq));
        o.id.clone()
    };
    queued(&mut st, "b", 11, 2, Some(60.0), 5.0);
    assert_eq!(kept(&st), "b");
    queued(&mut st, "a", 10, 2, Some(90.0), 1.0); // older, later in the order
    queued(&mut st, "c", 12, 2, Some(30.0), 7.0);
    assert_eq!(kept(&st), "a");
    st.dequeue(st.by_id["a"]);
    assert_eq!(kept(&st), "b");
    st.dequeue(st.by_id["c"]);
    assert_eq!(kept(&st), "b");
}
