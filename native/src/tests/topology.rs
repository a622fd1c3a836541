//! Topology on four 4-GPU nodes of one backend: n0 in rack 0, n1 and n2 in rack 1, n3 with no
//! rack; no node has a zone. A gang asking for a rack goes to the rack with room for it
//! (required or preferred); a required key no node has places nothing, a preferred one falls
//! back to best fit; the anchor's and the empty cluster's judgments follow. The Python core
//! is the specification (`placement._place_whole`, `_gang`); `tests/test_native_core.py`
//! compares at large.

use super::{model, run, whole};
use crate::backfill::ever_fits;
use crate::capacity::Capacity;
use crate::model::{Model, Node};
use crate::placement::place;
use crate::state::Run;

const RACK: usize = 0;
const ZONE: usize = 1;

fn racks() -> Model {
    let mut m = model(0.0, true);
    let node = |rack: Option<u32>| Node {
        ty: 0,
        backend: 0,
        ndev: 4,
        schedulable: true,
        labels: vec![rack, None],
        cpu_milli: None,
        host_memory_mb: None,
    };
    m.nodes = vec![node(Some(0)), node(Some(1)), node(Some(1)), node(None)];
    m.of_type = vec![vec![0, 1, 2, 3]];
    m.capacity_by_type = vec![16.0];
    m
}

fn gang(key: Option<usize>, required: bool, gpus: usize, nodes: usize) -> Run {
    let mut r = run("g", 0, 1, gpus, Some(10.0));
    r.nodes = nodes;
    r.topology = key;
    r.topology_required = required;
    r
}

fn nodes_of(m: &Model, cap: &Capacity, r: &Run) -> Option<Vec<usize>> {
    place(m, cap, r, 0, None).map(|p| p.slots.iter().map(|s| s.0).collect())
}

#[test]
fn a_gang_goes_to_the_rack_with_room_for_it() {
    let m = racks();
    let cap = Capacity::new(&m);
    for required in [true, false] {
        let r = gang(Some(RACK), required, 4, 2);
        assert_eq!(nodes_of(&m, &cap, &r), Some(vec![1, 2]));
    }
    // without a topology: best fit, then name
    assert_eq!(
        nodes_of(&m, &cap, &gang(None, false, 4, 2)),
        Some(vec![0, 1])
    );
}

#[test]
fn a_required_key_no_node_has_places_nothing_a_preferred_one_falls_back() {
    let m = racks();
    let cap = Capacity::new(&m);
    assert_eq!(nodes_of(&m, &cap, &gang(Some(ZONE), true, 1, 2)), None);
    assert_eq!(
        nodes_of(&m, &cap, &gang(Some(ZONE), false, 1, 2)),
        Some(vec![0, 1])
    );
    assert_eq!(nodes_of(&m, &cap, &gang(Some(7), true, 1, 1)), None); // (an unknown key)
    assert!(!ever_fits(&m, &gang(Some(ZONE), true, 1, 1), 0));
    assert!(ever_fits(&m, &gang(Some(ZONE), false, 1, 2), 0));
    assert!(ever_fits(&m, &gang(Some(RACK), true, 4, 2), 0));
    assert!(!ever_fits(&m, &gang(Some(RACK), true, 4, 3), 0)); // no rack has 3 nodes
}

#[test]
fn a_single_node_run_preferring_a_rack_takes_the_best_fit_a_required_one_a_racked_node() {
    let m = racks();
    let mut cap = Capacity::new(&m);
    // n3 (no rack) has 1 GPU free after this: the best fit for 1 GPU
    let holder = whole(3, vec![0, 1, 2]);
    cap.take(&m, 0, &holder);
    assert_eq!(
        nodes_of(&m, &cap, &gang(Some(RACK), false, 1, 1)),
        Some(vec![3])
    );
    assert_eq!(
        nodes_of(&m, &cap, &gang(Some(RACK), true, 1, 1)),
        Some(vec![0])
    );
}
