//! Which queues sleep: those known blocked (`verdict`), each watching the stamps its verdict
//! read, so that a cycle visits only the queues awake instead of asking every queue's verdict
//! as it begins (the rich set-up has about 4,500 queues, of which about 250 are awake in a
//! cycle).
//!
//! A queue is put to sleep (`sleep`) with the stamps that would end its verdict (`On`): a
//! capacity stamp (a give-back on a node of its type left with enough free GPUs, or on a
//! node with MIG slices or shared devices), its pool growing, a member of its tree starting
//! to borrow, or the quota given back in its tree or by its project reaching what it lacked.
//! `verdict::Stamps` logs each stamp it moves (`Moved`); `wake` reads the log and wakes every
//! queue watching a stamp that moved.
//!
//! Invariants:
//! - a queue asleep admits nothing: it was known blocked (`Cycle::known_blocked`) when it
//!   fell asleep, and every stamp its verdict reads is watched, so none moves without waking
//!   it once the log is read, but its pool's: that one wakes it only for a run that could be
//!   its victim (`victims_possible`: of a lower class, or of its class with a checkpoint, or
//!   any of its class where the policy preempts runs without one), as no other changes what
//!   its verdict found (it may then be asleep and no more known blocked, as a cycle would
//!   find it, passing it over or trying it in vain). A wake may be needless: a watch left
//!   from an earlier sleep of the same queue, or a stamp restored by `verdict::cycle`'s undo;
//!   it only costs a visit;
//! - a queue's verdict reset (a new head, `State`) or its queue removed wakes it (`stir`,
//!   `close`): a watch is live only while its slot sleeps with the generation it was made in;
//! - each slot names its queue's current place, (project, index in the project's queues):
//!   `State` moves it when an earlier queue of the project is removed;
//! - bit j of a project's awake bits is set exactly when its queue j is not asleep;
//! - watches left dead are dropped as their stamp moves, or all at once when all the watches
//!   held pass twice the live ones and 4,096 more (`compact`), so the lists stay within a few
//!   times the live watches however long the engine runs.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::capacity::ones;
use crate::model::Model;

/// A stamp moved (`verdict::Stamps` logs each).
#[derive(Clone, Copy, Debug)]
pub enum Moved {
    /// Capacity stamps of a type: `from..=to` of its stamps (`verdict::Stamps::cap_back`
    /// layout), and the MIG or shared one past them if `extra` names it.
    Cap {
        from: u32,
        to: u32,
        extra: [Option<u32>; 2],
    },
    /// Quota given back by `project` on type `t`: its tree's `tree_back` and its `own_back`.
    Quota { project: u32, t: u32 },
    /// Pool (project, type) grew by a run of `class`, or one of its runs of `class` reported
    /// its first checkpoint (`checkpointed`: whether the run has one).
    Pool {
        pt: u32,
        class: i64,
        checkpointed: bool,
    },
    /// A member of the tree of (project, type) borrows.
    Lent(u32),
}

/// A stamp a sleeping queue watches: a capacity stamp (its index in `cap_back`), a pool or
/// a lent stamp (per (project, type)), or quota back in the tree or by the project reaching
/// a count (per (project, type)).
#[derive(Clone, Copy, Debug)]
pub enum On {
    Cap(usize),
    /// Its project's pool on a type (per (project, type)), by its class: only a run that
    /// could be its victim wakes it (a lower class, or its own with a checkpoint).
    Pool(usize, i64),
    Lent(usize),
    Tree(usize, u64),
    Own(usize, u64),
}

/// A watch: (slot, generation).
type Watch = (u32, u32);

#[derive(Clone, Copy)]
struct Slot {
    project: u32,
    queue: u32,
    /// Bumped as it falls asleep and as it wakes: a watch of another generation is dead.
    gen: u32,
    asleep: bool,
    /// When it fell asleep (`tag`), and how many watches it made then.
    slept: u64,
    watches: u32,
}

pub struct Dormancy {
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Per project: bit j set where its queue j is awake.
    awake: Vec<Vec<u64>>,
    cap: Vec<Vec<Watch>>,
    pool: Vec<Vec<(Watch, i64)>>,
    lent: Vec<Vec<Watch>>,
    tree: Vec<BinaryHeap<Reverse<(u64, Watch)>>>,
    own: Vec<BinaryHeap<Reverse<(u64, Watch)>>>,
    /// Watches held in all lists, and those of the slots asleep.
    held: usize,
    live: usize,
    /// Scratch: the watches a `sleep` is given (`watch`).
    pending: Vec<On>,
    /// The number of the last cycle begun (`begin`).
    epoch: u64,
}

