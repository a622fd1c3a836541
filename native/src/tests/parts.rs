//! MIG slices and shared devices on one 8-GPU node of the default model (`tests::model`):
//! node 0 has 8 whole devices; in `sliced` it also has three 1g slices and one 3g slice
//! (device numbers 8..12), in `shared` its devices may be shared (80 GB each). Slices are
//! taken first-free and given back in order without touching the whole devices; a shared
//! device leaves the free devices while any run holds part of it and comes back when the
//! last leaves; amounts are the slices' and fractions' shares. The Python core
//! (`core/capacity.py`, `core/placement.py`) is the specification; `tests/test_native_core.py`
//! compares at large.

use super::{cycle, model, run, LOW, NORMAL};
use crate::capacity::Capacity;
use crate::cycle::Cycle;
use crate::eta::NoEta;
use crate::explain;
use crate::model::Model;
use crate::parts::{NodeParts, Shape};
use crate::placement::place;
use crate::state::{Run, State};

const ONE_G: usize = 0;
const THREE_G: usize = 1;

fn sliced() -> Model {
    let mut m = model(0.0, true);
    m.parts = vec![NodeParts {
        mig: vec![(ONE_G, 8, 3), (THREE_G, 11, 1)],
        mig_placeable: true,
        ..NodeParts::default()
    }];
    m.capacity_by_type = vec![8.0 + 3.0 / 7.0 + 3.0 / 7.0];
    m
}

fn shared() -> Model {
    let mut m = model(0.0, true);
    m.parts = vec![NodeParts {
        shared: true,
        gpu_memory_mb: Some(80_000),
        // device 7 sorts first by name (e.g. "a" among "b".."h")
        name_rank: vec![1, 2, 3, 4, 5, 6, 7, 0],
        ..NodeParts::default()
    }];
    m
}

fn slices(id: &str, class: i64, gpus: usize, profile: usize) -> Run {
    let mut r = run(id, 0, class, gpus, Some(100.0));
    r.shape = Shape::Mig {
        profile,
        share: if profile == ONE_G {
            1.0 / 7.0
        } else {
            3.0 / 7.0
        },
    };
    r
}

fn part(id: &str, seq: i64, class: i64, fraction: Option<f64>, memory_mb: Option<i64>) -> Run {
    let mut r = run(id, seq, class, 1, Some(100.0));
    r.shape = Shape::Shared {
        fraction,
        memory_mb,
    };
    r
}

#[test]
fn mig_slices_are_taken_first_free_and_given_back_in_order() {
    let m = sliced();
    let mut cap = Capacity::new(&m);
    let r = slices("m", NORMAL, 2, ONE_G);
    let p = place(&m, &cap, &r, 0, None).expect("three 1g slices free");
    assert_eq!(p.slots, vec![(0, vec![8, 9])]);
    assert_eq!(p.amount(), 2.0 / 7.0);
    cap.take(&m, 0, &p);
    assert_eq!(cap.mig_free[0], vec![vec![10], vec![11]]);
    assert_eq!(cap.free[0].len(), 8, "slices are no whole devices");
    assert!(place(&m, &cap, &r, 0, None).is_none(), "one 1g slice left");
    let one = place(&m, &cap, &slices("n", NORMAL, 1, ONE_G), 0, None).expect("one left");
    cap.take(&m, 0, &one);
    cap.release(&m, 0, &p);
    assert_eq!(cap.mig_free[0], vec![vec![8, 9], vec![11]]);
    cap.release(&m, 0, &one);
    assert_eq!(cap.mig_free[0], vec![vec![8, 9, 10], vec![11]]);
    assert!(cap.used[0].abs() < 1e-12);
    // a profile the node does not offer, or a backend that does not place MIG: nowhere
    assert!(place(&m, &cap, &slices("x", NORMAL, 1, 7), 0, None).is_none());
    let mut off = sliced();
    off.parts[0].mig_placeable = false;
    assert!(place(&off, &Capacity::new(&off), &r, 0, None).is_none());
}

#[test]
fn a_shared_device_leaves_the_free_devices_until_its_last_holder_leaves() {
    let m = shared();
    let mut cap = Capacity::new(&m);
    // every device is empty: the tie goes to the first device by name (7)
    let a = place(&m, &cap, &part("a", 0, NORMAL, Some(0.5), None), 0, None).expect("fits");
    assert_eq!(a.slots, vec![(0, vec![7])]);
    cap.take(&m, 0, &a);
    assert_eq!(cap.free[0].len(), 7);
    // best fit: the half-used device (nothing left after it) before an empty one
    let b = place(&m, &cap, &part("b", 0, NORMAL, Some(0.5), None), 0, None).expect("fits");
    assert_eq!(b.slots, vec![(0, vec![7])]);
    cap.take(&m, 0, &b);
    assert_eq!(cap.shared[0], vec![(7, 1.0, 0)]);
    cap.release(&m, 0, &a);
    assert_eq!(cap.free[0].len(), 7, "b still holds half of it");
    cap.release(&m, 0, &b);
    assert_eq!(cap.free[0].len(), 8);
    assert!(cap.shared[0].is_empty());
}

