//! Rate limiting with Firecracker's semantics: per direction, an optional `bandwidth` bucket
//! (bytes) and an optional `ops` bucket (frames), each `{size, one_time_burst, refill_time}`.
//!
//! A bucket holds up to `size` tokens and refills completely in `refill_time` ms, continuously;
//! `one_time_burst` tokens are available once, on top, and never come back. A bucket of size 0
//! (or an absent one) does not limit.
//!
//! The datapath *pays after* each frame: before a frame it asks [`RateLimiter::blocked_for`]
//! (nothing is owed, go on; else how long until it is), after it [`RateLimiter::charge`]s what
//! the frame cost, which may put a bucket in debt (a 64 KiB frame through a 10 KiB bucket, or
//! the last frame of a burst). Over a run the rate is exact; at any instant it is over by at
//! most one frame. The arithmetic is integer and exact (tokens are kept scaled by the refill
//! time in ns), and time is a parameter of [`TokenBucket`] and [`RateLimiter`], so their tests
//! are exact and sleep-free; [`QueueLimiter`] adds the clock a queue reads once per call.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Longest refill time accepted (one day), in ms.
pub const MAX_REFILL_TIME_MS: u64 = 86_400_000;

/// One token bucket's configuration (Firecracker's `TokenBucket` object).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketConfig {
    /// Capacity in tokens (bytes or frames); 0 disables the bucket.
    pub size: u64,
    /// Tokens available once, on top of `size`, never refilled.
    #[serde(default)]
    pub one_time_burst: u64,
    /// Time to refill an empty bucket completely, in ms.
    pub refill_time: u64,
}

impl BucketConfig {
    /// True when the bucket limits anything.
    pub fn is_enabled(&self) -> bool {
        self.size > 0
    }

    /// Checks the values.
    pub fn validate(&self) -> Result<(), RateLimiterError> {
        if self.is_enabled() && !(1..=MAX_REFILL_TIME_MS).contains(&self.refill_time) {
            return Err(RateLimiterError::RefillTime(self.refill_time));
        }
        Ok(())
    }
}

/// One direction's limiter configuration (Firecracker's `RateLimiter` object).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimiterConfig {
    /// Bytes (Ethernet frames, without the virtio-net header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<BucketConfig>,
    /// Frames.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops: Option<BucketConfig>,
}

impl RateLimiterConfig {
    /// True when some bucket limits.
    pub fn is_enabled(&self) -> bool {
        self.bandwidth.is_some_and(|b| b.is_enabled()) || self.ops.is_some_and(|b| b.is_enabled())
    }

    /// Checks both buckets.
    pub fn validate(&self) -> Result<(), RateLimiterError> {
        for bucket in [self.bandwidth, self.ops].into_iter().flatten() {
            bucket.validate()?;
        }
        Ok(())
    }

    /// This configuration with the buckets `update` gives replaced (PATCH semantics).
    pub fn updated(&self, update: &RateLimiterConfig) -> RateLimiterConfig {
        RateLimiterConfig {
            bandwidth: update.bandwidth.or(self.bandwidth),
            ops: update.ops.or(self.ops),
        }
    }
}

/// A limiter value that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RateLimiterError {
    /// `refill_time` of an enabled bucket out of range.
    #[error(
        "refill_time must be 1..={MAX_REFILL_TIME_MS} ms for a bucket of non-zero size (got {0})"
    )]
    RefillTime(u64),
    /// A short form that does not parse.
    #[error("rate limiter {0:?}: expected SIZE/REFILL_MS[/ONE_TIME_BURST] (e.g. 50000/1000)")]
    Syntax(String),
}

