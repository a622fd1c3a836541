//! The queues a cycle serves, per class level: every queue of a project whose budget lets it
//! run, in the project's order, less those known blocked as the cycle begins where they may be
//! left out (`verdict`: under fair share, where a project's turn does not depend on its
//! queues' heads).
//!
//! Invariant: the same ranges, in the same order, whether the queues asleep (`Dormancy`) are
//! skipped unread or each is asked `known_blocked`: a queue asleep is known blocked.

use std::collections::BTreeMap;

use super::{Cycle, Range};
use crate::verdict::tag;

/// Per level, per project: its queues' ranges.
pub(super) type Levels = BTreeMap<i64, Vec<Vec<Range>>>;

impl Cycle<'_> {
    pub(super) fn levels(&mut self) -> Levels {
        let pol = &self.m.policy;
        if self.dormancy && self.log.is_none() && pol.fair_share && !pol.strict_fifo {
            return self.levels_awake();
        }
        let n = self.m.projects.len();
        let mut levels = Levels::new();
        for (p, qs) in self.st.queues.iter().enumerate() {
            for (j, q) in qs.iter().enumerate() {
                let Some(at) = self.level(p, q.key.class) else {
                    continue; // its budget is spent: it waits
                };
                let level = levels.entry(at).or_insert_with(|| vec![Vec::new(); n]);
                if level[p].is_empty() {
                    level[p].reserve(qs.len() - j); // (one allocation, not one per growth)
                }
                level[p].push(Range {
                    queue: j,
                    lo: 0,
                    hi: q.runs.len(),
                });
            }
        }
        levels
    }

    /// `levels` over the queues awake, each found known blocked falling asleep (left out):
    /// a cycle's admissions only take, so they stay blocked unless a victim gives GPUs back
    /// (`verdict::cycle` wakes them then). The queues `awake` names are kept in however they
    /// are known.
    fn levels_awake(&mut self) -> Levels {
        let n = self.m.projects.len();
        let epoch = self.st.dormancy.begin();
        self.epoch = Some(epoch);
        let mut levels = Levels::new();
        let mut queues: Vec<usize> = Vec::new();
        for p in 0..n {
            queues.clear();
            queues.extend(self.st.dormancy.awake(p));
            for &j in &queues {
                let q = &self.st.queues[p][j];
                let Some(at) = self.level(p, q.key.class) else {
                    continue; // its budget is spent: it waits
                };
                let hi = q.runs.len();
                let kept = !self.awake.is_empty() && self.awake.contains(&(p, j));
                if !kept && self.known_blocked(p, j) {
                    self.sleep(p, j, tag(epoch, false));
                    continue;
                }
                let level = levels.entry(at).or_insert_with(|| vec![Vec::new(); n]);
                if level[p].is_empty() {
                    level[p].reserve(queues.len()); // (one allocation, not one per growth)
                }
                level[p].push(Range {
                    queue: j,
                    lo: 0,
                    hi,
                });
            }
        }
        levels
    }
}
