//! Tap tests. They need root and /dev/net/tun, and run each body on a thread that first
//! moves into a fresh network namespace (`unshare(CLONE_NEWNET)`): no interface is ever
//! created in the root namespace, and everything disappears with the thread.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::*;
use crate::iovec::IovecList;
use crate::test_utils::link::{link_up, set_link, PacketSocket};
use crate::test_utils::netns::in_netns;

/// An EtherType reserved for local experiments (IEEE 802 "Local Experimental 1").
const ETHERTYPE: u16 = 0x88b5;

/// Creates a persistent tap the way `ip tuntap add` does, and closes it.
fn create_persistent_tap(name: &str) {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .expect("open /dev/net/tun");
    let mut req = ifreq_for(name);
    req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as i16;
    // SAFETY: valid ifreq living across the call.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) };
    assert_eq!(ret, 0, "TUNSETIFF: {}", io::Error::last_os_error());
    // SAFETY: TUNSETPERSIST takes its argument by value.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETPERSIST, 1 as libc::c_ulong) };
    assert_eq!(ret, 0, "TUNSETPERSIST: {}", io::Error::last_os_error());
}

fn ethernet_frame(len: usize, seed: u8) -> Vec<u8> {
    let mut frame = vec![0xff; 6];
    frame.extend_from_slice(&[0x02, 0, 0, 0, 0, seed]);
    frame.extend_from_slice(&ETHERTYPE.to_be_bytes());
    frame.extend((0..len - 14).map(|i| (i as u8) ^ seed));
    frame
}

fn wait_readable(fd: i32) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd living across the call.
    let ready = unsafe { libc::poll(&mut pfd, 1, 5000) };
    assert_eq!(ready, 1, "timed out waiting for a frame");
}

/// Reads frames from the tap until one with [`ETHERTYPE`] arrives (the kernel may send IPv6
/// neighbour discovery first); returns (full length, bytes read).
fn read_test_frame(tap: &mut Tap, capacity: usize) -> (usize, Vec<u8>) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        assert!(Instant::now() < deadline, "no test frame on the tap");
        wait_readable(tap.as_raw_fd());
        let mut buf = vec![0u8; capacity];
        let n = {
            let mut list = IovecList::new();
            list.push_slice(&mut buf).expect("room");
            match tap.read_frame(list.as_iovecs()) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => panic!("tap read: {e}"),
            }
        };
        let ethertype_at = 12 + 12;
        if buf.len() >= ethertype_at + 2
            && buf[ethertype_at..ethertype_at + 2] == ETHERTYPE.to_be_bytes()
        {
            buf.truncate(n.min(capacity));
            return (n, buf);
        }
    }
}

#[test]
fn creates_a_missing_tap_and_opens_an_existing_one() {
    in_netns(|| {
        assert!(!interface_exists("vmmtest0"));
        let tap = Tap::open("vmmtest0").expect("create tap");
        assert_eq!(tap.name(), "vmmtest0");
        assert!(interface_exists("vmmtest0"));
        assert!(tap.supported_offloads().contains(Offloads::CSUM));
        drop(tap);
        assert!(
            !interface_exists("vmmtest0"),
            "a tap we created goes away with us"
        );

        create_persistent_tap("vmmtest1");
        assert!(interface_exists("vmmtest1"));
        let tap = Tap::open("vmmtest1").expect("open existing tap");
        drop(tap);
        assert!(
            interface_exists("vmmtest1"),
            "an existing persistent tap stays"
        );
    });
}

#[test]
fn refuses_bad_names_and_non_tap_interfaces() {
    in_netns(|| {
        assert!(matches!(
            Tap::open("this-name-is-too-long"),
            Err(TapError::InvalidName { .. })
        ));
        assert!(matches!(
            Tap::open("a/b"),
            Err(TapError::InvalidName { .. })
        ));
        match Tap::open("lo") {
            Err(TapError::SetIff { name, .. }) => assert_eq!(name, "lo"),
            other => panic!("expected SetIff, got {other:?}"),
        }
    });
}

