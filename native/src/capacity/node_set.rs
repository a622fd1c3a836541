//! A set of nodes of one group, one bit per node over the span of node numbers the group's
//! nodes take: a free-count bucket (`Capacity::buckets`), which a node joins and leaves at
//! every take and give-back (a trial's too) in constant time, iterated in node order.
//!
//! Invariants: `len` is the number of bits set; only nodes within the span given to `new`
//! are ever inserted; iteration yields node numbers ascending (node order is name order).

#[derive(Clone, Debug, Default)]
pub struct NodeSet {
    /// The word of node number `64 * first`: bit `n % 64` of word `n / 64 - first`.
    first: usize,
    words: Vec<u64>,
    len: usize,
}

impl NodeSet {
    /// An empty set for nodes numbered `lo..=hi`.
    pub fn new(lo: usize, hi: usize) -> NodeSet {
        NodeSet {
            first: lo / 64,
            words: vec![0; hi / 64 - lo / 64 + 1],
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn at(&self, n: usize) -> (usize, u64) {
        (n / 64 - self.first, 1 << (n % 64))
    }

    pub fn insert(&mut self, n: usize) {
        let (w, bit) = self.at(n);
        debug_assert!(self.words[w] & bit == 0, "node {n} already in the set");
        self.words[w] |= bit;
        self.len += 1;
    }

    pub fn remove(&mut self, n: usize) {
        let (w, bit) = self.at(n);
        assert!(self.words[w] & bit != 0, "node {n} in its bucket");
        self.words[w] &= !bit;
        self.len -= 1;
    }

    /// The nodes, ascending.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        ones(&self.words, self.first)
    }
}

/// The numbers of the bits set in `words`, ascending, bit `b` of word `k` being
/// `64 * (first + k) + b`.
pub fn ones(words: &[u64], first: usize) -> impl Iterator<Item = usize> + '_ {
    words.iter().enumerate().flat_map(move |(k, &w)| {
        let base = (first + k) * 64;
        let mut rest = w;
        std::iter::from_fn(move || {
            (rest != 0).then(|| {
                let b = rest.trailing_zeros() as usize;
                rest &= rest - 1;
                base + b
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::NodeSet;

    #[test]
    fn iterates_what_it_holds_in_order() {
        let mut s = NodeSet::new(70, 300);
        for n in [299, 70, 128, 127, 200] {
            s.insert(n);
        }
        s.remove(128);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![70, 127, 200, 299]);
        assert_eq!(s.len(), 4);
    }
}