/// Parses the `--net` short form `SIZE/REFILL_MS[/ONE_TIME_BURST]`.
pub fn parse_bucket(text: &str) -> Result<BucketConfig, RateLimiterError> {
    let bad = || RateLimiterError::Syntax(text.to_owned());
    let parts: Vec<&str> = text.split('/').collect();
    let number = |s: &str| -> Result<u64, RateLimiterError> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse().map_err(|_| bad())
    };
    let bucket = match parts.as_slice() {
        [size, refill] => BucketConfig {
            size: number(size)?,
            one_time_burst: 0,
            refill_time: number(refill)?,
        },
        [size, refill, burst] => BucketConfig {
            size: number(size)?,
            one_time_burst: number(burst)?,
            refill_time: number(refill)?,
        },
        _ => return Err(bad()),
    };
    bucket.validate()?;
    Ok(bucket)
}

/// A token bucket at run time. Time is a monotonic count of nanoseconds given by the caller.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    size: u128,
    refill_ns: u128,
    /// Tokens × `refill_ns` (exact refills), may be negative (debt).
    scaled: i128,
    /// One-time burst tokens left.
    burst: u64,
    last_ns: u64,
}

impl TokenBucket {
    /// A full bucket at time `now_ns`, or `None` for a disabled one.
    pub fn new(config: &BucketConfig, now_ns: u64) -> Option<TokenBucket> {
        if !config.is_enabled() || config.refill_time == 0 {
            return None;
        }
        let size = u128::from(config.size);
        let refill_ns = u128::from(config.refill_time) * 1_000_000;
        Some(TokenBucket {
            size,
            refill_ns,
            scaled: (size * refill_ns) as i128,
            burst: config.one_time_burst,
            last_ns: now_ns,
        })
    }

    #[inline]
    fn refill(&mut self, now_ns: u64) {
        // The datapath reads the clock once per call: most refills have nothing to add.
        if now_ns <= self.last_ns {
            return;
        }
        let elapsed = u128::from(now_ns.saturating_sub(self.last_ns));
        self.last_ns = self.last_ns.max(now_ns);
        let full = (self.size * self.refill_ns) as i128;
        let added = elapsed.saturating_mul(self.size).min(i128::MAX as u128) as i128;
        self.scaled = self.scaled.saturating_add(added).min(full);
    }

    /// Whole tokens available now (burst included; 0 in debt).
    pub fn available(&mut self, now_ns: u64) -> u64 {
        self.refill(now_ns);
        let tokens = (self.scaled.max(0) as u128 / self.refill_ns) as u64;
        tokens.saturating_add(self.burst)
    }

    /// Takes `tokens`, from the one-time burst first; the bucket may go into debt.
    pub fn charge(&mut self, tokens: u64, now_ns: u64) {
        self.refill(now_ns);
        let from_burst = tokens.min(self.burst);
        self.burst -= from_burst;
        let rest = u128::from(tokens - from_burst);
        self.scaled = self.scaled.saturating_sub((rest * self.refill_ns) as i128);
    }

    /// `None` when at least one token is available, else how long until one is.
    pub fn blocked_for(&mut self, now_ns: u64) -> Option<Duration> {
        self.refill(now_ns);
        let one = self.refill_ns as i128;
        if self.burst > 0 || self.scaled >= one {
            return None;
        }
        let missing = (one - self.scaled) as u128;
        let ns = missing.div_ceil(self.size);
        Some(Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX)))
    }
}

/// Why a frame may not go yet: the wait, and which buckets ran dry (one frame held back counts
/// against each, the `*_allowance_exceeded` device statistics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocked {
    /// Until both buckets can pay again.
    pub wait: Duration,
    /// The bandwidth (bytes) bucket is empty.
    pub bandwidth: bool,
    /// The ops (frames) bucket is empty.
    pub ops: bool,
}

/// One direction's limiter: its enabled buckets.
#[derive(Clone, Debug, Default)]
pub struct RateLimiter {
    bandwidth: Option<TokenBucket>,
    ops: Option<TokenBucket>,
}

impl RateLimiter {
    /// A limiter for `config` with full buckets at `now_ns`.
    pub fn new(config: &RateLimiterConfig, now_ns: u64) -> RateLimiter {
        RateLimiter {
            bandwidth: config.bandwidth.and_then(|b| TokenBucket::new(&b, now_ns)),
            ops: config.ops.and_then(|b| TokenBucket::new(&b, now_ns)),
        }
    }

