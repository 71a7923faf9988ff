//! Where a latency falls in a log-scale histogram, and what a histogram says a quantile is.
//! Pure and integer-only (microseconds), like the kernel beside it.
//!
//! A latency of `us` microseconds falls in its own bucket below 16 µs; above, each octave
//! `[2^e, 2^(e+1))` is cut in 8 buckets of equal width, so a bucket is 6.7 %–12.5 % of its
//! lower bound wide. The last of the [`BUCKETS`] buckets starts at 15.7 s and holds every
//! longer latency too.

/// How many buckets a histogram has.
pub(crate) const BUCKETS: usize = 176;

/// Sub-buckets per octave, as a power of two.
const SUB_BITS: u32 = 3;
/// Below this, a microsecond is its own bucket.
const LINEAR: u64 = 1 << (SUB_BITS + 1);

/// The bucket a latency of `us` microseconds falls in.
pub(crate) fn bucket(us: u64) -> usize {
    if us < LINEAR {
        return us as usize;
    }
    let octave = 63 - us.leading_zeros();
    let shift = octave - SUB_BITS;
    // `us >> shift` keeps the leading bit and the sub-bucket bits: 8..16.
    let index = u64::from(shift) * (1 << SUB_BITS) + (us >> shift);
    usize::try_from(index).map_or(BUCKETS - 1, |index| index.min(BUCKETS - 1))
}

/// The latencies bucket `index` holds: from the first, to the second excluded (the last
/// bucket holds everything longer too).
pub(crate) fn bounds(index: usize) -> (u64, u64) {
    let index = index as u64;
    if index < LINEAR {
        return (index, index + 1);
    }
    let shift = index / (1 << SUB_BITS) - 1;
    let lead = index % (1 << SUB_BITS) + (1 << SUB_BITS);
    (lead << shift, (lead + 1) << shift)
}

/// Fewer samples than this say nothing of a quantile.
pub(crate) const MIN_SAMPLES: u64 = 100;
/// Fewer samples than this above a quantile's rank say nothing of it (so p99 needs 500).
pub(crate) const MIN_TAIL: u64 = 5;

/// The `per_mille` quantile of the histogram whose bucket `index` holds `count(index)`
/// samples, in microseconds: the upper bound of the bucket holding the sample of rank
/// ⌈n × per_mille / 1000⌉, so never below the true quantile and at most 12.5 % above it.
/// `None` with fewer than [`MIN_SAMPLES`] samples, or fewer than [`MIN_TAIL`] ranked above
/// it (a `per_mille` of 1000 or more never has one), or when that sample is in the last
/// bucket: it has no upper bound, and any figure would read a longer tail too low.
pub(crate) fn quantile_us(count: impl Fn(usize) -> u64, per_mille: u16) -> Option<u64> {
    let total: u64 = (0..BUCKETS).map(&count).fold(0, u64::saturating_add);
    let rank = total
        .saturating_mul(u64::from(per_mille))
        .div_ceil(1000)
        .max(1);
    if total < MIN_SAMPLES || total.saturating_sub(rank) < MIN_TAIL {
        return None;
    }
    let mut below = 0u64;
    let index = (0..BUCKETS).find(|&index| {
        below = below.saturating_add(count(index));
        below >= rank
    })?;
    (index < BUCKETS - 1).then(|| bounds(index).1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_tile_the_latencies_in_order() {
        let mut next = 0;
        for index in 0..BUCKETS {
            let (low, high) = bounds(index);
            assert_eq!(low, next, "bucket {index} starts where the last ended");
            assert!(high > low);
            assert_eq!(bucket(low), index);
            assert_eq!(bucket(high - 1), index);
            if low >= LINEAR {
                // 6.7 %–12.5 % of its lower bound wide.
                assert!(
                    (high - low) * 8 <= low && (high - low) * 15 >= low,
                    "{index}"
                );
            }
            next = high;
        }
        assert_eq!(bounds(BUCKETS - 1).0, 15 << 20);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket(3_600_000_000), BUCKETS - 1);
    }

    #[test]
    fn a_quantile_is_the_upper_bound_of_its_ranks_bucket() {
        // 95 samples at 5 ms and 5 at 500 ms: p95 is 5 ms's bucket, p96 500 ms's.
        let fast = bucket(5_000);
        let slow = bucket(500_000);
        let count = |index: usize| match index {
            i if i == fast => 95,
            i if i == slow => 5,
            _ => 0,
        };
        assert_eq!(quantile_us(count, 950), Some(bounds(fast).1));
        assert!(bounds(fast).1 > 5_000 && bounds(fast).1 <= 5_000 * 9 / 8);
        assert_eq!(quantile_us(count, 951), None, "four samples above rank 96");
        assert_eq!(quantile_us(count, 500), Some(bounds(fast).1));
        assert_eq!(quantile_us(count, 0), Some(bounds(fast).1));
        assert_eq!(quantile_us(count, 1000), None);
    }

    #[test]
    fn too_few_samples_say_nothing() {
        let at = bucket(5_000);
        let of = |n: u64| move |index: usize| if index == at { n } else { 0 };
        assert_eq!(quantile_us(of(99), 500), None);
        assert_eq!(quantile_us(of(100), 500), Some(bounds(at).1));
        assert_eq!(quantile_us(of(499), 990), None, "p99 needs 500");
        assert_eq!(quantile_us(of(500), 990), Some(bounds(at).1));
        assert_eq!(quantile_us(of(0), 990), None);
    }

    #[test]
    fn a_rank_in_the_open_last_bucket_says_nothing() {
        // A true p95 of 60 s must not read as the last bucket's 16.8 s: nothing is known
        // above 15.7 s, so the caller falls back to its ceiling.
        let fast = bucket(5_000);
        let slow = bucket(60_000_000);
        assert_eq!(slow, BUCKETS - 1);
        let count = |fast_n: u64| {
            move |index: usize| match index {
                i if i == fast => fast_n,
                i if i == slow => 100 - fast_n,
                _ => 0,
            }
        };
        assert_eq!(quantile_us(count(90), 950), None);
        assert_eq!(quantile_us(count(95), 950), Some(bounds(fast).1));
        // The bucket just below the last still has a bound.
        let below_last = |index: usize| if index == BUCKETS - 2 { 100 } else { 0 };
        assert_eq!(quantile_us(below_last, 500), Some(bounds(BUCKETS - 2).1));
    }
}
