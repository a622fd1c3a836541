//! The stamps a remembered verdict reads (`verdict`'s invariants say what moves each), and
//! what quota lacked as it was taken; each move is logged for `Dormancy::wake` (`moved`).

use super::Blocked;
use crate::dormancy::{Moved, On};
use crate::model::Model;
use crate::parts;

/// The stamps a remembered verdict compares with its own (see the module's invariants).
#[derive(Clone)]
pub struct Stamps {
    pub(super) clock: u64,
    /// Per (project, type): the GPUs of quota given back in its cohort tree (itself
    /// included), and by the project itself, in millionths rounded up (`GRAIN`).
    pub(super) tree_back: Vec<u64>,
    pub(super) own_back: Vec<u64>,
    /// Per (project, type).
    pub(super) pool_grew: Vec<u64>,
    pub(super) lent: Vec<u64>,
    /// (project, type) that took more above its nominal quota since the last cycle began:
    /// `lent` is stamped as the next begins, when a cycle reads who borrowed
    /// (`Cycle::used_at_start`).
    pub(super) borrowing: Vec<(usize, usize)>,
    /// Per type, `width` + 2 stamps: per number of GPUs a node was left with free by a
    /// give-back (up to the most a node has), then a give-back on a node with MIG slices, and
    /// one on a shared node (`MIG_NODE`, `SHARED_NODE`).
    pub(super) cap_back: Vec<u64>,
    pub(super) width: usize,
    /// Each stamp moved since `Dormancy::wake` last read them (`settle`).
    pub(super) moved: Vec<Moved>,
}

/// `Blocked::need` (and `cap_back`'s offset in a type's stamps, past the GPU counts) of a MIG
/// request or a shared one: only a give-back on a node with MIG slices, or on a shared node,
/// can give it a place (no other node serves its shape: `placement::eligible`).
pub(super) const MIG_NODE: usize = 0;
pub(super) const SHARED_NODE: usize = 1;

/// Quota given back is counted in millionths of a GPU, rounded up, and what a verdict lacks
/// rounded down, less a margin: rounding can only end a verdict early.
pub(super) const GRAIN: f64 = 1e6;

/// What quota lacked on one type as a verdict was taken (`quota::lack`): it holds there while
/// `Stamps::tree_back` is below `tree` and `own_back` below `own`.
#[derive(Clone, Copy)]
pub(super) struct Lack {
    pub(super) tree: u64,
    pub(super) own: u64,
}

impl Default for Lack {
    fn default() -> Self {
        Lack {
            tree: u64::MAX,
            own: u64::MAX,
        }
    }
}

impl Lack {
    /// What lacked (GPUs back: by the project, in its tree), counted from now in `s` for
    /// `pt`.
    pub(super) fn new(s: &Stamps, pt: usize, (own, tree): (f64, f64)) -> Lack {
        let until = |now: u64, x: f64| {
            let grains = ((x - 1e-7) * GRAIN).floor().max(0.0);
            if grains < u64::MAX as f64 {
                now.saturating_add(grains as u64)
            } else {
                u64::MAX
            }
        };
        Lack {
            tree: until(s.tree_back[pt], tree),
            own: until(s.own_back[pt], own),
        }
    }

    /// Any quota back in the tree, counted from now in `s` for `pt`.
    pub(super) fn any(s: &Stamps, pt: usize) -> Lack {
        Lack {
            tree: s.tree_back[pt] + 1,
            own: u64::MAX,
        }
    }

    fn holds(&self, s: &Stamps, pt: usize) -> bool {
        s.tree_back[pt] < self.tree && s.own_back[pt] < self.own
    }
}

impl Stamps {
    pub fn new(m: &Model) -> Stamps {
        let n = m.projects.len() * m.n_types;
        let width = m.nodes.iter().map(|n| n.ndev).max().unwrap_or(0) + 1;
        Stamps {
            clock: 1,
            tree_back: vec![0; n],
            own_back: vec![0; n],
            pool_grew: vec![0; n],
            lent: vec![0; n],
            borrowing: Vec::new(),
            cap_back: vec![0; m.n_types * (width + 2)],
            width,
            moved: Vec::new(),
        }
    }

    /// How many capacity stamps (`Dormancy::new`).
    pub fn caps(&self) -> usize {
        self.cap_back.len()
    }