#[test]
fn offloads_and_header_size_are_set() {
    in_netns(|| {
        let mut tap = Tap::open("vmmtest2").expect("create tap");
        let supported = tap.supported_offloads();
        tap.set_offloads(supported).expect("all supported offloads");
        tap.set_offloads(Offloads::NONE).expect("no offload");
        assert!(tap.set_offloads(Offloads::TSO4).is_err(), "TSO needs CSUM");
        tap.set_vnet_hdr_size(12).expect("header size");
        let mut size: libc::c_int = 0;
        // SAFETY: TUNGETVNETHDRSZ writes one c_int to `size`, which outlives the call.
        let ret = unsafe { libc::ioctl(tap.as_raw_fd(), libc::TUNGETVNETHDRSZ, &mut size) };
        assert_eq!((ret, size), (0, 12));
    });
}

#[test]
fn frames_round_trip_through_the_kernel() {
    in_netns(|| {
        let mut tap = Tap::open("vmmtest3").expect("create tap");
        link_up("vmmtest3").expect("link up");
        let sock = PacketSocket::open("vmmtest3", ETHERTYPE).expect("packet socket");

        // Guest → host: header + frame written to the tap arrive on the interface.
        let out = ethernet_frame(200, 1);
        let mut hdr = [0u8; 12];
        let mut body = out.clone();
        {
            let mut list = IovecList::new();
            list.push_slice(&mut hdr).expect("room");
            list.push_slice(&mut body).expect("room");
            assert_eq!(tap.write_frame(list.as_iovecs()).expect("write"), 212);
        }
        wait_readable(sock.as_raw_fd());
        let mut buf = vec![0u8; 2048];
        // SAFETY: `buf` has room for its length and outlives the call.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        assert_eq!(n, 200);
        assert_eq!(buf[..200], out[..]);

        // Host → guest: a frame sent on the interface is read from the tap with its header.
        // When the buffer is too small the result exceeds its capacity (the guard byte), the
        // contract process_rx relies on to count the frame as dropped; an exact fit is not
        // mistaken for truncation.
        for (len, capacity) in [(300usize, 2048usize), (1000, 100), (500, 512)] {
            let frame = ethernet_frame(len, 2);
            let sent = sock.send(&frame).expect("sendto");
            assert_eq!(sent, len);
            let (n, got) = read_test_frame(&mut tap, capacity);
            if 12 + len <= capacity {
                assert_eq!(n, 12 + len);
            } else {
                assert!(n > capacity, "truncation detected: {n}");
            }
            let shown = capacity.min(12 + len);
            assert_eq!(got[12..shown], frame[..shown - 12]);
        }
    });
}

#[test]
fn reads_scatter_across_split_buffers_adjacent_or_not() {
    in_netns(|| {
        let mut tap = Tap::open("vmmtest4").expect("create tap");
        link_up("vmmtest4").expect("link up");
        let sock = PacketSocket::open("vmmtest4", ETHERTYPE).expect("packet socket");
        for adjacent in [true, false] {
            let frame = ethernet_frame(300, if adjacent { 3 } else { 4 });
            assert_eq!(sock.send(&frame).expect("sendto"), 300);
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                assert!(Instant::now() < deadline, "no test frame on the tap");
                wait_readable(tap.as_raw_fd());
                // One buffer cut in three (adjacent pieces: merged into one kernel iovec), or
                // three separate buffers (scattered).
                let mut one = vec![0u8; 600];
                let mut parts = [vec![0u8; 40], vec![0u8; 100], vec![0u8; 460]];
                let n = {
                    let mut list = IovecList::new();
                    if adjacent {
                        let (a, rest) = one.split_at_mut(40);
                        let (b, c) = rest.split_at_mut(100);
                        for piece in [a, b, c] {
                            list.push_slice(piece).expect("room");
                        }
                    } else {
                        for piece in parts.iter_mut() {
                            list.push_slice(piece).expect("room");
                        }
                    }
                    tap.read_frame(list.as_iovecs()).expect("read")
                };
                let got: Vec<u8> = if adjacent { one } else { parts.concat() };
                if got[24..26] != ETHERTYPE.to_be_bytes() {
                    continue; // something the kernel sent on its own
                }
                assert_eq!(n, 312);
                assert_eq!(got[12..312], frame[..]);
                break;
            }
        }
    });
}

