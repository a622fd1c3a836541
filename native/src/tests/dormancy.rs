//! `dormancy`: a queue asleep wakes when a stamp it watches moves, and only then; a watch
//! made before its queue woke, was reset or was removed wakes nothing later.

use super::model;
use crate::dormancy::{Dormancy, Moved, On};
use crate::model::Model;

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

fn awake(d: &Dormancy) -> Vec<u32> {
    let mut v = d.awake(0).to_vec();
    v.sort_unstable();
    v
}

#[test]
fn a_queue_wakes_once_when_a_stamp_it_watches_moves() {
    let (m, mut d) = setup();
    let (a, b) = (d.open(0, 0), d.open(0, 1));
    d.watch(On::Pool(0));
    d.watch(On::Cap(3));
    d.sleep(a, 7);
    assert_eq!(awake(&d), vec![b]);
    assert!(wake(&m, &mut d, vec![Moved::Lent(0)], 0).is_empty());
    let cap = Moved::Cap {
        from: 0,
        to: 2,
        extra: [None, None],
    };
    assert!(wake(&m, &mut d, vec![cap], 0).is_empty()); // (3 not reached)
    let mut moved = vec![Moved::Pool(0), Moved::Pool(0)];
    assert_eq!(d.wake(&m, &mut moved, |_| (0, 0)), vec![(a, 7)]);
    assert!(moved.is_empty());
    assert_eq!(awake(&d), vec![a, b]);
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
    d.watch(On::Pool(0));
    d.sleep(a, 1);
    d.stir(a); // (its head changed)
    d.watch(On::Lent(0));
    d.sleep(a, 2);
    assert!(wake(&m, &mut d, vec![Moved::Pool(0)], 0).is_empty());
    assert!(d.asleep(a));
    let b = d.open(0, 1);
    d.watch(On::Pool(0));
    d.sleep(b, 3);
    d.close(a); // (its queue emptied: b moves up)
    d.moved_to(b, 0);
    assert_eq!(d.place(b), (0, 0));
    let c = d.open(0, 1); // (a's slot again)
    assert_eq!(c, a);
    assert!(!d.asleep(c));
    assert!(wake(&m, &mut d, vec![Moved::Lent(0)], 0).is_empty());
    assert_eq!(awake(&d), vec![c]);
    assert_eq!(wake(&m, &mut d, vec![Moved::Pool(0)], 0), vec![b]);
}

#[test]
fn dead_watches_are_dropped_and_live_ones_kept() {
    let (m, mut d) = setup();
    let (a, b) = (d.open(0, 0), d.open(0, 1));
    d.watch(On::Lent(0));
    d.sleep(b, 1);
    // a falls asleep and is reset many times over: its dead watches pile up until compacted
    for k in 0..20_000 {
        d.watch(On::Pool(0));
        d.watch(On::Tree(0, 1_000_000 + k));
        d.sleep(a, 1);
        d.stir(a);
    }
    assert!(d.held() < 5000, "{} watches held", d.held()); // (40,001 made)
    d.watch(On::Pool(0));
    d.sleep(a, 2);
    assert_eq!(wake(&m, &mut d, vec![Moved::Lent(0)], 0), vec![b]);
    assert_eq!(wake(&m, &mut d, vec![Moved::Pool(0)], 0), vec![a]);
}