    /// True when some bucket limits.
    #[inline]
    pub fn is_enabled(&self) -> bool {
        self.bandwidth.is_some() || self.ops.is_some()
    }

    /// `None` when a frame may go now, else how long until both buckets can pay again.
    pub fn blocked_for(&mut self, now_ns: u64) -> Option<Duration> {
        self.blocked(now_ns).map(|b| b.wait)
    }

    /// `None` when a frame may go now, else how long until both buckets can pay again and
    /// which of them ran dry.
    pub fn blocked(&mut self, now_ns: u64) -> Option<Blocked> {
        let bandwidth = self.bandwidth.as_mut().and_then(|b| b.blocked_for(now_ns));
        let ops = self.ops.as_mut().and_then(|b| b.blocked_for(now_ns));
        Some(Blocked {
            wait: bandwidth.max(ops)?,
            bandwidth: bandwidth.is_some(),
            ops: ops.is_some(),
        })
    }

    /// Pays for one frame of `bytes`.
    pub fn charge(&mut self, bytes: u64, now_ns: u64) {
        if let Some(b) = &mut self.bandwidth {
            b.charge(bytes, now_ns);
        }
        if let Some(b) = &mut self.ops {
            b.charge(1, now_ns);
        }
    }
}

/// A queue's rate limiter and the clock it is read against (a monotonic count of ns since the
/// queue was built).
#[derive(Clone, Debug)]
pub struct QueueLimiter {
    limiter: RateLimiter,
    epoch: Instant,
}

impl Default for QueueLimiter {
    fn default() -> QueueLimiter {
        QueueLimiter {
            limiter: RateLimiter::default(),
            epoch: Instant::now(),
        }
    }
}

impl QueueLimiter {
    /// Replaces the limiter (full buckets).
    pub fn set(&mut self, config: &RateLimiterConfig) {
        self.limiter = RateLimiter::new(config, self.now_ns());
    }

    #[inline(never)]
    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The limiter for one datapath call: the clock is read once, and only with a limiter.
    #[inline]
    pub(crate) fn for_call(&mut self) -> Limit<'_> {
        let now = if self.limiter.is_enabled() {
            self.now_ns()
        } else {
            0
        };
        Limit {
            limiter: &mut self.limiter,
            now,
        }
    }
}

/// A queue's limiter during one call, at the call's time.
#[derive(Debug)]
pub(crate) struct Limit<'a> {
    limiter: &'a mut RateLimiter,
    now: u64,
}