#[test]
fn the_guest_link_follows_the_tap() {
    use crate::test_utils::mmio::{wait_eventfd, wait_until, Registers};
    use crate::virtio::mmio::CONFIG_SPACE_OFFSET;
    use crate::virtio::net::tests::support::GuestQueue;
    use crate::virtio::net::NetDevice;
    use crate::virtio::MmioTransport;
    use crate::BusDevice;
    use virtio_bindings::virtio_mmio::{
        VIRTIO_MMIO_INTERRUPT_ACK, VIRTIO_MMIO_INTERRUPT_STATUS, VIRTIO_MMIO_INT_CONFIG,
    };
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    in_netns(|| {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x80_0000)]).expect("memory");
        let device = NetDevice::new(&"tap=vmmlink0".parse().expect("spec")).expect("device");
        let link = device.link_control();
        let mut t = MmioTransport::new(mem.clone(), Box::new(device)).expect("transport");
        let rx = GuestQueue::at(&mem, GuestAddress(0), 256, 0x10_0000);
        let tx = GuestQueue::at(&mem, GuestAddress(0x1_0000), 256, 0x40_0000);
        assert!(t.negotiate(1 << 32 | 1 << 16)); // VERSION_1 | STATUS
        t.setup_queue(0, 256, rx.ring_addrs());
        t.setup_queue(1, 256, tx.ring_addrs());
        t.driver_ok();
        let status = |t: &mut MmioTransport| {
            let mut b = [0u8; 2];
            BusDevice::read(t, CONFIG_SPACE_OFFSET + 6, &mut b);
            u16::from_le_bytes(b) & 1 // VIRTIO_NET_S_LINK_UP
        };
        let config_interrupt = |t: &mut MmioTransport| {
            assert!(
                wait_eventfd(t.irqfd(), Duration::from_secs(5)) > 0,
                "interrupt"
            );
            let s = t.r32(VIRTIO_MMIO_INTERRUPT_STATUS);
            t.w32(VIRTIO_MMIO_INTERRUPT_ACK, s);
            s & VIRTIO_MMIO_INT_CONFIG
        };
        link_up("vmmlink0").expect("link up");
        // The worker learns of it from rtnetlink, asynchronously.
        assert!(wait_until(Duration::from_secs(5), || status(&mut t) == 1));
        set_link("vmmlink0", false).expect("link down");
        assert!(wait_until(Duration::from_secs(5), || link.link()
            == crate::virtio::net::LinkState::Down));
        assert_eq!(config_interrupt(&mut t), VIRTIO_MMIO_INT_CONFIG);
        assert_eq!(status(&mut t), 0, "the driver sees the link down");
        set_link("vmmlink0", true).expect("link up");
        assert!(wait_until(Duration::from_secs(5), || link.link()
            == crate::virtio::net::LinkState::Up));
        assert_eq!(config_interrupt(&mut t), VIRTIO_MMIO_INT_CONFIG);
        assert_eq!(status(&mut t), 1, "and up again");
    });
}

/// Writes `frame` with a zero virtio-net header to `tap`.
fn write_test_frame(tap: &mut Tap, frame: &[u8]) -> io::Result<usize> {
    let mut hdr = [0u8; 12];
    let mut body = frame.to_vec();
    let mut list = IovecList::new();
    list.push_slice(&mut hdr).expect("room");
    list.push_slice(&mut body).expect("room");
    tap.write_frame(list.as_iovecs())
}

/// Receives one frame from the packet socket.
fn recv_test_frame(sock: &PacketSocket) -> Vec<u8> {
    wait_readable(sock.as_raw_fd());
    let mut buf = vec![0u8; 2048];
    // SAFETY: `buf` has room for its length and outlives the call.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    assert!(n > 0, "recv: {}", io::Error::last_os_error());
    buf.truncate(n as usize);
    buf
}

