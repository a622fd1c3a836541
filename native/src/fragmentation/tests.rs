//! Values printed by `mlops_gpu.core.fragmentation` (CPython 3.11) for the same mix.
use super::*;
use crate::fgd::growth_class;
use crate::spec::PriorShape;

fn shape(m: &mut Mix, gpus: usize, cpu: i64, mem: i64, names: &[&str], types: &[usize]) -> Shape {
    let accepts = if names.is_empty() {
        0
    } else {
        m.intern(names.iter().map(|s| s.to_string()).collect(), types)
    };
    Shape {
        gpus,
        share_bits: 1.0f64.to_bits(),
        cpu,
        mem,
        accepts,
    }
}

fn sig(whole: usize, cpu: Option<i64>, mem: Option<i64>, ty: usize) -> Sig {
    Sig {
        free: vec![1.0f64.to_bits(); whole],
        cpu,
        mem,
        ty,
    }
}

/// Types a (0) and b (1) in the cluster; "zz" is not.
fn mix() -> (Mix, [Shape; 4]) {
    let mut m = Mix::new(2);
    let one = shape(&mut m, 1, 4000, 16000, &[], &[]);
    let two = shape(&mut m, 2, 8000, 0, &["b", "a"], &[0, 1]);
    let four = shape(&mut m, 4, 0, 0, &["zz", "b", "b"], &[1]);
    let eight = shape(&mut m, 8, 1000, 0, &[], &[]);
    // added in an order unlike the ranking: the weights must not depend on it
    for s in [eight, two, one, four, one, two, one] {
        m.add(s);
    }
    (m, [one, two, four, eight])
}

#[test]
fn weights_rank_by_count_then_shape_and_round_to_the_quantum() {
    let (m, [one, two, four, eight]) = mix();
    m.refresh();
    let w = m.derived().weights.clone();
    assert_eq!(
        w,
        vec![(one, 0.429), (two, 0.286), (four, 0.143), (eight, 0.143)]
    );
    assert_eq!(m.cpu_per_gpu(), Some(1526.3157894736844));
    assert_eq!(m.restricted(), vec![2.0, 4.0]);
}

#[test]
fn node_fragment_and_growth_as_python() {
    let (m, [one, two, four, eight]) = mix();
    let a = sig(5, Some(12000), Some(64000), 0);
    assert_eq!(m.node_fragment(&a), 1.43);
    let after = after_whole(&a, 2, 8000, 0);
    assert_eq!(m.node_fragment(&after), 1.7159999999999997);
    assert_eq!(m.imbalance(&after), 0.25);
    let growth = m.node_fragment(&after) - m.node_fragment(&a);
    assert_eq!(growth, 0.2859999999999998);
    assert_eq!(growth_class(pyfloat::round_to(growth, 9)), -42);
    let b = sig(3, None, Some(4000), 1);
    assert_eq!(m.node_fragment(&b), 2.1449999999999996);
    assert_eq!(m.imbalance(&b), 0.0);
    let frags: Vec<(f64, f64)> = [one, eight, two, four]
        .iter()
        .map(|s| (m.shape_fragment(&a, s), m.shape_fragment(&b, s)))
        .collect();
    assert_eq!(frags, vec![(0.0, 3.0), (5.0, 3.0), (0.0, 0.0), (5.0, 3.0)]);
}

#[test]
fn growth_classes_as_python() {
    let got: Vec<i64> = [0.0, 0.04, 0.05, -0.04, 1.0, -3.0, 0.5]
        .iter()
        .map(|&g| growth_class(g))
        .collect();
    assert_eq!(got, vec![-50, -49, -48, -50, -26, -95, -37]);
}

#[test]
fn a_prior_adds_its_counts_as_python() {
    let (mut m, [one, two, four, eight]) = mix();
    let prior = |gpus, cpu, mem, names: &[&str], types: &[usize], count| PriorShape {
        gpus,
        share: 1.0,
        cpu_milli: cpu,
        host_memory_mb: mem,
        accepts: names.iter().map(|s| s.to_string()).collect(),
        gpu_types: types.to_vec(),
        count,
    };
    m.add_prior(&prior(1, 4000, 16000, &[], &[], 2.0)).unwrap();
    m.add_prior(&prior(4, 0, 0, &["zz"], &[], 5.0)).unwrap();
    m.add_prior(&prior(2, 8000, 0, &["a", "b"], &[0, 1], 1.0))
        .unwrap();
    for bad in [f64::NAN, f64::INFINITY, -1.0] {
        assert!(m.add_prior(&prior(1, 0, 0, &[], &[], bad)).is_err());
    }
    m.refresh();
    let zz = m.derived().weights[1].0;
    assert_eq!(m.set(zz.accepts).names, vec!["zz".to_string()]);
    let w = m.derived().weights.clone();
    let want = [
        (one, 0.333),
        (zz, 0.333),
        (two, 0.2),
        (four, 0.067),
        (eight, 0.067),
    ];
    assert_eq!(w, want.to_vec());
    assert_eq!(m.cpu_per_gpu(), Some(1045.3119553851516));
    assert_eq!(m.node_fragment(&sig(5, Some(12000), Some(64000), 0)), 2.335);
    assert_eq!(m.restricted(), vec![2.0, 4.0]); // (active runs only)
}

#[test]
fn a_prior_shape_is_keyed_by_its_sorted_types_and_its_counts_need_not_be_whole() {
    let prior = |names: &[&str], count| PriorShape {
        gpus: 2,
        share: 1.0,
        cpu_milli: 0,
        host_memory_mb: 0,
        accepts: names.iter().map(|s| s.to_string()).collect(),
        gpu_types: vec![0, 1],
        count,
    };
    let mut split = Mix::new(2);
    split.add_prior(&prior(&["b", "a"], 0.1)).unwrap();
    split.add_prior(&prior(&[], 1.0)).unwrap();
    split.add_prior(&prior(&["a", "b"], 0.2)).unwrap();
    let mut merged = Mix::new(2);
    merged.add_prior(&prior(&["a", "b"], 0.1 + 0.2)).unwrap();
    merged.add_prior(&prior(&[], 1.0)).unwrap();
    split.refresh();
    merged.refresh();
    assert_eq!(split.derived().weights, merged.derived().weights);
    assert_eq!(split.derived().weights[1].1, 0.231); // (0.3 of 1.3)
    assert_eq!(split.prior.len(), 2);
}

#[test]
fn add_and_remove_are_inverses() {
    let (mut m, [one, two, _, _]) = mix();
    let before = m.node_fragment(&sig(4, Some(9000), None, 1));
    let extra = shape(&mut m, 3, 0, 0, &["a"], &[0]);
    m.add(extra);
    m.add(two);
    assert_ne!(m.restricted(), vec![2.0, 4.0]);
    m.remove(extra);
    m.remove(two);
    assert_eq!(m.restricted(), vec![2.0, 4.0]);
    assert_eq!(m.node_fragment(&sig(4, Some(9000), None, 1)), before);
    m.remove(one);
    assert_ne!(m.node_fragment(&sig(4, Some(9000), None, 1)), before);
}
