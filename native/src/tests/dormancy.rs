//! `dormancy`: a queue asleep wakes when a stamp it watches moves, and only then; a watch
//! made before its queue woke, was reset or was removed wakes nothing later.

use super::model;
use crate::dormancy::{Dormancy, Moved, On};
use crate::model::Model;

/// Pool 0 grew by a run of class 0 (a lower class than the sleepers' 1: a possible victim).
const POOL: Moved = Moved::Pool {
    pt: 0,
    class: 0,
    checkpointed: false,
};

fn setup() -> (Model, Dormancy) {
    let m = model(0.0, false);
    let d = Dormancy::new(&m, 16);
    (m, d)
}

/// Wake what `moved` moves, with `own` as the quota project 0 gave back (and its tree).
fn wake(m: &Model, d: &mut Dormancy, moved: Vec<Moved>, own: u64) -> Vec<u32> {
    let mut moved = moved;
    let woken = d.wake(m, &mut moved, |_| (own, own));
    woken.into_iter().map(|(s, _)| s).collect()
}

/// The indexes of project 0's queues awake.
fn awake(d: &Dormancy) -> Vec<usize> {
    d.awake(0).collect()
}

#[test]
fn a_queue_wakes_once_when_a_stamp_it_watches_moves() {
    let (m, mut d) = setup();
    let a = d.open(0, 0);
    d.open(0, 1);
    d.watch(On::Pool(0, 1));
    d.watch(On::Cap(3));
    d.sleep(a, 7);
    assert_eq!(awake(&d), vec![1]);
    assert!(wake(&m, &mut d, vec![Moved::Lent(0)], 0).is_empty());
    let cap = Moved::Cap {
        from: 0,
        to: 2,
        extra: [None, None],
    };
    assert!(wake(&m, &mut d, vec![cap], 0).is_empty()); // (3 not reached)
    let mut moved = vec![POOL, POOL];
    assert_eq!(d.wake(&m, &mut moved, |_| (0, 0)), vec![(a, 7)]);
    assert!(moved.is_empty());
    assert_eq!(awake(&d), vec![0, 1]);
    let cap = Moved::Cap {
        from: 0,
        to: 3,
        extra: [None, None],
    };
    assert!(wake(&m, &mut d, vec![cap], 0).is_empty()); // (awake: its other watch is dead)
}

#[test]
fn quota_wakes_a_queue_once_the_count_it_lacked_is_reached() {
    let (m, mut d) = setup();
    let a = d.open(0, 0);
    d.watch(On::Own(0, 5));
    d.sleep(a, 1);
    let back = Moved::Quota { project: 0, t: 0 };
    assert!(wake(&m, &mut d, vec![back], 4).is_empty());
    assert_eq!(wake(&m, &mut d, vec![back], 5), vec![a]);
}

#[test]
fn a_watch_from_before_a_reset_or_a_removal_wakes_nothing() {
    let (m, mut d) = setup();
    let a = d.open(0, 0);
    d.watch(On::Pool(0, 1));
    d.sleep(a, 1);
    d.stir(a); // (its head changed)
    d.watch(On::Lent(0));
    d.sleep(a, 2);
    assert!(wake(&m, &mut d, vec![POOL], 0).is_empty());
    assert!(d.asleep(a));
    let b = d.open(0, 1);
    d.watch(On::Pool(0, 1));
    d.sleep(b, 3);
    d.close(a); // (its queue emptied: b moves up)
    d.moved_to(b, 0);
    assert_eq!(d.place(b), (0, 0));
    let c = d.open(0, 1); // (a's slot again)
    assert_eq!(c, a);
    assert!(!d.asleep(c));
    assert!(wake(&m, &mut d, vec![Moved::Lent(0)], 0).is_empty());
    assert_eq!(awake(&d), vec![1]); // (b, asleep, moved up to 0)
    assert_eq!(wake(&m, &mut d, vec![POOL], 0), vec![b]);
}

#[test]
fn dead_watches_are_dropped_and_live_ones_kept() {
    let (m, mut d) = setup();
    let (a, b) = (d.open(0, 0), d.open(0, 1));
    d.watch(On::Lent(0));
    d.sleep(b, 1);
    // a falls asleep and is reset many times over: its dead watches pile up until compacted
    for k in 0..20_000 {
        d.watch(On::Pool(0, 1));
        d.watch(On::Tree(0, 1_000_000 + k));
        d.sleep(a, 1);
        d.stir(a);
    }
    assert!(d.held() < 5000, "{} watches held", d.held()); // (40,001 made)
    d.watch(On::Pool(0, 1));
    d.sleep(a, 2);
    assert_eq!(wake(&m, &mut d, vec![Moved::Lent(0)], 0), vec![b]);
    assert_eq!(wake(&m, &mut d, vec![POOL], 0), vec![a]);
}

#[test]
fn removing_a_queue_moves_the_later_ones_up_in_the_awake_bits() {
    let (_, mut d) = setup();
    let slots: Vec<u32> = (0..130).map(|j| d.open(0, j)).collect();
    for &j in &[3, 64, 100, 129] {
        d.sleep(slots[j], 1);
    }
    d.close(slots[63]); // (the queues from 64 on move up one)
    for (k, &s) in slots.iter().enumerate().skip(64) {
        d.moved_to(s, k - 1);
    }
    let asleep: Vec<usize> = (0..129).filter(|j| !awake(&d).contains(j)).collect();
    assert_eq!(asleep, vec![3, 63, 99, 128]);
    assert_eq!(awake(&d).len(), 125);
}

#[test]
fn a_pool_wakes_only_the_queues_its_new_run_could_be_a_victim_of() {
    let (m, mut d) = setup();
    let (low, normal, high) = (d.open(0, 0), d.open(0, 1), d.open(0, 2));
    for (s, class) in [(low, 0), (normal, 1), (high, 2)] {
        d.watch(On::Pool(0, class));
        d.sleep(s, 1);
    }
    let grew = |class: i64, checkpointed: bool| Moved::Pool {
        pt: 0,
        class,
        checkpointed,
    };
    // a class-1 run without a checkpoint: a victim of class 2 only
    assert_eq!(wake(&m, &mut d, vec![grew(1, false)], 0), vec![high]);
    // its first checkpoint: now a victim of its own class too
    assert_eq!(wake(&m, &mut d, vec![grew(1, true)], 0), vec![normal]);
    assert!(d.asleep(low));
    let preempting = model(0.0, true); // (preempt_uncheckpointed)
    assert_eq!(
        wake(&preempting, &mut d, vec![grew(0, false)], 0),
        vec![low]
    );
}
