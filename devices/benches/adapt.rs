//! What device-side adaptation (`adaptive=on`) costs the worker, per event it adds to:
//!
//! - `observe`: the adapter's decision, once per interval (1 ms by default);
//! - `idle gap`: what one sleep costs it (while adapting): a count, and for the sleeps
//!   `times_sleep` picks (an interval's first `GAP_SAMPLE`, then one in `GAP_SAMPLE_EVERY`; here
//!   1 000 sleeps an interval, a sleep per frame at 1 M frames/s) the two clock reads that
//!   time it;
//! - `round`: the counting a worker round does for it (frames and interrupts added up, the
//!   interval started if none runs, and in one round in 64 a clock read for its end),
//!   whatever the round's frames.
//!
//! Per frame that is `round / frames per round`, plus `idle gap / frames per wake-up` where
//! the worker sleeps, plus `observe / frames per interval`.
//!
//! Run: `cargo bench -p devices --bench adapt -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use devices::virtio::net::adapt::{times_sleep, Adapter, Observed};
use devices::virtio::net::Adaptive;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("adapt");
    let bounds = Adaptive {
        enabled: true,
        ..Adaptive::default()
    };
    let mut adapter = Adapter::new(bounds);
    let mut i = 0u64;
    group.bench_function("observe", |b| {
        b.iter(|| {
            // A workload that moves: a flood, then a ping-pong, in turns.
            i += 1;
            let flood = i % 64 < 32;
            black_box(adapter.observe(black_box(Observed {
                frames: if flood { 1_000 } else { 60 },
                interrupts: if flood { 250 } else { 30 },
                short_gaps: if flood { 0 } else { 30 },
                long_gaps: 0,
                longest_short_gap_us: if flood { 0 } else { 20 },
                windows: if flood { 0 } else { 30 },
                windows_found: if flood { 0 } else { 25 },
                elapsed_us: 1_000,
                guest_coalesces: false,
                kicks: if flood { 20 } else { 30 },
                kicks_fixed: false,
            })))
        })
    });
    group.bench_function("idle gap", |b| {
        let bound = Duration::from_micros(64);
        let mut seen = Observed::default();
        let mut sleeps = 0u32;
        b.iter(|| {
            // The worker counts from 1 in each interval (and starts over at its end).
            sleeps += 1;
            if sleeps > 1_000 {
                sleeps = 1;
            }
            if times_sleep(black_box(sleeps)) {
                let since = black_box(Instant::now());
                let gap = since.elapsed();
                if gap <= bound {
                    seen.short_gaps += 1;
                    let us = u32::try_from(gap.as_micros()).unwrap_or(u32::MAX);
                    seen.longest_short_gap_us = seen.longest_short_gap_us.max(us);
                } else {
                    seen.long_gaps += 1;
                }
            }
            black_box(&seen);
        })
    });
    group.bench_function("round", |b| {
        let mut seen = Observed::default();
        let mut start: Option<Instant> = None;
        let mut rounds = 0u32;
        let every = Duration::from_micros(1_000);
        b.iter(|| {
            seen.frames += black_box(32);
            seen.interrupts += black_box(1);
            // The worker's `ADAPT_CHECK_ROUNDS`: the clock is read for the interval's end
            // once in 64 rounds (there is no interval timer).
            rounds = rounds.wrapping_add(1);
            match start {
                None if seen.frames > 0 => start = Some(Instant::now()),
                Some(s) if rounds.is_multiple_of(64) => {
                    let now = Instant::now();
                    if now.saturating_duration_since(s) >= every {
                        start = Some(now);
                    }
                }
                _ => {}
            }
            black_box((&seen, start));
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
