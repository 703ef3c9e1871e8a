//! Round-trip times of `pingpong=`: a fixed-size log-linear histogram, so that percentiles
//! over any number of samples fit a fixed memory budget (≈ 30 KiB, allocated once).
//!
//! Values (TSC cycles) below 128 have a bucket each. Above, every power of two
//! `[2^e, 2^(e+1))` is cut into 128 equal buckets of width `2^(e-7)`: a bucket is at most
//! 1/128 of its lower bound wide. A percentile is reported as the middle of the bucket that
//! holds it (clamped to the exact minimum and maximum), so it is within half a bucket, at most
//! 1/256 (0.4 %) of the true sample's value, of the exact percentile; values below 128 are
//! exact. The minimum and the maximum are kept exactly.
//!
//! A percentile is the nearest-rank one: the `q`-quantile of `n` samples is the smallest
//! sample with at least `ceil(q · n)` samples (and at least one) at or below it.

/// Bits of sub-bucket resolution per power of two.
const SUB_BITS: u32 = 7;
/// Buckets per power of two (and the values below it counted exactly).
const SUB: usize = 1 << SUB_BITS;
/// Buckets in all: the exact ones, then `SUB` for each exponent 7..=63.
pub const BUCKETS: usize = SUB + (64 - SUB_BITS as usize) * SUB;

/// The bucket of `v`.
fn bucket(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let e = 63 - v.leading_zeros();
    let shift = e - SUB_BITS;
    // The 7 bits after the leading one.
    let sub = (v >> shift) as usize - SUB;
    SUB + (shift as usize) * SUB + sub
}

/// The values bucket `i` holds: `[low, low + width)`.
fn bounds(i: usize) -> (u64, u64) {
    if i < SUB {
        return (i as u64, 1);
    }
    let shift = ((i - SUB) / SUB) as u32;
    let sub = ((i - SUB) % SUB) as u64;
    ((SUB as u64 + sub) << shift, 1u64 << shift)
}

/// The round-trip histogram.
pub struct Histogram {
    counts: alloc::vec::Vec<u32>,
    n: u64,
    min: u64,
    max: u64,
}

/// Percentiles of a [`Histogram`], in its unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Percentiles {
    /// Samples.
    pub samples: u64,
    /// The smallest sample (exact).
    pub min: u64,
    /// The median.
    pub p50: u64,
    /// The 99th percentile.
    pub p99: u64,
    /// The 99.9th percentile.
    pub p999: u64,
    /// The largest sample (exact).
    pub max: u64,
}