impl Limit<'_> {
    /// Whether a limiter is configured (frames must then be paid one by one).
    #[inline]
    pub(crate) fn is_active(&self) -> bool {
        self.limiter.is_enabled()
    }

    /// How long until the next frame may go and which buckets hold it, if it may not now.
    #[inline]
    pub(crate) fn blocked(&mut self) -> Option<Blocked> {
        if !self.limiter.is_enabled() {
            return None;
        }
        self.limiter.blocked(self.now)
    }

    /// Pays for a frame of `bytes`; returns whether a limiter was charged.
    #[inline]
    pub(crate) fn charge(&mut self, bytes: u64) -> bool {
        if !self.limiter.is_enabled() {
            return false;
        }
        self.limiter.charge(bytes, self.now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn bucket(size: u64, refill_ms: u64, burst: u64) -> BucketConfig {
        BucketConfig {
            size,
            one_time_burst: burst,
            refill_time: refill_ms,
        }
    }

    #[test]
    fn a_bucket_pays_its_size_then_refills_at_its_rate() {
        let mut b = TokenBucket::new(&bucket(100, 1000, 0), 0).expect("enabled");
        assert_eq!(b.available(0), 100);
        b.charge(100, 0);
        assert_eq!(
            b.blocked_for(0),
            Some(Duration::from_millis(10)),
            "1 token per 10 ms"
        );
        assert_eq!(b.available(500 * MS), 50);
        assert_eq!(b.available(5000 * MS), 100, "never above its size");
    }

    #[test]
    fn debt_is_repaid_before_the_next_token() {
        let mut b = TokenBucket::new(&bucket(10, 100, 0), 0).expect("enabled");
        b.charge(30, 0); // a big frame: 20 tokens of debt
                         // 21 tokens to wait for at 10 tokens per 100 ms: 210 ms.
        assert_eq!(b.blocked_for(0), Some(Duration::from_millis(210)));
        assert!(b.blocked_for(209 * MS).is_some());
        assert_eq!(b.blocked_for(210 * MS), None);
    }

    #[test]
    fn the_one_time_burst_goes_first_and_never_comes_back() {
        let mut b = TokenBucket::new(&bucket(10, 1000, 50), 0).expect("enabled");
        assert_eq!(b.available(0), 60);
        b.charge(55, 0);
        assert_eq!(b.available(0), 5);
        assert_eq!(b.available(10_000 * MS), 10);
    }

    #[test]
    fn a_disabled_bucket_does_not_exist() {
        assert!(TokenBucket::new(&bucket(0, 1000, 0), 0).is_none());
        let mut r = RateLimiter::new(&RateLimiterConfig::default(), 0);
        assert!(!r.is_enabled());
        r.charge(1 << 30, 0);
        assert_eq!(r.blocked_for(0), None);
    }

    #[test]
    fn both_buckets_must_pay() {
        let config = RateLimiterConfig {
            bandwidth: Some(bucket(1000, 1000, 0)),
            ops: Some(bucket(10, 1000, 0)),
        };
        let mut r = RateLimiter::new(&config, 0);
        for _ in 0..10 {
            assert_eq!(r.blocked_for(0), None);
            r.charge(50, 0);
        }
        // Ops empty (bytes not): wait 100 ms for the next frame.
        assert_eq!(r.blocked_for(0), Some(Duration::from_millis(100)));
        r.charge(2000, 100 * MS);
        // Bytes now owe 1500 - 100 + ... : the longer wait wins.
        let wait = r.blocked_for(100 * MS).expect("blocked");
        assert!(wait > Duration::from_millis(100), "{wait:?}");
    }

    #[test]
    fn the_rate_over_a_long_run_is_exact() {
        // 50 000 frames/s; a sender that asks every 5 µs for 2 s sends 100 000 (+ the bucket).
        let config = RateLimiterConfig {
            bandwidth: None,
            ops: Some(bucket(5000, 100, 0)),
        };
        let mut r = RateLimiter::new(&config, 0);
        let mut sent = 0u64;
        let mut now = 0u64;
        while now < 2_000 * MS {
            match r.blocked_for(now) {
                None => {
                    r.charge(64, now);
                    sent += 1;
                    now += 5_000;
                }
                Some(wait) => now += wait.as_nanos() as u64,
            }
        }
        assert!((104_999..=105_001).contains(&sent), "{sent}");
    }

    #[test]
    fn short_forms_and_validation() {
        assert_eq!(parse_bucket("50000/1000"), Ok(bucket(50000, 1000, 0)));
        assert_eq!(parse_bucket("100/10/500"), Ok(bucket(100, 10, 500)));
        assert_eq!(parse_bucket("0/0"), Ok(bucket(0, 0, 0)), "size 0: disabled");
        for bad in ["", "10", "10/", "/10", "+1/10", "1/2/3/4", "a/b", "10/0"] {
            assert!(parse_bucket(bad).is_err(), "{bad:?}");
        }
        let c: RateLimiterConfig =
            serde_json::from_str(r#"{"ops":{"size":10,"refill_time":100}}"#).expect("json");
        assert_eq!(c.ops, Some(bucket(10, 100, 0)));
        assert!(serde_json::from_str::<RateLimiterConfig>(r#"{"opps":{}}"#).is_err());
        let update = RateLimiterConfig {
            bandwidth: Some(bucket(1, 1, 0)),
            ops: None,
        };
        assert_eq!(
            c.updated(&update).ops,
            c.ops,
            "PATCH keeps what it does not name"
        );
    }
}
