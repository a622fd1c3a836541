//! A run's GPU types (`Run::types`): up to `INLINE` held in the run itself, more on the heap.
//! A cycle reads the types of every queue head (`must_borrow`, `surely_blocked`); held
//! inline they sit in the cache lines of the run already read for its order key, where a
//! `Vec` cost one more cache miss per head at 50,000 runs.
//!
//! Invariant: it reads as the slice it was made from (`Deref`), in the same order.

use std::ops::Deref;

const INLINE: usize = 3;

#[derive(Clone, Debug, PartialEq)]
pub enum TypeList {
    Inline { len: u8, ids: [usize; INLINE] },
    Heap(Vec<usize>),
}

impl From<Vec<usize>> for TypeList {
    fn from(v: Vec<usize>) -> Self {
        if v.len() <= INLINE {
            let mut ids = [0; INLINE];
            ids[..v.len()].copy_from_slice(&v);
            TypeList::Inline {
                len: v.len() as u8,
                ids,
            }
        } else {
            TypeList::Heap(v)
        }
    }
}

impl Deref for TypeList {
    type Target = [usize];

    fn deref(&self) -> &[usize] {
        match self {
            TypeList::Inline { len, ids } => &ids[..*len as usize],
            TypeList::Heap(v) => v,
        }
    }
}

impl<'a> IntoIterator for &'a TypeList {
    type Item = &'a usize;
    type IntoIter = std::slice::Iter<'a, usize>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::TypeList;

    #[test]
    fn it_reads_as_the_list_it_was_made_from() {
        for v in [vec![], vec![2], vec![0, 1, 2], vec![3, 1, 2, 0, 5]] {
            let t = TypeList::from(v.clone());
            assert_eq!(&*t, &v[..]);
            assert_eq!(matches!(t, TypeList::Heap(_)), v.len() > 3);
        }
    }
}
