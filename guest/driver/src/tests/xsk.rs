//! AF_XDP-style transmit: zero-copy and copy modes, completion order, back-pressure, invalid
//! descriptors.

use std::vec::Vec;

use super::{frame, harness, Harness};
use crate::net::TX_QUEUE;
use crate::xsk::{self, XSK_HEADROOM};
use crate::{Config, TxCompletion, Umem, XdpDesc, XskConfig, XskError, XskMode, XskSocket};

const FRAME_SIZE: u32 = 2048;
const FRAMES: u32 = 64;

fn umem(h: &Harness) -> Umem {
    let pages = (FRAMES * FRAME_SIZE) as usize / crate::PAGE_SIZE;
    let (_, vaddr) = h.hal.alloc_pages(pages);
    // SAFETY: freshly allocated test arena pages, used only through this umem.
    unsafe {
        Umem::new(
            &h.hal,
            vaddr,
            FRAMES as usize * FRAME_SIZE as usize,
            FRAME_SIZE,
        )
    }
    .expect("umem")
}

fn attach(h: &mut Harness, config: XskConfig) -> XskSocket {
    let (socket, port) = xsk::socket(umem(h), config).expect("socket");
    h.net.attach_xsk(port).expect("attach");
    socket
}

/// Writes frame `i` into chunk `i` and returns its descriptor.
fn put_frame(socket: &XskSocket, i: u32, len: usize) -> XdpDesc {
    let addr = socket.umem.frame_addr(i).expect("chunk");
    // SAFETY: the chunk is not submitted: the test owns it.
    unsafe { socket.umem.write(addr, &frame(i, len)) }.expect("in bounds");
    XdpDesc {
        addr,
        len: len as u32,
    }
}

fn completions(socket: &mut XskSocket) -> Vec<u64> {
    let mut out = std::vec![0u64; 256];
    let n = socket.completion.pop_into(&mut out);
    out.truncate(n);
    out
}

#[test]
fn zero_copy_posts_umem_frames_in_place_and_completes_in_used_order() {
    let mut h = harness(Config {
        tx_completion: TxCompletion::Lazy,
        ..Config::default()
    });
    let mut socket = attach(&mut h, XskConfig::default());
    let descs: Vec<XdpDesc> = (0..5)
        .map(|i| put_frame(&socket, i, 60 + i as usize))
        .collect();
    assert_eq!(socket.submit_tx(&descs), 5);
    assert_eq!(h.net.xsk_transmit(64), 5);

    let taken = h.dev.tx_take();
    assert_eq!(taken.len(), 5);
    for ((chain, bytes), desc) in taken.iter().zip(&descs) {
        assert_eq!(chain.descs.len(), 1, "header + frame in one descriptor");
        assert_eq!(
            chain.descs[0].addr,
            socket.umem.paddr() + desc.addr - XSK_HEADROOM
        );
        assert_eq!(chain.descs[0].len, desc.len + 12);
        assert_eq!(&bytes[..12], &[0u8; 12]);
        assert_eq!(
            bytes[12..],
            frame(
                (desc.addr / u64::from(FRAME_SIZE)) as u32,
                desc.len as usize
            )
        );
    }
    assert!(
        completions(&mut socket).is_empty(),
        "nothing completes before the device"
    );

    // The device returns 3, 1, 4 first; completions follow that order.
    for i in [3usize, 1, 4] {
        h.dev.tx.push_used(taken[i].0.head, 0);
    }
    h.net.reclaim_tx();
    assert_eq!(
        completions(&mut socket),
        [descs[3].addr, descs[1].addr, descs[4].addr]
    );
    for i in [0usize, 2] {
        h.dev.tx.push_used(taken[i].0.head, 0);
    }
    h.net.reclaim_tx();
    assert_eq!(completions(&mut socket), [descs[0].addr, descs[2].addr]);
    let c = h.net.counters();
    assert_eq!((c.tx_frames, c.tx_reclaimed), (5, 5));
    assert_eq!(
        c.tx_bytes,
        descs.iter().map(|d| u64::from(d.len)).sum::<u64>()
    );
}