    fn next(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// `project` gave back `amount` GPUs of `t`: quota may admit more in its tree.
    pub fn quota_back(&mut self, m: &Model, project: usize, t: usize, amount: f64) {
        let grains = (amount * GRAIN).ceil() as u64;
        self.moved.push(Moved::Quota {
            project: project as u32,
            t: t as u32,
        });
        self.own_back[m.pt(project, t)] += grains;
        let mut add = |o: usize| self.tree_back[m.pt(o, t)] += grains;
        match m.projects[project].root {
            Some(root) => m.members[root].iter().for_each(|&o| add(o)),
            None => add(project),
        }
    }

    /// Node `node` got something back and has `free` whole GPUs free after.
    pub fn node_back(&mut self, m: &Model, node: usize, free: usize) {
        let s = self.next();
        let base = self.cap(m.nodes[node].ty, 0);
        let to = base + free.min(self.width - 1);
        self.cap_back[base..=to].fill(s);
        let parts = parts::of(m, node);
        let mut extra = [None; 2];
        if !parts.mig.is_empty() {
            self.cap_back[base + self.width + MIG_NODE] = s;
            extra[0] = Some((base + self.width + MIG_NODE) as u32);
        }
        if parts.shared {
            self.cap_back[base + self.width + SHARED_NODE] = s;
            extra[1] = Some((base + self.width + SHARED_NODE) as u32);
        }
        self.moved.push(Moved::Cap {
            from: base as u32,
            to: to as u32,
            extra,
        });
    }

    /// The index in `cap_back` of type `t`'s stamp `need` (`Blocked::need`).
    pub(super) fn cap(&self, t: usize, need: usize) -> usize {
        t * (self.width + 2) + need
    }

    /// `project` holds more of `t` (`used`: what it holds now): where it borrows, its tree's
    /// runs may take its runs as victims from the next cycle on. (A run joins its pool only
    /// after its own take, before the next cycle begins: a pool that grows while its project
    /// borrows has had its take stamped already.)
    pub fn took(&mut self, m: &Model, project: usize, t: usize, used: f64) {
        if used > m.term(project, t).nominal + 1e-9 {
            self.borrowing.push((project, t));
        }
    }

    /// A cycle begins: who borrows as it begins is stamped.
    pub fn cycle_begins(&mut self, m: &Model) {
        if !self.borrowing.is_empty() {
            let s = self.next();
            for (p, t) in std::mem::take(&mut self.borrowing) {
                let members = match m.projects[p].root {
                    Some(root) => &m.members[root][..],
                    None => std::slice::from_ref(&p),
                };
                for &o in members {
                    self.lent[m.pt(o, t)] = s;
                    self.moved.push(Moved::Lent(m.pt(o, t) as u32));
                }
            }
        }
    }

    /// Pool `pt` gained a run of `class`, or one of its runs of `class` reported its first
    /// checkpoint (`checkpointed`: whether it has one): a possible victim more.
    pub fn pool_grew(&mut self, pt: usize, class: i64, checkpointed: bool) {
        self.pool_grew[pt] = self.next();
        self.moved.push(Moved::Pool {
            pt: pt as u32,
            class,
            checkpointed,
        });
    }

    /// The stamps `unchanged` reads of verdict `b` of a run of project `p` and `class` on
    /// `types`, each given to `watch` (`Dormancy::watch`: a queue asleep wakes as one moves;
    /// its pool's only for a run that could be its victim).
    pub(super) fn watches(
        &self,
        m: &Model,
        (p, class): (usize, i64),
        types: &[usize],
        b: &Blocked,
        mut watch: impl FnMut(On),
    ) {
        for (k, &t) in types.iter().enumerate() {
            let (pt, lack) = (m.pt(p, t), b.lack[k]);
            // (a searched verdict's `Lack::any` ends only with a give-back on `t` in the tree,
            // which stamps `cap_back[t][0]` too: watched below)
            if !b.searched && lack.tree != u64::MAX {
                watch(On::Tree(pt, lack.tree));
            }
            if lack.own != u64::MAX {
                watch(On::Own(pt, lack.own));
            }
            watch(On::Pool(pt, class));
            if b.searched {
                watch(On::Cap(self.cap(t, 0)));
                watch(On::Lent(pt));
            } else if b.refused >> k & 1 == 0 {
                watch(On::Cap(self.cap(t, b.need as usize)));
                watch(On::Lent(pt));
            }
        }
    }

    /// Whether nothing a verdict of a run of project `p` on `types` read has moved since.
    pub(super) fn unchanged(&self, m: &Model, p: usize, types: &[usize], b: &Blocked) -> bool {
        types.iter().enumerate().all(|(k, &t)| {
            let pt = m.pt(p, t);
            let quota = b.lack[k].holds(self, pt);
            if b.searched {
                // (any give-back on `t`: with a candidate's GPUs, a node may reach its need)
                let any = self.cap_back[self.cap(t, 0)] <= b.at;
                let pools = self.pool_grew[pt] <= b.at && self.lent[pt] <= b.at;
                return any && pools && quota;
            }
            let cap = self.cap_back[self.cap(t, b.need as usize)] <= b.at;
            let held = b.refused >> k & 1 == 1 || (cap && self.lent[pt] <= b.at);
            held && quota && self.pool_grew[pt] <= b.at
        })
    }
}
