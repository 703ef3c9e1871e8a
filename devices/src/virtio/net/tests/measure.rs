//! The measurement backends behind the real transmit and receive paths: a sink takes every
//! frame, a source's numbered frames land in order with every byte as generated, a loop hands
//! back exactly what was sent (MACs swapped) and holds the transmit queue when it is full.

use crate::backend::{LoopBackend, SinkBackend, SourceBackend, LOOP_CAPACITY, SOURCE_MAC};
use crate::virtio::net::metrics::{RxCounters, TxCounters};
use crate::virtio::net::tests::support::{frame, GuestQueue, Ring};
use crate::virtio::net::{RxMode, RxStop, TxStop, VNET_HDR_LEN};

/// A frame with a zero virtio-net header (the measurement backends offer no offloads).
fn plain(payload: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0u8; VNET_HDR_LEN];
    bytes.extend_from_slice(payload);
    bytes
}

#[test]
fn a_sink_takes_every_frame_the_driver_queues() {
    let mut ring = Ring::new(256);
    let mut sink = SinkBackend::new().expect("sink");
    let mut counters = TxCounters::default();
    let mut sent = 0u64;
    for round in 0..4u8 {
        for i in 0..200u8 {
            ring.driver
                .push_tx(&plain(&frame(60 + usize::from(i), round ^ i)), &[]);
        }
        let outcome = ring.tx(&mut sink, &mut counters);
        assert_eq!(outcome.stop, TxStop::Drained);
        sent += 200;
        assert_eq!(sink.frames(), sent);
        assert_eq!(counters.frames, sent);
        assert_eq!(u64::from(ring.driver.used_idx()), sent % 65536);
    }
}

#[test]
fn a_source_fills_every_buffer_with_numbered_frames_in_order() {
    let mut ring = Ring::new(64);
    let dst = [2, 0, 0, 0, 0, 7];
    let len = 128;
    let mut source = SourceBackend::new(dst, len).expect("source");
    let mut counters = RxCounters::default();
    let mut next_seq = 0u32;
    for _ in 0..3 {
        let chains: Vec<_> = (0..32).map(|_| ring.driver.push_rx(&[2048])).collect();
        let used_from = ring.driver.used_idx();
        let outcome = ring.rx(&mut source, RxMode::SingleChain, &mut counters);
        // A source never runs dry: the buffers do.
        assert_eq!(outcome.stop, RxStop::NoBuffers);
        let used = ring.driver.used_since(used_from);
        assert_eq!(used.len(), chains.len());
        for ((id, used_len), (head, bufs)) in used.iter().zip(&chains) {
            assert_eq!(*id, u32::from(*head));
            assert_eq!(*used_len as usize, VNET_HDR_LEN + len);
            let f = ring.driver.read(bufs[0] + VNET_HDR_LEN as u64, len);
            assert_eq!(&f[0..6], &dst);
            assert_eq!(&f[6..12], &SOURCE_MAC);
            assert_eq!(&f[12..14], &[0x88, 0xb5]);
            assert_eq!(f[14..18], next_seq.to_le_bytes());
            for (i, &b) in f.iter().enumerate().skip(20) {
                assert_eq!(b, (next_seq as usize + i) as u8);
            }
            next_seq += 1;
        }
    }
    assert_eq!(counters.frames, u64::from(next_seq));
    assert_eq!(source.frames(), next_seq);
}

#[test]
fn a_loop_returns_exactly_what_was_sent_and_holds_tx_when_full() {
    let mut tx = Ring::new(512);
    let mut lo = LoopBackend::new().expect("loop");
    let mut tx_counters = TxCounters::default();
    let sent: Vec<Vec<u8>> = (0..LOOP_CAPACITY + 10)
        .map(|i| frame(60 + i % 100, i as u8))
        .collect();
    for f in &sent {
        tx.driver.push_tx(&plain(f), &[]);
    }
    // The loop holds LOOP_CAPACITY frames (the budget of one call, too); the rest wait on
    // the ring.
    tx.tx(&mut lo, &mut tx_counters);
    let outcome = tx.tx(&mut lo, &mut tx_counters);
    assert_eq!(outcome.stop, TxStop::BackendFull);
    assert_eq!(tx_counters.frames, LOOP_CAPACITY as u64);
    assert_eq!(usize::from(tx.driver.used_idx()), LOOP_CAPACITY);

    // The receive side lives in the other half of guest memory's data area.
    let mut rx = tx.beside(0x4_0000, 512, 0x50_0000);
    let chains: Vec<_> = (0..sent.len())
        .map(|_| rx.driver.push_rx(&[2048]))
        .collect();
    let mut rx_counters = RxCounters::default();
    rx.rx(&mut lo, RxMode::SingleChain, &mut rx_counters);
    assert_eq!(rx_counters.frames, LOOP_CAPACITY as u64);
    // Room again: the rest goes through.
    let outcome = tx.tx(&mut lo, &mut tx_counters);
    assert_eq!(outcome.stop, TxStop::Drained);
    rx.rx(&mut lo, RxMode::SingleChain, &mut rx_counters);
    assert_eq!(rx_counters.frames, sent.len() as u64);

    let used = rx.driver.used_since(0);
    assert_eq!(used.len(), sent.len());
    for ((id, used_len), ((head, bufs), f)) in used.iter().zip(chains.iter().zip(&sent)) {
        assert_eq!(*id, u32::from(*head));
        assert_eq!(*used_len as usize, VNET_HDR_LEN + f.len());
        let mut want = f.clone();
        let (d, s) = want[..12].split_at_mut(6);
        d.swap_with_slice(s);
        assert_eq!(driver_read(&rx.driver, bufs[0], f.len()), want);
    }
}

/// The frame after the virtio-net header at `addr`.
fn driver_read(driver: &GuestQueue, addr: u64, len: usize) -> Vec<u8> {
    driver.read(addr + VNET_HDR_LEN as u64, len)
}
