//! Spent budgets (`fairshare.budget_exceeded`, `CycleBooks.level_of`): a project whose budget for
//! the current window is spent either waits (`action: wait`: none of its runs is served this
//! cycle, none is the anchor) or is served at its budget's `lower_to` class (`action: lower`:
//! each run at the lower of its own class and that one). What is spent is the caller's to
//! know (the store's usage ledger); a cycle takes each spent project's effect as a `Limit`.
//!
//! Invariant: a run's `class` never changes with its budget (its queue, its victim pool and
//! who may preempt it read the class); only the level it is served at does: the pass it is
//! served in, the anchor's choice, `overtaken`, and whether its preemption plan must leave
//! the reservation alone.

/// One spent budget: the project, and the class value its runs are lowered to (None: they
/// wait).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BudgetSpent {
    pub project: usize,
    pub lower_to: Option<i64>,
}

/// A project's budget effect this cycle.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    Free,
    Wait,
    Lower(i64),
}

/// The per-project limits from the spent budgets (`n` projects, indices checked by the
/// caller).
pub fn limits(n: usize, spent: &[BudgetSpent]) -> Vec<Limit> {
    let mut out = vec![Limit::Free; n];
    for b in spent {
        out[b.project] = match b.lower_to {
            None => Limit::Wait,
            Some(v) => Limit::Lower(v),
        };
    }
    out
}

/// The level a run of `class` is served at under `limit`, or None when it waits.
pub fn level(limit: Limit, class: i64) -> Option<i64> {
    match limit {
        Limit::Free => Some(class),
        Limit::Wait => None,
        Limit::Lower(v) => Some(v.min(class)),
    }
}