fn tunsetqueue(tap: &Tap, flags: libc::c_int) -> libc::c_int {
    let mut req = ifreq_for("");
    req.ifr_ifru.ifru_flags = flags as i16;
    // SAFETY: TUNSETQUEUE reads the flags of `req`, which outlives the call.
    unsafe { libc::ioctl(tap.as_raw_fd(), libc::TUNSETQUEUE, &mut req) }
}

/// Whether the kernel steers frames to this queue (probed: detaching a detached queue is
/// EINVAL; an attached one is attached again after the probe).
fn attached(tap: &Tap) -> bool {
    if tunsetqueue(tap, libc::IFF_DETACH_QUEUE) != 0 {
        return false;
    }
    assert_eq!(tunsetqueue(tap, libc::IFF_ATTACH_QUEUE), 0, "re-attach");
    true
}

/// The tap's `IFF_*` flags (`TUNGETIFF` on one of its fds).
fn tun_flags(tap: &Tap) -> u32 {
    let mut req = ifreq_for("");
    // SAFETY: TUNGETIFF writes the name and flags into `req`, which outlives the call.
    let ret = unsafe { libc::ioctl(tap.as_raw_fd(), libc::TUNGETIFF, &mut req) };
    assert_eq!(ret, 0, "TUNGETIFF: {}", io::Error::last_os_error());
    // SAFETY: TUNGETIFF filled the flags member of the union.
    u32::from(unsafe { req.ifr_ifru.ifru_flags } as u16)
}

#[test]
fn a_multi_queue_tap_has_one_fd_per_queue_and_idle_queues_detached() {
    in_netns(|| {
        let mut taps = Tap::open_queues("vmmmq0", 3).expect("create multi-queue tap");
        assert_eq!(taps.len(), 3);
        assert_ne!(
            tun_flags(&taps[0]) & libc::IFF_MULTI_QUEUE as u32,
            0,
            "created multi_queue"
        );
        link_up("vmmmq0").expect("link up");
        let sock = PacketSocket::open("vmmmq0", ETHERTYPE).expect("packet socket");
        // Queue 0 carries frames both ways; 1 and 2 are detached (no flow is steered to
        // them) until enabled.
        let out = ethernet_frame(200, 1);
        assert_eq!(write_test_frame(&mut taps[0], &out).expect("write"), 212);
        assert_eq!(recv_test_frame(&sock), out);
        assert!(attached(&taps[0]));
        assert!(!attached(&taps[1]) && !attached(&taps[2]));
        // Host → guest: with one queue attached every flow lands on queue 0.
        for seed in 0..8 {
            let frame = ethernet_frame(100, seed);
            sock.send(&frame).expect("sendto");
            let (_, got) = read_test_frame(&mut taps[0], 2048);
            assert_eq!(got[12..], frame[..]);
        }
        // Enabled: queue 1 carries frames intact; enabling twice is harmless.
        taps[1].set_queue_enabled(true).expect("attach");
        taps[1]
            .set_queue_enabled(true)
            .expect("attach again: no-op");
        assert!(attached(&taps[1]));
        assert!(!attached(&taps[2]));
        let out = ethernet_frame(300, 2);
        assert_eq!(write_test_frame(&mut taps[1], &out).expect("write"), 312);
        assert_eq!(recv_test_frame(&sock), out);
        // Disabled again.
        taps[1].set_queue_enabled(false).expect("detach");
        taps[1]
            .set_queue_enabled(false)
            .expect("detach again: no-op");
        assert!(!attached(&taps[1]));
        // A single-queue tap needs nothing.
        let mut single = Tap::open("vmmmq1").expect("single-queue tap");
        single.set_queue_enabled(false).expect("no-op");
        single.set_queue_enabled(true).expect("no-op");
        drop(taps);
        assert!(
            !interface_exists("vmmmq0"),
            "a tap we created goes away with us"
        );
    });
}

