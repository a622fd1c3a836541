//! A node's fragmentation signature (`fragmentation.Sig`) and how a placement changes it
//! (`fragmentation.after_whole`/`after_share`/`after_host`), to the last bit as Python.
//!
//! Invariants: `free` holds the free share of each device that still has some, largest
//! first, whole free devices as 1.0 (equal shares are equal bits, so Python's stable sort and
//! this one agree); host CPU and memory are None when not tracked and are never tracked by a
//! transition that was not; a transition never changes the GPU type.

use super::EPS;
use crate::pyfloat;

/// (free share per device, largest first; free host CPU; free host memory; GPU type):
/// `fragmentation.Sig`. Shares are kept as bits (for hashing).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Sig {
    pub free: Vec<u64>,
    pub cpu: Option<i64>,
    pub mem: Option<i64>,
    pub ty: usize,
}

impl Sig {
    pub fn shares(&self) -> impl Iterator<Item = f64> + '_ {
        self.free.iter().map(|&b| f64::from_bits(b))
    }
}

/// `sig` once a run takes `gpus` whole devices and the host resources
/// (`fragmentation.after_whole`).
pub fn after_whole(sig: &Sig, gpus: usize, cpu: i64, mem: i64) -> Sig {
    let mut free = sig.free.clone();
    let one = 1.0f64.to_bits();
    for _ in 0..gpus {
        let i = free
            .iter()
            .position(|&x| x == one)
            .expect("a whole free device");
        free.remove(i);
    }
    Sig {
        free,
        cpu: sig.cpu.map(|c| c - cpu),
        mem: sig.mem.map(|m| m - mem),
        ty: sig.ty,
    }
}

/// `sig` once a run takes `share` of a device that had `left_before` free
/// (`fragmentation.after_share`).
pub fn after_share(sig: &Sig, left_before: f64, share: f64, cpu: i64, mem: i64) -> Sig {
    let mut free: Vec<f64> = sig.shares().collect();
    let i = free
        .iter()
        .position(|&x| x == left_before)
        .expect("the device's free share");
    free.remove(i);
    let left = pyfloat::round_to(left_before - share, 6);
    if left > EPS {
        free.push(left);
    }
    // Python's sorted(..., reverse=True) is stable; equal shares are equal bits here
    free.sort_by(|a, b| b.total_cmp(a));
    Sig {
        free: free.into_iter().map(f64::to_bits).collect(),
        cpu: sig.cpu.map(|c| c - cpu),
        mem: sig.mem.map(|m| m - mem),
        ty: sig.ty,
    }
}

/// `sig` once a run takes host resources only (a CPU-only run: `fragmentation.after_host`).
pub fn after_host(sig: &Sig, cpu: i64, mem: i64) -> Sig {
    Sig {
        free: sig.free.clone(),
        cpu: sig.cpu.map(|c| c - cpu),
        mem: sig.mem.map(|m| m - mem),
        ty: sig.ty,
    }
}
