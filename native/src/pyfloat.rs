//! Python's float arithmetic where the core's decisions depend on it to the last bit:
//! `round(x)` (ties to even), `round(x, ndigits)` (correctly rounded in decimal, ties to even
//! on the exact binary value, as CPython's `double_round` through `dtoa` does) and `sum()` of
//! floats (left to right up to CPython 3.11; Neumaier-compensated from 3.12 on).
//!
//! Invariant: each function returns exactly the double CPython returns for the same inputs,
//! so that the fragmentation scoring (`fragmentation`) ranks nodes as `mlops_gpu.core`
//! does, ties included.

/// `round(x)`: the nearest integer, ties to even (as a float).
#[inline]
pub fn round0(x: f64) -> f64 {
    x.round_ties_even()
}

/// `round(x, ndigits)` for `0 <= ndigits <= 15`: `x` to the nearest multiple of
/// `10**-ndigits`, ties (exact ones only: on the binary value) to even, then the nearest double.
pub fn round_to(x: f64, ndigits: u32) -> f64 {
    assert!(ndigits <= 15, "round_to: ndigits {ndigits} out of range");
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    let bits = x.to_bits();
    let negative = bits >> 63 == 1;
    let exp = ((bits >> 52) & 0x7ff) as i64;
    let frac = bits & ((1u64 << 52) - 1);
    // |x| = mant * 2^e exactly
    let (mant, e) = if exp == 0 {
        (frac, -1074)
    } else {
        (frac | (1u64 << 52), exp - 1075)
    };
    if e >= 0 {
        return x; // an integer: rounding keeps it
    }
    let scale = 10i128.pow(ndigits);
    let scaled = mant as i128 * scale; // |x| * 10^ndigits * 2^-e, below 2^103
    let shift = -e;
    let n: i128 = if shift > 110 {
        0 // |x| * 10^ndigits < 2^-7: rounds to 0
    } else {
        let q = scaled >> shift;
        let rem = scaled - (q << shift);
        let half = 1i128 << (shift - 1);
        if rem > half || (rem == half && q & 1 == 1) {
            q + 1
        } else {
            q
        }
    };
    // n < 2^53 here for the magnitudes the core rounds; n / 10^ndigits is then the correctly
    // rounded quotient of two exact doubles, as strtod of the decimal string gives.
    let out = n as f64 / scale as f64;
    if negative {
        -out
    } else {
        out
    }
}

/// `sum(xs)` of floats, as the running interpreter computes it: `compensated` (CPython 3.12
/// and later) adds with Neumaier's compensation and the compensation once at the end; else
/// plainly left to right. An empty sum is 0.
pub fn sum<I: IntoIterator<Item = f64>>(xs: I, compensated: bool) -> f64 {
    let mut it = xs.into_iter();
    let Some(first) = it.next() else {
        return 0.0;
    };
    let mut total = 0.0 + first;
    if !compensated {
        for x in it {
            total += x;
        }
        return total;
    }
    let mut c = 0.0;
    for x in it {
        let t = total + x;
        if total.abs() >= x.abs() {
            c += (total - t) + x;
        } else {
            c += (x - t) + total;
        }
        total = t;
    }
    if c != 0.0 && c.is_finite() {
        total += c;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round0_is_half_even() {
        assert_eq!(round0(0.5), 0.0);
        assert_eq!(round0(1.5), 2.0);
        assert_eq!(round0(2.5), 2.0);
        assert_eq!(round0(-2.5), -2.0);
        assert_eq!(round0(2.5000000000000004), 3.0);
    }

    #[test]
    fn round_to_matches_python() {
        // values printed by CPython 3.11: round(x, n)
        assert_eq!(round_to(2.675, 2), 2.67); // 2.67499999... in binary
        assert_eq!(round_to(0.125, 2), 0.12); // an exact tie: to even
        assert_eq!(round_to(0.375, 2), 0.38);
        assert_eq!(round_to(1.0 / 1024.0, 9), 0.000976562); // exact tie at 9 digits
        assert_eq!(round_to(3.0 / 1024.0, 9), 0.002929688);
        assert_eq!(round_to(0.1 + 0.2, 9), 0.3);
        assert_eq!(round_to(-0.1 - 0.2, 9), -0.3);
        assert_eq!(round_to(1e-12, 9), 0.0);
        assert_eq!(round_to(0.8999999999999999, 6), 0.9);
        assert_eq!(round_to(1.0 - 0.7, 6), 0.3);
        assert_eq!(round_to(0.3330000000000001, 9), 0.333);
        assert_eq!(round_to(12345.678901234567, 6), 12345.678901);
        assert_eq!(round_to(5e-324, 9), 0.0);
    }

    #[test]
    fn sum_as_cpython() {
        let tenth = [0.1; 10];
        assert_eq!(sum(tenth, false), 0.9999999999999999); // CPython 3.11
        assert_eq!(sum(tenth, true), 1.0); // CPython 3.12
        assert_eq!(sum([1e100, 1.0, -1e100], false), 0.0);
        assert_eq!(sum([1e100, 1.0, -1e100], true), 1.0);
        assert_eq!(sum(std::iter::empty(), true), 0.0);
        assert_eq!(sum([2.5], true), 2.5);
    }
}
