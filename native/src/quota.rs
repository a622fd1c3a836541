//! Quota checks (`mlops_gpu.core.quota.QuotaBook`): nominal quota, borrowing and lending
//! limits, cohort trees that lend idle quota; only a preemptible run may borrow. Read from the model and the usage vector, so a
//! preemption trial that gives GPUs back is seen at once.

use crate::model::Model;

const EPS: f64 = 1e-9;

/// (borrowed, lendable) summed over the tree's members, `project` holding `amount` more; its
/// own lendable left out unless `lend_of_project` (`QuotaBook.cohort_sums`).
pub fn cohort_sums(
    m: &Model,
    used: &[f64],
    root: usize,
    ty: usize,
    project: Option<usize>,
    amount: f64,
    lend_of_project: bool,
) -> (f64, f64) {
    let (mut borrowed, mut lendable) = (0.0f64, 0.0f64);
    for &member in &m.members[root] {
        let q = m.term(member, ty);
        let mine = project == Some(member);
        let u = used[m.pt(member, ty)] + if mine { amount } else { 0.0 };
        borrowed += (u - q.nominal).max(0.0);
        if lend_of_project || !mine {
            let idle = (q.nominal - u).max(0.0);
            lendable += match q.lending {
                None => idle,
                Some(l) => idle.min(l),
            };
        }
    }
    (borrowed, lendable)
}

/// Whether `project` may add `amount` of `ty` now for a run that is `preemptible` (or not:
/// then only within nominal, as only a reclaimable run may borrow) (`QuotaBook.admits`).
pub fn admits(
    m: &Model,
    used: &[f64],
    project: usize,
    ty: usize,
    amount: f64,
    preemptible: bool,
) -> bool {
    let q = m.term(project, ty);
    let after = used[m.pt(project, ty)] + amount;
    if after <= q.nominal + EPS {
        return true;
    }
    if !preemptible {
        return false;
    }
    if let Some(b) = q.borrowing {
        if after > q.nominal + b + EPS {
            return false;
        }
    }
    match m.projects[project].root {
        None => false,
        Some(root) => {
            let (borrowed, lendable) = cohort_sums(m, used, root, ty, Some(project), amount, true);
            borrowed <= lendable + EPS
        }
    }
}

/// The least GPUs of `ty` that must come back before `admits` (same arguments) may say yes:
/// (by the project itself, anywhere in its cohort tree, itself included), infinite where no
/// give-back of that kind is needed. While the project gives back less than the first or the
/// tree less than the second, it still says no: a give-back of x lowers the project's usage
/// by x at most, and raises what its tree lends less what it borrows (`cohort_sums`) by at
/// most x (each member's term moves with its usage at a slope of 0 or 1).
pub fn lack(
    m: &Model,
    used: &[f64],
    project: usize,
    ty: usize,
    amount: f64,
    preemptible: bool,
) -> (f64, f64) {
    let q = m.term(project, ty);
    let after = used[m.pt(project, ty)] + amount;
    let own = after - q.nominal - EPS; // (to fit within nominal quota)
    if own <= 0.0 {
        return (f64::INFINITY, f64::INFINITY); // (it admits now)
    }
    let root = match m.projects[project].root {
        Some(root) if preemptible => root,
        _ => return (own, f64::INFINITY), // (only within nominal quota)
    };
    // else it borrows once the project is within its borrowing limit and the tree lends
    // enough: neither before the tree gave back the larger of the two
    let limit = q.borrowing.map_or(0.0, |b| after - q.nominal - b - EPS);
    let (borrowed, lendable) = cohort_sums(m, used, root, ty, Some(project), amount, true);
    let lend = borrowed - lendable - EPS;
    (own, limit.max(lend))
}

pub fn within_nominal(m: &Model, used: &[f64], project: usize, ty: usize, amount: f64) -> bool {
    used[m.pt(project, ty)] + amount <= m.term(project, ty).nominal + EPS
}

/// Whether the tree lends nothing more of `ty` (`CycleBooks.cohort_exhausted`).
pub fn cohort_exhausted(m: &Model, used: &[f64], root: usize, ty: usize) -> bool {
    let (borrowed, lendable) = cohort_sums(m, used, root, ty, None, 0.0, true);
    lendable - borrowed <= EPS
}

/// The most of `ty` the project could add without a certain quota problem (`CycleBooks.room`).
pub fn room(m: &Model, used: &[f64], project: usize, ty: usize) -> f64 {
    let q = m.term(project, ty);
    let u = used[m.pt(project, ty)];
    match m.projects[project].root {
        Some(root) if !cohort_exhausted(m, used, root, ty) => match q.borrowing {
            None => f64::INFINITY,
            Some(b) => q.nominal + b - u,
        },
        _ => q.nominal - u,
    }
}
