//! Rate limiters through the worker: a throttled tx queue leaves chains queued and resumes on
//! its timer (notifications re-enabled correctly afterwards), rx stops reading the backend,
//! and a change at run time takes effect between batches; on split and packed rings alike.

use std::time::{Duration, Instant};

use super::driver::{rig_for, start_rings, started_rings, DriverRing};
use super::support::{frame, guest_mem, wire, GuestQueue};
use super::worker::{kick, TIMEOUT, VERSION_1};
use crate::test_utils::mmio::wait_until;
use crate::test_utils::packed::GuestPackedQueue;
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
    tx_ops_limit::<GuestQueue>();
}

#[test]
fn a_tx_ops_limit_paces_frames_on_a_packed_ring() {
    tx_ops_limit::<GuestPackedQueue>();
}

fn tx_ops_limit<Q: DriverRing>() {
    let mem = guest_mem();
    let (rig, _rx, mut tx) = started_rings::<Q>(&mem, VERSION_1, |device| {
        device
            .tuning_control()
            .set_rate_limiters(RateLimiterConfig::default(), ops(10, 100))
            .expect("valid");
    });
    let frames: Vec<Vec<u8>> = (0..40u8).map(|i| wire(&frame(60, i))).collect();
    let ids: Vec<u16> = frames.iter().map(|f| tx.offer_tx(f, &[])).collect();
    let start_at = Instant::now();
    kick(&rig.transport, 1);
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
    for id in ids {
        assert_eq!(
            tx.wait_used(),
            (u32::from(id), 0),
            "each chain once, in order"
        );
    }
    assert!(rig.metrics.tx.rate_limiter_throttled_us.get() > 100_000);
    assert!(rig.metrics.tx.rate_limiter_frames.get() >= 30);
    // Notifications work after throttling: a new frame and a kick still go out.
    let late = wire(&frame(60, 99));
    tx.offer_tx(&late, &[]);
    kick(&rig.transport, 1);
    assert_eq!(rig.peer.recv_frame().expect("frame"), late);
}

#[test]
fn an_rx_bandwidth_limit_stops_reading_the_backend() {
    rx_bandwidth_limit::<GuestQueue>();
}

#[test]
fn an_rx_bandwidth_limit_stops_reading_the_backend_on_a_packed_ring() {
    rx_bandwidth_limit::<GuestPackedQueue>();
}

fn rx_bandwidth_limit<Q: DriverRing>() {
    let mem = guest_mem();
    let rig = rig_for::<Q>(&mem, |device| {
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
    let (mut rx, tx) = Q::pair(&mem);
    let bufs: Vec<(u16, u64)> = (0..64)
        .map(|_| {
            let (id, addrs) = rx.offer_rx(&[2048]);
            (id, addrs[0])
        })
        .collect();
    let mut transport = rig.transport;
    start_rings(&mut transport, VERSION_1, &[&rx, &tx]);
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
    // Every frame whole, in order, in the buffers the ring names.
    for (i, &(id, addr)) in bufs.iter().take(30).enumerate() {
        assert_eq!(rx.wait_used(), (u32::from(id), 12 + 100));
        assert_eq!(rx.peek(addr + 12, 100), frame(100, i as u8), "frame {i}");
    }
}
