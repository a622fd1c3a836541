//! Host CPU and memory on two 4-GPU nodes of one backend: n0 offers 4,000 millicores, n1
//! 16,000 and 64 GB; n0 tracks no memory. A run goes only where its host resources are free
//! (best fit among those), takes them, and gives them back; an empty cluster judges whether
//! it could ever fit by the nodes' totals. The Python core is the specification
//! (`Capacity.host_fits`, `placement.eligible_nodes`); `tests/test_native_core.py` compares
//! at large. A CPU-only run (`placement._place_cpu`) holds host resources and no device.

use super::{model, run};
use crate::backfill::ever_fits;
use crate::capacity::Capacity;
use crate::model::{Model, Node};
use crate::placement::place;
use crate::state::Run;

fn hosts() -> Model {
    let mut m = model(0.0, true);
    let node = |cpu: i64, mem: Option<i64>| Node {
        ty: 0,
        backend: 0,
        ndev: 4,
        schedulable: true,
        labels: Vec::new(),
        cpu_milli: Some(cpu),
        host_memory_mb: mem,
    };
    m.nodes = vec![node(4000, None), node(16000, Some(64000))];
    m.of_type = vec![vec![0, 1]];
    m.capacity_by_type = vec![8.0];
    m
}

fn asking(gpus: usize, cpu: i64, mem: i64) -> Run {
    let mut r = run("h", 0, 1, gpus, Some(10.0));
    r.cpu_milli = cpu;
    r.host_memory_mb = mem;
    r
}

#[test]
fn a_run_goes_where_its_host_resources_are_free_and_takes_them() {
    let m = hosts();
    let mut cap = Capacity::new(&m);
    let r = asking(1, 8000, 0);
    let p = place(&m, &cap, &r, 0, None).expect("n1 has the CPU");
    assert_eq!(p.slots[0].0, 1);
    cap.take(&m, 0, &p);
    assert_eq!(cap.cpu_free, vec![Some(4000), Some(8000)]);
    // a second one fits (8,000 left on n1), a third not
    let q = place(&m, &cap, &r, 0, None).expect("n1 again");
    cap.take(&m, 0, &q);
    assert!(place(&m, &cap, &r, 0, None).is_none());
    // without host requests the best fit is n1 (2 GPUs free), not n0 (4)
    assert_eq!(
        place(&m, &cap, &asking(1, 0, 0), 0, None).map(|p| p.slots[0].0),
        Some(1)
    );
    cap.release(&m, 0, &q);
    cap.release(&m, 0, &p);
    assert_eq!(cap.cpu_free, vec![Some(4000), Some(16000)]);
    assert_eq!(cap.mem_free, vec![None, Some(64000)]);
}

#[test]
fn memory_counts_where_tracked_and_an_empty_cluster_judges_by_totals() {
    let m = hosts();
    let cap = Capacity::new(&m);
    // 2,000 m CPU fits both; 100 GB of memory only n0, which does not track memory
    let p = place(&m, &cap, &asking(1, 2000, 100_000), 0, None).expect("n0");
    assert_eq!(p.slots[0].0, 0);
    assert!(ever_fits(&m, &asking(4, 16000, 0), 0));
    assert!(!ever_fits(&m, &asking(4, 16001, 0), 0));
}

#[test]
fn a_cpu_only_run_takes_host_cpu_only_where_it_strands_the_fewest_gpus() {
    let m = hosts();
    let mut cap = Capacity::new(&m);
    let mut r = asking(0, 2000, 0);
    r.shape = crate::parts::Shape::Cpu;
    // both nodes have 4 GPUs free: the most CPU left per free GPU is n1's (14,000 / 4)
    let p = place(&m, &cap, &r, 0, None).expect("n1");
    assert_eq!((p.slots[0].0, p.slots[0].1.len(), p.amount()), (1, 0, 0.0));
    // with n0's GPUs all taken (best fit: the first by name), CPU there strands no GPU
    // (infinitely much CPU per free GPU), though n1 has more CPU
    let whole = place(&m, &cap, &asking(4, 0, 0), 0, None).expect("n0");
    assert_eq!(whole.slots[0].0, 0);
    cap.take(&m, 0, &whole);
    let p = place(&m, &cap, &r, 0, None).expect("n0");
    assert_eq!(p.slots[0].0, 0);
    cap.take(&m, 0, &p);
    // (charged no GPU)
    assert_eq!((cap.cpu_free[0], cap.used[0]), (Some(2000), 4.0));
    // all of n1's CPU: only there; more than any node has: never
    r.cpu_milli = 16000;
    assert_eq!(place(&m, &cap, &r, 0, None).map(|p| p.slots[0].0), Some(1));
    r.cpu_milli = 16001;
    assert!(place(&m, &cap, &r, 0, None).is_none() && !ever_fits(&m, &r, 0));
}