#[test]
fn a_memory_cap_is_charged_its_share_and_needs_the_memory_left() {
    let m = shared();
    let mut cap = Capacity::new(&m);
    let mem = part("m", 0, NORMAL, None, Some(60_000));
    let p = place(&m, &cap, &mem, 0, None).expect("fits");
    assert_eq!(p.amount(), 0.75);
    assert_eq!(
        mem.amount(),
        1.0,
        "a memory cap counts a whole GPU until placed"
    );
    cap.take(&m, 0, &p);
    // 20 GB left on device 7 (a quarter of it): 30 GB goes elsewhere, 20 GB fits there
    let q = place(
        &m,
        &cap,
        &part("q", 0, NORMAL, Some(0.25), Some(30_000)),
        0,
        None,
    );
    assert_ne!(q.expect("another device").slots[0].1, vec![7]);
    let r = place(
        &m,
        &cap,
        &part("r", 0, NORMAL, Some(0.25), Some(20_000)),
        0,
        None,
    );
    assert_eq!(r.expect("device 7").slots[0].1, vec![7]);
    // a node that does not say its device memory hosts no memory-only request
    let mut blind = shared();
    blind.parts[0].gpu_memory_mb = None;
    assert!(place(&blind, &Capacity::new(&blind), &mem, 0, None).is_none());
}

#[test]
fn a_whole_gpu_run_preempts_the_shared_runs_of_a_device_it_needs() {
    let m = shared();
    let mut st = State::new(&m);
    st.enqueue(run("w", 0, LOW, 7, None)).expect("enqueue");
    st.enqueue(part("a", 1, LOW, Some(0.5), None))
        .expect("enqueue");
    st.enqueue(part("b", 2, LOW, Some(0.25), None))
        .expect("enqueue");
    let (admitted, _) = cycle(&m, &mut st, 1.0);
    // (under `shortest` the runs with a max_runtime first: the sharers, then w on 0..7)
    assert_eq!(admitted, vec!["a", "b", "w"]);
    st.enqueue(run("r", 3, NORMAL, 1, Some(10.0)))
        .expect("enqueue");
    let (admitted, preempted) = cycle(&m, &mut st, 2.0);
    assert_eq!(admitted, vec!["r"]);
    // the cheapest sufficient set: both sharers of the last device, not the 7-GPU run
    let mut victims: Vec<String> = preempted.into_iter().map(|(v, _, _)| v).collect();
    victims.sort();
    assert_eq!(victims, vec!["a", "b"]);
}

#[test]
fn the_shares_held_without_max_runtime_are_summed_in_the_order_they_came() {
    // a, b, c, d hold parts of devices without max_runtime (loaded in that order); a ends, so
    // the project's list of holders is d, b, c. The Python core sums its active runs in the
    // order they came, b + c + d: (0.3 + 0.2) + 0.1 = 0.6, where d first would give
    // (0.1 + 0.3) + 0.2 = 0.6000000000000001.
    let mut m = shared();
    m.projects[0].terms[0].nominal = 32.0;
    let mut st = State::new(&m);
    for (k, (id, fraction)) in [("a", 0.4), ("b", 0.3), ("c", 0.2), ("d", 0.1)]
        .into_iter()
        .enumerate()
    {
        let mut r = part(id, k as i64, NORMAL, Some(fraction), None);
        r.max_runtime = None;
        let p = place(&m, &st.cap, &r, 0, None).expect("room on a device");
        st.hold(&m, r, p, false).expect("hold");
    }
    st.finish(&m, st.by_id["a"]).expect("active");
    st.enqueue(run("w", 9, NORMAL, 8, None)).expect("enqueue");
    let mut c = Cycle::new(&m, &mut st, 1.0, None, Vec::new());
    c.log = Some(Box::default());
    c.run();
    let e = explain::finish(&mut c);
    assert_eq!(e.no_eta, vec![NoEta::HeldUnknown(0.3 + 0.2 + 0.1)]);
    assert_ne!(0.3 + 0.2 + 0.1, 0.1 + 0.3 + 0.2);
}

#[test]
fn used_counts_sevenths_exactly_whatever_the_order_they_came_and_went_in() {
    // issue 25: 2g, 2g, 3g, 3g, 2g booked, then a 2g and a 3g given back
    let (mut float, mut units) = (0.0_f64, 0_i64);
    for k in [2.0, 2.0, 3.0, 3.0, 2.0] {
        float += k / 7.0;
        units += crate::capacity::units(k / 7.0);
    }
    for k in [2.0, 3.0] {
        float -= k / 7.0;
        units -= crate::capacity::units(k / 7.0);
    }
    assert_eq!(
        float, 1.0000000000000002,
        "summed as floats: a last bit off"
    );
    assert_eq!(units as f64 / crate::capacity::UNIT, 1.0);
    assert_eq!(
        crate::capacity::units(0.25) * 4,
        crate::capacity::units(1.0)
    );
}

#[test]
fn slices_given_back_admit_a_mig_run_they_blocked() {
    // (no preemption: the blocked run is remembered so, `verdict`, until slices come back)
    let mut m = sliced();
    m.policy.preemption = false;
    let mut st = State::new(&m);
    let mut a = slices("a", NORMAL, 3, ONE_G);
    (a.admitted_at, a.started_at) = (Some(0.0), Some(0.0));
    let p = place(&m, &st.cap, &a, 0, None).expect("three 1g slices free");
    st.hold(&m, a, p, false).expect("hold");
    st.enqueue(slices("r", NORMAL, 1, ONE_G)).expect("enqueue");
    assert!(cycle(&m, &mut st, 10.0).0.is_empty());
    st.finish(&m, 0).expect("finish");
    assert_eq!(cycle(&m, &mut st, 11.0).0, vec!["r".to_string()]);
}