#[test]
fn copy_mode_copies_into_driver_buffers() {
    let mut h = harness(Config::default());
    let mut socket = attach(
        &mut h,
        XskConfig {
            mode: XskMode::Copy,
            ..XskConfig::default()
        },
    );
    // Copy mode needs no headroom: data at the chunk start is fine.
    // SAFETY: chunk 1 is not submitted: the test owns it.
    unsafe { socket.umem.write(u64::from(FRAME_SIZE), &frame(1, 70)) }.expect("in bounds");
    let descs = [
        put_frame(&socket, 0, 60),
        XdpDesc {
            addr: u64::from(FRAME_SIZE),
            len: 70,
        },
    ];
    socket.submit_tx(&descs);
    assert_eq!(h.net.xsk_transmit(64), 2);
    let umem_range = socket.umem.paddr()..socket.umem.paddr() + socket.umem.size() as u64;
    let taken = h.dev.tx_take();
    for (chain, _) in &taken {
        assert!(
            !umem_range.contains(&chain.descs[0].addr),
            "a driver buffer, not the umem"
        );
    }
    assert_eq!(taken[0].1[12..], frame(0, 60));
    assert_eq!(taken[1].1[12..], frame(1, 70));
    assert!(
        completions(&mut socket).is_empty(),
        "completed when the device used the copy"
    );
    for (chain, _) in &taken {
        h.dev.tx.push_used(chain.head, 0);
    }
    h.net.reclaim_tx();
    assert_eq!(completions(&mut socket), [descs[0].addr, descs[1].addr]);
}

#[test]
fn kick_threshold_applies_to_xsk_transmit() {
    let mut h = harness(Config {
        kick_threshold: 4,
        event_idx: false,
        ..Config::default()
    });
    let mut socket = attach(&mut h, XskConfig::default());
    let descs: Vec<XdpDesc> = (0..10).map(|i| put_frame(&socket, i, 60)).collect();
    socket.submit_tx(&descs);
    assert_eq!(h.net.xsk_transmit(64), 10);
    assert_eq!(h.kicks(TX_QUEUE), 3, "at 4, at 8, at the end");
    assert_eq!(h.net.counters().tx_publishes, 3);
}

#[test]
fn invalid_descriptors_are_counted_and_not_completed() {
    let mut h = harness(Config::default());
    let mut socket = attach(&mut h, XskConfig::default());
    let good = put_frame(&socket, 2, 60);
    let fs = u64::from(FRAME_SIZE);
    let bad = [
        XdpDesc {
            addr: fs * u64::from(FRAMES),
            len: 60,
        }, // past the umem
        XdpDesc {
            addr: fs + 2000,
            len: 100,
        }, // crosses into the next chunk
        XdpDesc {
            addr: fs * 3,
            len: 60,
        }, // no headroom for the header
        XdpDesc {
            addr: fs * 3 + 4,
            len: 60,
        }, // too little headroom
        XdpDesc {
            addr: fs * 4 + 12,
            len: 0,
        }, // empty
        XdpDesc {
            addr: u64::MAX - 10,
            len: 60,
        }, // overflow
    ];
    let mut all = bad.to_vec();
    all.insert(3, good);
    socket.submit_tx(&all);
    assert_eq!(h.net.xsk_transmit(64), 1);
    assert_eq!(h.net.counters().xsk_invalid_descs, 6);
    let out = h.dev.tx_drain();
    assert_eq!(out, [frame(2, 60)]);
    h.net.reclaim_tx();
    assert_eq!(completions(&mut socket), [good.addr]);
}

#[test]
fn the_completion_ring_bounds_frames_in_flight() {
    let mut h = harness(Config::default());
    let mut socket = attach(
        &mut h,
        XskConfig {
            tx_ring_size: 16,
            completion_ring_size: 4,
            mode: XskMode::ZeroCopy,
        },
    );
    let descs: Vec<XdpDesc> = (0..10).map(|i| put_frame(&socket, i, 60)).collect();
    assert_eq!(socket.submit_tx(&descs), 10);
    assert_eq!(h.net.xsk_transmit(64), 4);
    h.dev.tx_drain();
    h.net.reclaim_tx();
    assert_eq!(h.net.xsk_transmit(64), 0, "4 completions not yet consumed");
    assert_eq!(completions(&mut socket).len(), 4);
    assert_eq!(h.net.xsk_transmit(64), 4);
    h.dev.tx_drain();
    h.net.reclaim_tx();
    completions(&mut socket);
    assert_eq!(h.net.xsk_transmit(64), 2);
    assert_eq!(h.net.counters().tx_frames, 10);
}

#[test]
fn a_full_tx_ring_leaves_descriptors_queued() {
    let mut h = harness(Config {
        tx_queue_size: 4,
        kick_threshold: 4,
        ..Config::default()
    });
    let socket = attach(&mut h, XskConfig::default());
    let mut socket = socket;
    let descs: Vec<XdpDesc> = (0..6).map(|i| put_frame(&socket, i, 60)).collect();
    socket.submit_tx(&descs);
    assert_eq!(h.net.xsk_transmit(64), 4);
    assert_eq!(h.net.counters().ring_full, 1);
    h.dev.tx_drain();
    h.net.reclaim_tx();
    assert_eq!(
        h.net.xsk_transmit(64),
        2,
        "the rest was still on the tx ring"
    );
    h.dev.tx_drain();
    h.net.reclaim_tx();
    assert_eq!(
        completions(&mut socket),
        descs.iter().map(|d| d.addr).collect::<Vec<_>>()
    );
}