#[test]
fn a_single_queue_tap_cannot_be_opened_with_several_queues() {
    in_netns(|| {
        create_persistent_tap("vmmmq2");
        match Tap::open_queues("vmmmq2", 2) {
            Err(e @ TapError::NotMultiQueue { .. }) => {
                let text = e.to_string();
                assert!(
                    text.contains("ip tuntap add dev vmmmq2 mode tap multi_queue"),
                    "{text}"
                );
                assert!(text.contains("queues=2"), "{text}");
            }
            other => panic!("expected NotMultiQueue, got {other:?}"),
        }
        // One queue still opens it.
        assert_eq!(Tap::open_queues("vmmmq2", 1).expect("single").len(), 1);
    });
}

/// Writes `frames`, each behind a zero virtio-net header, with one `write_frames` call (one
/// io_uring submission where batching is on); returns each frame's result.
fn write_batch(tap: &mut Tap, frames: &[Vec<u8>]) -> Vec<io::Result<usize>> {
    let mut hdrs = vec![[0u8; 12]; frames.len()];
    let mut bodies = frames.to_vec();
    let mut list = IovecList::new();
    let mut ends = Vec::new();
    for (hdr, body) in hdrs.iter_mut().zip(bodies.iter_mut()) {
        list.push_slice(hdr).expect("room");
        list.push_slice(body).expect("room");
        ends.push(list.len());
    }
    let mut results: Vec<io::Result<usize>> = (0..frames.len()).map(|_| Ok(0)).collect();
    tap.write_frames(&list, &ends, &mut results);
    results
}

#[test]
fn batched_writes_through_io_uring_arrive_whole_and_in_order() {
    in_netns(|| {
        let mut tap = Tap::open("vmmtest7").expect("create tap");
        assert!(
            tap.set_tx_batching(true),
            "io_uring is available on this project's hosts"
        );
        assert_eq!(tap.tx_batch(), crate::backend::MAX_TX_BATCH);
        link_up("vmmtest7").expect("link up");
        let sock = PacketSocket::open("vmmtest7", ETHERTYPE).expect("packet socket");

        let frames: Vec<Vec<u8>> = (0..20)
            .map(|i| ethernet_frame(60 + 7 * i, i as u8))
            .collect();
        let results = write_batch(&mut tap, &frames);
        for (result, frame) in results.iter().zip(&frames) {
            assert_eq!(*result.as_ref().expect("written"), 12 + frame.len());
        }
        for frame in &frames {
            assert_eq!(&recv_test_frame(&sock), frame);
        }

        // Off, the same call writes frame by frame.
        assert!(!tap.set_tx_batching(false));
        assert_eq!(tap.tx_batch(), 1);
        write_batch(&mut tap, &frames[..2]);
        assert_eq!(recv_test_frame(&sock), frames[0]);
        assert_eq!(recv_test_frame(&sock), frames[1]);
    });
}

/// The transmit ring's reference on the tap (its fixed file) goes with the tap: a tap we
/// created is gone the moment we drop it, and an existing one can be opened again at once
/// (a single-queue tap refuses a second attach while anything still holds the first).
#[test]
fn a_tap_with_its_io_uring_closes_at_once() {
    in_netns(|| {
        for name in ["vmmtest8", "vmmtest9"] {
            let existing = name == "vmmtest9";
            if existing {
                create_persistent_tap(name);
            }
            let mut tap = Tap::open(name).expect("open tap");
            assert!(
                tap.set_tx_batching(true),
                "io_uring on this project's hosts"
            );
            link_up(name).expect("link up");
            let frames: Vec<Vec<u8>> = (0..4).map(|i| ethernet_frame(60, i)).collect();
            let results = write_batch(&mut tap, &frames);
            assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
            drop(tap);
            if existing {
                let again = Tap::open(name).expect("an existing tap opens again at once");
                drop(again);
            } else {
                assert!(
                    !interface_exists(name),
                    "a tap we created goes away with us"
                );
            }
        }
    });
}