impl Dormancy {
    /// `caps`: how many capacity stamps (`verdict::Stamps::cap_back`'s length).
    pub fn new(m: &Model, caps: usize) -> Dormancy {
        let pts = m.projects.len() * m.n_types;
        Dormancy {
            slots: Vec::new(),
            free: Vec::new(),
            awake: vec![Vec::new(); m.projects.len()],
            cap: vec![Vec::new(); caps],
            pool: vec![Vec::new(); pts],
            lent: vec![Vec::new(); pts],
            tree: (0..pts).map(|_| BinaryHeap::new()).collect(),
            own: (0..pts).map(|_| BinaryHeap::new()).collect(),
            held: 0,
            live: 0,
            pending: Vec::new(),
            epoch: 0,
        }
    }

    /// A cycle begins: its number.
    pub fn begin(&mut self) -> u64 {
        self.epoch += 1;
        self.epoch
    }

    /// A new queue at (project, index): its slot, awake.
    pub fn open(&mut self, project: usize, queue: usize) -> u32 {
        let slot = Slot {
            project: project as u32,
            queue: queue as u32,
            gen: 0,
            asleep: false,
            slept: 0,
            watches: 0,
        };
        let s = match self.free.pop() {
            Some(s) => {
                let gen = self.slots[s as usize].gen.wrapping_add(1);
                self.slots[s as usize] = Slot { gen, ..slot };
                s
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        set(&mut self.awake[project], queue, true);
        s
    }

    /// Its queue was removed: the project's later queues move up one (`moved_to`).
    pub fn close(&mut self, s: u32) {
        self.stir(s);
        let slot = &mut self.slots[s as usize];
        remove_at(&mut self.awake[slot.project as usize], slot.queue as usize);
        slot.gen = slot.gen.wrapping_add(1);
        self.free.push(s);
    }

    /// Its queue is now at `queue` in its project's queues.
    pub fn moved_to(&mut self, s: u32, queue: usize) {
        self.slots[s as usize].queue = queue as u32;
    }

    /// Its queue's verdict was reset (or may hold no more): awake.
    pub fn stir(&mut self, s: u32) {
        let slot = &mut self.slots[s as usize];
        if !slot.asleep {
            return;
        }
        slot.asleep = false;
        slot.gen = slot.gen.wrapping_add(1);
        self.live -= slot.watches as usize;
        set(
            &mut self.awake[slot.project as usize],
            slot.queue as usize,
            true,
        );
    }

    /// The watches held, dead or live.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.held
    }

    pub fn asleep(&self, s: u32) -> bool {
        self.slots[s as usize].asleep
    }

    /// (project, index in its queues) of slot `s`.
    pub fn place(&self, s: u32) -> (usize, usize) {
        let slot = &self.slots[s as usize];
        (slot.project as usize, slot.queue as usize)
    }

    /// The indexes of project `p`'s queues awake, ascending.
    pub fn awake(&self, p: usize) -> impl Iterator<Item = usize> + '_ {
        ones(&self.awake[p], 0)
    }

    /// A stamp the next `sleep` watches.
    pub fn watch(&mut self, on: On) {
        self.pending.push(on);
    }

    /// Slot `s` falls asleep at `tag` (see `wake`), watching what `watch` was given since the
    /// last `sleep`.
    pub fn sleep(&mut self, s: u32, tag: u64) {
        self.stir(s); // (an earlier sleep's watches die)
        let slot = &mut self.slots[s as usize];
        set(
            &mut self.awake[slot.project as usize],
            slot.queue as usize,
            false,
        );
        slot.asleep = true;
        slot.gen = slot.gen.wrapping_add(1);
        slot.slept = tag;
        slot.watches = self.pending.len() as u32;
        let w = (s, slot.gen);
        for on in self.pending.drain(..) {
            match on {
                On::Cap(k) => self.cap[k].push(w),
                On::Pool(pt, class) => self.pool[pt].push((w, class)),
                On::Lent(pt) => self.lent[pt].push(w),
                On::Tree(pt, at) => self.tree[pt].push(Reverse((at, w))),
                On::Own(pt, at) => self.own[pt].push(Reverse((at, w))),
            }
        }
        self.held += slot.watches as usize;
        self.live += slot.watches as usize;
        if self.held > 2 * self.live + 4096 {
            self.compact();
        }
    }