#[test]
fn attach_and_detach() {
    let mut h = harness(Config::default());
    assert_eq!(h.net.detach_xsk().err(), Some(XskError::NotAttached));
    let mut socket = attach(&mut h, XskConfig::default());
    let (_, second) = xsk::socket(socket.umem, XskConfig::default()).expect("socket");
    assert_eq!(h.net.attach_xsk(second), Err(XskError::AlreadyAttached));
    socket.submit_tx(&[put_frame(&socket, 0, 60)]);
    h.net.xsk_transmit(1);
    assert_eq!(h.net.detach_xsk().err(), Some(XskError::Busy));
    h.dev.tx_drain();
    h.net.reclaim_tx();
    let port = h.net.detach_xsk().expect("idle");
    assert_eq!(port.in_flight(), 0);
    assert_eq!(h.net.xsk_transmit(64), 0, "nothing attached");
    assert!(matches!(
        xsk::socket(
            socket.umem,
            XskConfig {
                tx_ring_size: 3,
                ..XskConfig::default()
            }
        ),
        Err(XskError::RingSize(3))
    ));
}

#[test]
fn lazy_reclaim_inside_xsk_transmit_completes_the_frames_it_reclaims() {
    let mut h = harness(Config {
        tx_queue_size: 4,
        tx_completion: TxCompletion::Lazy,
        ..Config::default()
    });
    let mut socket = attach(&mut h, XskConfig::default());
    let descs: Vec<XdpDesc> = (0..5).map(|i| put_frame(&socket, i, 60)).collect();
    assert_eq!(socket.submit_tx(&descs[..4]), 4);
    assert_eq!(h.net.xsk_transmit(64), 4);
    h.dev.tx_drain();
    // The ring is full: this transmit reclaims the 4 (Lazy) before posting the fifth.
    assert_eq!(socket.submit_tx(&descs[4..]), 1);
    assert_eq!(h.net.xsk_transmit(64), 1);
    assert_eq!(h.net.counters().tx_reclaimed, 4);
    assert_eq!(
        completions(&mut socket),
        descs[..4].iter().map(|d| d.addr).collect::<Vec<_>>(),
        "the frames reclaimed inside xsk_transmit are completed"
    );
    h.dev.tx_drain();
    h.net.reclaim_tx();
    assert_eq!(completions(&mut socket), [descs[4].addr]);
    assert_eq!(h.net.detach_xsk().map(|p| p.in_flight()), Ok(0));
}

/// A tx queue reset hands the unsent AF_XDP frames back to the socket (completed once, so no
/// umem chunk is lost) and the port keeps transmitting on the re-enabled queue.
#[test]
fn tx_queue_reset_completes_unsent_umem_frames_once() {
    let mut h = super::harness_with(
        Config {
            tx_completion: TxCompletion::Lazy,
            ..Config::default()
        },
        |r| r.device_features |= crate::features::F_RING_RESET,
    );
    let mut socket = attach(&mut h, XskConfig::default());
    let descs: Vec<XdpDesc> = (0..4).map(|i| put_frame(&socket, i, 60)).collect();
    assert_eq!(socket.submit_tx(&descs), 4);
    assert_eq!(h.net.xsk_transmit(64), 4);
    let taken = h.dev.tx_take();
    assert_eq!(taken.len(), 4);
    h.dev.tx.push_used(taken[0].0.head, 0);
    let report = h.net.reset_queue(crate::QueueId::Tx).expect("reset");
    assert_eq!(report, crate::QueueResetReport { used: 1, unused: 3 });
    let mut done = completions(&mut socket);
    done.sort_unstable();
    let mut want: Vec<u64> = descs.iter().map(|d| d.addr).collect();
    want.sort_unstable();
    assert_eq!(done, want, "every chunk back once");
    assert_eq!(h.net.reclaim_tx(), 0);
    assert!(completions(&mut socket).is_empty(), "never completed twice");
    h.dev.reattach(TX_QUEUE as usize);
    let again = put_frame(&socket, 10, 70);
    assert_eq!(socket.submit_tx(&[again]), 1);
    assert_eq!(h.net.xsk_transmit(64), 1);
    assert_eq!(h.dev.tx_drain(), [frame(10, 70)]);
}