impl Percentiles {
    /// Every value through `f` (a monotonic conversion, such as TSC cycles to nanoseconds,
    /// keeps the percentiles the percentiles).
    pub fn map(self, f: impl Fn(u64) -> u64) -> Percentiles {
        Percentiles {
            samples: self.samples,
            min: f(self.min),
            p50: f(self.p50),
            p99: f(self.p99),
            p999: f(self.p999),
            max: f(self.max),
        }
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Histogram {
        Histogram {
            counts: alloc::vec![0; BUCKETS],
            n: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    /// Counts one sample.
    pub fn record(&mut self, v: u64) {
        let c = &mut self.counts[bucket(v)];
        *c = c.saturating_add(1);
        self.n += 1;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    /// Samples counted.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// No sample yet.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The nearest-rank quantile `num / den` (`num ≤ den`), `None` without samples.
    pub fn quantile(&self, num: u64, den: u64) -> Option<u64> {
        if self.n == 0 || den == 0 {
            return None;
        }
        let rank = (u128::from(self.n) * u128::from(num.min(den))).div_ceil(u128::from(den));
        let rank = rank.max(1) as u64;
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                let (low, width) = bounds(i);
                return Some((low + width / 2).clamp(self.min, self.max));
            }
        }
        Some(self.max)
    }

    /// Min, p50, p99, p99.9 and max; `None` without samples.
    pub fn percentiles(&self) -> Option<Percentiles> {
        Some(Percentiles {
            samples: self.n,
            min: self.min.min(self.max),
            p50: self.quantile(500, 1000)?,
            p99: self.quantile(990, 1000)?,
            p999: self.quantile(999, 1000)?,
            max: self.max,
        })
    }
}

/// What `pingpong=` found, for the result line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundTrips {
    /// Frames that came back damaged (length field, pattern) or with a sequence number not
    /// in flight.
    pub bad: u64,
    /// Frames sent that had not come back when the run ended.
    pub lost: u64,
    /// The round trips' percentiles in TSC cycles (`None`: no round trip completed).
    pub cycles: Option<Percentiles>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    /// The exact nearest-rank quantile of sorted `v`.
    fn exact(v: &[u64], num: u64, den: u64) -> u64 {
        let rank = (v.len() as u64 * num).div_ceil(den).max(1);
        v[rank as usize - 1]
    }

    #[test]
    fn buckets_tile_the_range() {
        for i in 0..BUCKETS {
            let (low, width) = bounds(i);
            assert_eq!(bucket(low), i, "{i}");
            assert_eq!(bucket(low + (width - 1)), i, "{i}");
            if i + 1 < BUCKETS {
                assert_eq!(bounds(i + 1).0, low + width, "{i}: no gap");
            }
            // At most 1/128 of the lower bound wide.
            assert!(width == 1 || width * 128 <= low, "{i}: {low} {width}");
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn small_values_are_exact() {
        let mut h = Histogram::new();
        assert_eq!(h.percentiles(), None);
        // 1..=100: p50 is 50, p99 is 99, p99.9 is 100 (nearest rank).
        for v in (1..=100).rev() {
            h.record(v);
        }
        assert_eq!(
            h.percentiles(),
            Some(Percentiles {
                samples: 100,
                min: 1,
                p50: 50,
                p99: 99,
                p999: 100,
                max: 100
            })
        );
        let mut one = Histogram::new();
        one.record(7);
        let p = one.percentiles().unwrap();
        assert_eq!((p.min, p.p50, p.p99, p.p999, p.max), (7, 7, 7, 7, 7));
    }

    #[test]
    fn a_tail_moves_only_the_high_percentiles() {
        // 998 fast round trips of 10 000 cycles and 2 slow ones of 1 000 000: p50 and p99 are
        // the fast ones (the middle of their bucket, within 1/256), p99.9 (rank 999) and max
        // the slow ones (clamped to the exact maximum).
        let mut h = Histogram::new();
        for _ in 0..998 {
            h.record(10_000);
        }
        h.record(1_000_000);
        h.record(1_000_000);
        let p = h.percentiles().unwrap();
        assert_eq!(p.min, 10_000, "{p:?}");
        for q in [p.p50, p.p99] {
            assert!(q.abs_diff(10_000) * 256 <= 10_000, "{p:?}");
        }
        assert_eq!((p.p999, p.max), (1_000_000, 1_000_000), "{p:?}");
    }

    #[test]
    fn percentiles_are_within_the_error_bound() {
        // A spread of values over six decades (a deterministic LCG), against the exact
        // nearest-rank percentiles of the sorted samples.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut v = Vec::new();
        let mut h = Histogram::new();
        for _ in 0..20_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let s = 100 + (x >> 33) % (1 << ((x >> 8) % 28));
            v.push(s);
            h.record(s);
        }
        v.sort_unstable();
        let p = h.percentiles().unwrap();
        assert_eq!((p.samples, p.min, p.max), (20_000, v[0], v[v.len() - 1]));
        for (got, num) in [(p.p50, 500), (p.p99, 990), (p.p999, 999)] {
            let want = exact(&v, num, 1000);
            let err = got.abs_diff(want) as f64 / want as f64;
            assert!(err <= 1.0 / 256.0, "q{num}: {got} against {want} ({err})");
        }
        assert!(p.min <= p.p50 && p.p50 <= p.p99 && p.p99 <= p.p999 && p.p999 <= p.max);
        // Each percentile's error bound holds for every quantile, not only those three.
        for num in (1..=1000).step_by(37) {
            let want = exact(&v, num, 1000);
            let got = h.quantile(num, 1000).unwrap();
            assert!(
                got.abs_diff(want) * 256 <= want,
                "q{num}: {got} against {want}"
            );
        }
    }

    #[test]
    fn conversion_keeps_the_order() {
        let mut h = Histogram::new();
        for v in [2_600, 5_200, 26_000] {
            h.record(v);
        }
        let ns = h.percentiles().unwrap().map(|c| c * 1000 / 2600);
        assert_eq!((ns.min, ns.max, ns.samples), (1000, 10_000, 3));
        assert!(ns.p50 >= ns.min && ns.p999 <= ns.max);
    }
}
