//! Rate limiters through the worker: a throttled tx queue leaves chains queued and resumes on
//! its timer (notifications re-enabled correctly afterwards), rx stops reading the backend,
//! and a change at run time takes effect between batches.

use std::time::{Duration, Instant};

use super::support::{frame, guest_mem, wire};
use super::worker::{kick, queues, rig_with, start, TIMEOUT, VERSION_1};
use crate::test_utils::mmio::wait_until;
use crate::virtio::net::{BucketConfig, RateLimiterConfig};

fn ops(size: u64, refill_ms: u64) -> RateLimiterConfig {
    RateLimiterConfig {
        bandwidth: None,
        ops: Some(BucketConfig {
            size,
            one_time_burst: 0,
            refill_time: refill_ms,
        }),
    }
}

#[test]
fn a_tx_ops_limit_paces_frames_and_lifting_it_releases_the_rest() {
    let mem = guest_mem();
    let rig = rig_with(&mem, |device| {
        device
            .tuning_control()
            .set_rate_limiters(RateLimiterConfig::default(), ops(10, 100))
            .expect("valid");
    });
    let (rx, mut tx) = queues(&mem);
    let mut transport = rig.transport;
    start(&mut transport, VERSION_1, &rx, &tx);
    let frames: Vec<Vec<u8>> = (0..40u8).map(|i| wire(&frame(60, i))).collect();
    for f in &frames {
        tx.push_tx(f, &[]);
    }
    let start_at = Instant::now();
    kick(&transport, 1);
    // 10 at once, then 1 per 10 ms: the 30th frame cannot leave before ~200 ms.
    for f in &frames[..30] {
        assert_eq!(&rig.peer.recv_frame().expect("frame"), f);
    }
    let paced = start_at.elapsed();
    assert!(paced >= Duration::from_millis(180), "{paced:?}");
    assert!(rig.metrics.tx.rate_limiter_throttled.get() > 0);
    // Lift the limit: the rest goes at once, without another kick.
    rig.tuning
        .set_rate_limiters(RateLimiterConfig::default(), RateLimiterConfig::default())
        .expect("valid");
    let lifted = Instant::now();
    for f in &frames[30..] {
        assert_eq!(&rig.peer.recv_frame().expect("frame"), f);
    }
    assert!(
        lifted.elapsed() < Duration::from_millis(90),
        "{:?}",
        lifted.elapsed()
    );
    assert!(wait_until(TIMEOUT, || tx.used_idx() == 40));
    assert!(rig.metrics.tx.rate_limiter_throttled_us.get() > 100_000);
    assert!(rig.metrics.tx.rate_limiter_frames.get() >= 30);
    // Notifications work after throttling: a new frame and a kick still go out.
    let late = wire(&frame(60, 99));
    tx.push_tx(&late, &[]);
    kick(&transport, 1);
    assert_eq!(rig.peer.recv_frame().expect("frame"), late);
}

#[test]
fn an_rx_bandwidth_limit_stops_reading_the_backend() {
    let mem = guest_mem();
    let rig = rig_with(&mem, |device| {
        let bw = RateLimiterConfig {
            bandwidth: Some(BucketConfig {
                size: 1000,
                one_time_burst: 0,
                refill_time: 100,
            }),
            ops: None,
        };
        device
            .tuning_control()
            .set_rate_limiters(bw, RateLimiterConfig::default())
            .expect("valid");
    });
    let (mut rx, tx) = queues(&mem);
    for _ in 0..64 {
        rx.push_rx(&[2048]);
    }
    let mut transport = rig.transport;
    start(&mut transport, VERSION_1, &rx, &tx);
    // 30 frames of 100 bytes (3000 bytes): 1000 at once, then 10 bytes per ms.
    let start_at = Instant::now();
    for i in 0..30u8 {
        rig.peer.send_frame(&wire(&frame(100, i))).expect("send");
    }
    assert!(wait_until(TIMEOUT, || rig.metrics.rx.frames.get() == 30));
    let took = start_at.elapsed();
    assert!(took >= Duration::from_millis(150), "{took:?}");
    assert!(rig.metrics.rx.rate_limiter_throttled.get() > 0);
    assert_eq!(rig.metrics.rx.rate_limiter_bytes.get(), 3000);
}