    /// Wake every slot watching a stamp in `moved` (taken from the log: it is left empty);
    /// `back(pt)`: the quota given back (in the tree, by the project) per (project, type) as
    /// the stamps are now. Returns the slots woken, each with its `sleep` tag.
    pub fn wake(
        &mut self,
        m: &Model,
        moved: &mut Vec<Moved>,
        back: impl Fn(usize) -> (u64, u64),
    ) -> Vec<(u32, u64)> {
        let mut woken = Vec::new();
        for mv in moved.drain(..) {
            match mv {
                Moved::Cap { from, to, extra } => {
                    let more = extra.into_iter().flatten();
                    for k in (from..=to).chain(more) {
                        self.wake_all(|d| &mut d.cap[k as usize], &mut woken);
                    }
                }
                Moved::Pool {
                    pt,
                    class,
                    checkpointed,
                } => {
                    // (`victims_possible`: a lower class, or its own class with a checkpoint)
                    let own = checkpointed || m.policy.preempt_uncheckpointed;
                    let mut list = std::mem::take(&mut self.pool[pt as usize]);
                    let before = list.len();
                    list.retain(|&(w, c)| {
                        let victim = class < c || (class == c && own);
                        if victim {
                            self.wake_one(w, &mut woken);
                        }
                        !victim
                    });
                    self.held -= before - list.len();
                    self.pool[pt as usize] = list;
                }
                Moved::Lent(pt) => self.wake_all(|d| &mut d.lent[pt as usize], &mut woken),
                Moved::Quota { project, t } => {
                    let (p, t) = (project as usize, t as usize);
                    let pt = m.pt(p, t);
                    self.wake_from(pt, false, back(pt).1, &mut woken);
                    let members = match m.projects[p].root {
                        Some(root) => &m.members[root][..],
                        None => std::slice::from_ref(&p),
                    };
                    for &o in members {
                        let ot = m.pt(o, t);
                        self.wake_from(ot, true, back(ot).0, &mut woken);
                    }
                }
            }
        }
        woken
    }

    /// Wake every watch of the list `of` names, leaving it empty (its allocation kept).
    fn wake_all(&mut self, of: impl Fn(&mut Self) -> &mut Vec<Watch>, woken: &mut Vec<(u32, u64)>) {
        let mut list = std::mem::take(of(self));
        if list.is_empty() {
            return;
        }
        self.held -= list.len();
        for &w in &list {
            self.wake_one(w, woken);
        }
        list.clear();
        *of(self) = list;
    }

    /// Wake the watches of `pt`'s tree (else own) counts reached by `now`.
    fn wake_from(&mut self, pt: usize, tree: bool, now: u64, woken: &mut Vec<(u32, u64)>) {
        loop {
            let heap = if tree {
                &mut self.tree[pt]
            } else {
                &mut self.own[pt]
            };
            match heap.peek() {
                Some(&Reverse((at, w))) if at <= now => {
                    heap.pop();
                    self.held -= 1;
                    self.wake_one(w, woken);
                }
                _ => return,
            }
        }
    }

    fn wake_one(&mut self, (s, gen): Watch, woken: &mut Vec<(u32, u64)>) {
        let slot = &self.slots[s as usize];
        if slot.asleep && slot.gen == gen {
            woken.push((s, slot.slept));
            self.stir(s);
        }
    }

    /// Drop every dead watch.
    fn compact(&mut self) {
        let slots = &self.slots;
        let live = |&(s, gen): &Watch| {
            let slot = &slots[s as usize];
            slot.asleep && slot.gen == gen
        };
        let mut held = 0;
        for list in self.cap.iter_mut().chain(&mut self.lent) {
            list.retain(live);
            held += list.len();
        }
        for list in &mut self.pool {
            list.retain(|(w, _)| live(w));
            held += list.len();
        }
        for heap in self.tree.iter_mut().chain(&mut self.own) {
            heap.retain(|Reverse((_, w))| live(w));
            held += heap.len();
        }
        self.held = held;
    }
}

/// Set bit `j` of `bits` to `on`.
fn set(bits: &mut Vec<u64>, j: usize, on: bool) {
    let (w, bit) = (j / 64, 1u64 << (j % 64));
    if bits.len() <= w {
        bits.resize(w + 1, 0);
    }
    if on {
        bits[w] |= bit;
    } else {
        bits[w] &= !bit;
    }
}

/// Drop bit `j` of `bits`: each higher bit moves down one.
fn remove_at(bits: &mut [u64], j: usize) {
    let (w, b) = (j / 64, j % 64);
    if w >= bits.len() {
        return;
    }
    let low = bits[w] & ((1u64 << b) - 1);
    let high = bits[w].checked_shr(b as u32 + 1).unwrap_or(0) << b;
    bits[w] = low | high;
    for k in w + 1..bits.len() {
        bits[k - 1] |= (bits[k] & 1) << 63;
        bits[k] >>= 1;
    }
}
