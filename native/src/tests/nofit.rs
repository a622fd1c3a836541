//! `nofit`'s memo against the plain node walk: on four 4-GPU nodes of one type (two plain
//! nodes in two racks, one with MIG slices, one shared; all tracking host CPU), a seeded
//! sequence of placements taken and given back, and after each step every request placed
//! both ways: `place` (with the memo) must answer exactly as `place_scan` (without), and the
//! memo must have answered some of them (else the test would prove nothing).

use super::{model, run};
use crate::capacity::{Capacity, Placement};
use crate::model::{Model, Node};
use crate::parts::{NodeParts, Shape};
use crate::placement::{place, place_scan};
use crate::state::Run;

fn mixed() -> Model {
    let mut m = model(0.0, true);
    let node = |rack: u32| Node {
        ty: 0,
        backend: 0,
        ndev: 4,
        schedulable: true,
        labels: vec![Some(rack)],
        cpu_milli: Some(8_000),
        host_memory_mb: Some(64_000),
    };
    m.nodes = vec![node(0), node(1), node(1), node(0)];
    m.of_type = vec![vec![0, 1, 2, 3]];
    m.capacity_by_type = vec![16.0];
    m.parts = vec![
        NodeParts::default(),
        NodeParts::default(),
        NodeParts {
            mig: vec![(0, 4, 3)], // three 1g slices, numbers 4..7
            mig_placeable: true,
            ..NodeParts::default()
        },
        NodeParts {
            shared: true,
            gpu_memory_mb: Some(80_000),
            name_rank: vec![0, 1, 2, 3],
            ..NodeParts::default()
        },
    ];
    m
}

fn requests() -> Vec<Run> {
    let with = |gpus: usize, nodes: usize, shape: Shape, cpu: i64, topo: Option<usize>| {
        let mut r = run("r", 0, 1, gpus, Some(10.0));
        (r.nodes, r.shape, r.cpu_milli, r.host_memory_mb) = (nodes, shape, cpu, cpu * 4);
        (r.topology, r.topology_required) = (topo, true);
        r
    };
    let mig = Shape::Mig {
        profile: 0,
        share: 1.0 / 7.0,
    };
    let half = Shape::Shared {
        fraction: Some(0.5),
        memory_mb: None,
    };
    let mem = Shape::Shared {
        fraction: None,
        memory_mb: Some(30_000),
    };
    vec![
        with(1, 1, Shape::Whole, 1_000, None),
        with(3, 1, Shape::Whole, 3_000, None),
        with(4, 1, Shape::Whole, 0, None),
        with(2, 2, Shape::Whole, 2_000, Some(0)),
        with(1, 1, mig, 1_000, None),
        with(2, 1, mig, 500, None),
        with(1, 1, half, 1_000, None),
        with(1, 1, mem, 2_000, None),
        with(0, 1, Shape::Cpu, 4_000, None),
    ]
}

fn slots(p: Option<Placement>) -> Option<Vec<(usize, Vec<u16>)>> {
    p.map(|p| p.slots)
}

#[test]
fn the_memo_answers_as_the_node_walk() {
    let m = mixed();
    let mut cap = Capacity::new(&m);
    let reqs = requests();
    let mut held: Vec<Placement> = Vec::new();
    let mut seed: u64 = 25;
    let mut next = |n: usize| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as usize % n
    };
    let (mut remembered, mut nones) = (0, 0);
    for _ in 0..2_000 {
        if !held.is_empty() && next(3) == 0 {
            let p = held.swap_remove(next(held.len()));
            cap.release(&m, 0, &p);
        } else if let Some(p) = place_scan(&m, &cap, &reqs[next(reqs.len())], 0, None) {
            cap.take(&m, 0, &p);
            held.push(p);
        }
        for r in &reqs {
            let key = crate::nofit::key(r, 0);
            remembered += usize::from(cap.nofit.known(&key, r));
            let memo = slots(place(&m, &cap, r, 0, None));
            nones += usize::from(memo.is_none());
            assert_eq!(memo, slots(place_scan(&m, &cap, r, 0, None)));
        }
    }
    assert!(remembered > 100, "the memo answered {remembered} times");
    assert!(
        nones > remembered,
        "every request that found nothing once walked the nodes"
    );
}
