//! The vhost-user backend driven by rust-vmm's frontend over a socket pair, guest memory in a
//! memfd both sides map: frames both ways through the device's worker, GET_VRING_BASE and a
//! resume exactly where the rings stood, MQ pairs following SET_VRING_ENABLE, reconnection,
//! and hostile frontends (each refused message ends its connection and is counted; the
//! backend serves the next frontend).

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{VIRTIO_NET_F_MAC, VIRTIO_NET_F_MQ, VIRTIO_NET_F_STATUS};
use vm_memory::mmap::MmapRegion;
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::*;
use crate::backend::{PairBackend, PairPeer};
use crate::test_utils::mmio::{wait_eventfd, wait_until};
use crate::test_utils::queue::GuestQueue;
use crate::virtio::net::{MacAddr, NetDevice};

const TIMEOUT: Duration = Duration::from_secs(10);
/// Guest memory: 4 MiB at guest address 0, which the frontend has at `VA`.
const MEM: u64 = 0x40_0000;
const VA: u64 = 0x7f00_0000_0000;
const QUEUE_SIZE: u16 = 16;
const VERSION_1: u64 = 1 << VIRTIO_F_VERSION_1;
/// A 12-byte virtio-net header (VERSION_1) of zeros.
const HDR: usize = 12;

type Backend = Arc<Mutex<VhostUserBackend<NetDevice<PairBackend>>>>;

fn memfd(len: u64) -> File {
    // SAFETY: memfd_create with a static name returns a new descriptor we then own.
    let fd = unsafe { libc::memfd_create(c"guest".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(len).expect("ftruncate");
    file
}

/// The frontend's side: its memory, its rings, the connection and the backend's thread.
struct Rig {
    frontend: Frontend,
    file: File,
    mem: GuestMemoryMmap,
    backend: Backend,
    server: Option<JoinHandle<ConnectionEnd>>,
    peers: Vec<PairPeer>,
    kicks: Vec<EventFd>,
    calls: Vec<EventFd>,
    /// rx0 tx0 rx1 tx1 …
    queues: Vec<GuestQueue>,
}

fn backend(pairs: usize) -> (Backend, Vec<PairPeer>) {
    let (backends, peers): (Vec<_>, Vec<_>) = (0..pairs)
        .map(|_| PairBackend::new().expect("socketpair"))
        .unzip();
    let device = NetDevice::with_backends(backends, MacAddr::new([2, 0, 0, 0, 0, 1]), 256);
    (
        Arc::new(Mutex::new(VhostUserBackend::new(device, "test"))),
        peers,
    )
}

fn connect(backend: &Backend) -> (Frontend, JoinHandle<ConnectionEnd>) {
    let (ours, theirs) = UnixStream::pair().expect("socketpair");
    let server = {
        let backend = backend.clone();
        thread::spawn(move || serve(theirs, backend))
    };
    (Frontend::from_stream(ours, 8), server)
}

impl Rig {
    fn new(pairs: usize) -> Rig {
        let (backend, peers) = backend(pairs);
        let (frontend, server) = connect(&backend);
        let file = memfd(MEM);
        let region = MmapRegion::from_file(
            FileOffset::new(file.try_clone().expect("dup"), 0),
            MEM as usize,
        )
        .expect("map");
        let mem =
            GuestMemoryMmap::from_regions(vec![
                GuestRegionMmap::new(region, GuestAddress(0)).expect("region")
            ])
            .expect("memory");
        let queues = (0..2 * pairs as u64)
            .map(|i| GuestQueue::at(&mem, GuestAddress(i * 0x4000), QUEUE_SIZE, (i + 1) << 18))
            .collect();
        let fds = |n| (0..n).map(|_| EventFd::new(EFD_NONBLOCK).expect("eventfd"));
        Rig {
            frontend,
            file,
            mem,
            backend,
            server: Some(server),
            peers,
            kicks: fds(2 * pairs).collect(),
            calls: fds(2 * pairs).collect(),
            queues,
        }
    }

    /// Features, protocol features and the memory table.
    fn negotiate(&mut self, features: u64) {
        let f = &mut self.frontend;
        f.set_owner().expect("owner");
        let offered = f.get_features().expect("features");
        assert_ne!(offered & VHOST_USER_F_PROTOCOL_FEATURES, 0);
        f.set_features(features | VHOST_USER_F_PROTOCOL_FEATURES)
            .expect("set features");
        let protocol = f.get_protocol_features().expect("protocol features");
        assert!(protocol.contains(VhostUserProtocolFeatures::REPLY_ACK));
        f.set_protocol_features(
            protocol
                & (VhostUserProtocolFeatures::MQ
                    | VhostUserProtocolFeatures::REPLY_ACK
                    | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS),
        )
        .expect("set protocol features");
        // Every request from here on waits for the backend's ack.
        f.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        let region = self.region();
        self.frontend
            .set_mem_table(&[region])
            .expect("memory table");
    }

    fn region(&self) -> VhostUserMemoryRegionInfo {
        VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: MEM,
            userspace_addr: VA,
            mmap_offset: 0,
            mmap_handle: self.file.as_raw_fd(),
        }
    }

    /// Sets up ring `i` at `base` (addresses in the frontend's address space).
    fn setup_ring(&mut self, i: usize, base: u16) {
        let (desc, avail, used) = self.queues[i].ring_addrs();
        let f = &mut self.frontend;
        f.set_vring_num(i, QUEUE_SIZE).expect("num");
        f.set_vring_addr(
            i,
            &VringConfigData {
                queue_max_size: QUEUE_SIZE,
                queue_size: QUEUE_SIZE,
                flags: 0,
                desc_table_addr: VA + desc,
                used_ring_addr: VA + used,
                avail_ring_addr: VA + avail,
                log_addr: None,
            },
        )
        .expect("addr");
        f.set_vring_base(i, base).expect("base");
        f.set_vring_call(i, &self.calls[i]).expect("call");
        f.set_vring_kick(i, &self.kicks[i]).expect("kick");
    }

    fn start(&mut self, pairs: usize) {
        for i in 0..2 * pairs {
            self.setup_ring(i, 0);
            self.frontend.set_vring_enable(i, true).expect("enable");
        }
    }

    fn running(&self) -> bool {
        lock(&self.backend).is_running()
    }

    fn metrics(&self) -> Arc<VhostUserMetrics> {
        lock(&self.backend).metrics()
    }

    /// Sends `payload` on pair `pair`'s tx queue and returns what the backend got.
    fn transmit(&mut self, pair: usize, payload: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0u8; HDR];
        bytes.extend_from_slice(payload);
        self.queues[2 * pair + 1].push_tx(&bytes, &[]);
        self.kicks[2 * pair + 1].write(1).expect("kick");
        let got = self.peers[pair].recv_frame().expect("frame on the backend");
        assert!(
            wait_eventfd(&self.calls[2 * pair + 1], TIMEOUT) > 0,
            "tx call signalled"
        );
        got
    }

    /// The frontend disconnects; returns how the backend saw the connection end.
    fn hang_up(mut self) -> (ConnectionEnd, Backend, Vec<PairPeer>) {
        let server = self.server.take().expect("server");
        drop(self.frontend);
        (
            server.join().expect("server thread"),
            self.backend,
            self.peers,
        )
    }
}

#[test]
fn frames_flow_both_ways_and_a_stopped_ring_resumes_where_it_stood() {
    let mut rig = Rig::new(1);
    rig.negotiate(VERSION_1);
    rig.setup_ring(0, 0);
    rig.setup_ring(1, 0);
    assert!(
        !rig.running(),
        "rings start disabled with the protocol features"
    );
    rig.frontend.set_vring_enable(0, true).expect("enable");
    rig.frontend.set_vring_enable(1, true).expect("enable");
    assert!(rig.running());

    // Transmit: the frame reaches the backend with its header.
    let got = rig.transmit(0, b"hello over vhost-user");
    assert_eq!(&got[HDR..], b"hello over vhost-user");
    assert_eq!(rig.queues[1].used_idx(), 1);

    // Receive: four buffers posted, one frame, the call fd signalled.
    let buffers: Vec<(u16, u64)> = (0..4)
        .map(|_| {
            let (head, addrs) = rig.queues[0].push_rx(&[2048]);
            (head, addrs[0])
        })
        .collect();
    rig.kicks[0].write(1).expect("kick");
    let mut frame = vec![0u8; HDR];
    frame.extend_from_slice(b"for the guest");
    rig.peers[0].send_frame(&frame).expect("send");
    assert!(wait_eventfd(&rig.calls[0], TIMEOUT) > 0, "rx call");
    let (id, len) = rig.queues[0].used(0);
    assert_eq!(len as usize, frame.len());
    let addr = buffers
        .iter()
        .find(|(head, _)| u32::from(*head) == id)
        .expect("a posted buffer")
        .1;
    let mut bytes = vec![0u8; frame.len()];
    rig.mem
        .read_slice(&mut bytes, GuestAddress(addr))
        .expect("read");
    assert_eq!(&bytes[HDR..], b"for the guest");

    // GET_VRING_BASE: the device stops; the rx chains it had popped ahead go back, so the
    // base is the next unfilled buffer (1), not what the device had taken (4).
    assert_eq!(rig.frontend.get_vring_base(0).expect("base"), 1);
    assert_eq!(rig.frontend.get_vring_base(1).expect("base"), 1);
    assert!(!rig.running());
    assert_eq!(rig.metrics().device_stops.get(), 1);

    // Nothing moves while stopped.
    rig.queues[1].push_tx(&[0u8; HDR + 4], &[]);
    rig.kicks[1].write(1).expect("kick");
    rig.peers[0]
        .set_timeout(Duration::from_millis(100))
        .expect("timeout");
    assert!(
        rig.peers[0].recv_frame().is_err(),
        "a stopped ring sends nothing"
    );
    rig.peers[0].set_timeout(TIMEOUT).expect("timeout");

    // Resume at the bases: the queued frame goes, the next rx frame fills buffer 2.
    rig.setup_ring(0, 1);
    rig.setup_ring(1, 1);
    assert!(rig.running(), "enabled rings run again at their new kick");
    assert_eq!(rig.peers[0].recv_frame().expect("frame").len(), HDR + 4);
    assert!(wait_until(TIMEOUT, || rig.queues[1].used_idx() == 2));
    rig.peers[0].send_frame(&frame).expect("send");
    assert!(wait_until(TIMEOUT, || rig.queues[0].used_idx() == 2));
    let (second, _) = rig.queues[0].used(1);
    assert_ne!(second, id, "the next buffer, not the one already filled");
    assert_eq!(rig.metrics().device_starts.get(), 2);

    let (end, backend, _) = rig.hang_up();
    assert!(matches!(end, ConnectionEnd::Disconnected), "{end:?}");
    let backend = lock(&backend);
    assert!(!backend.is_running(), "the device stops with its frontend");
    let m = backend.metrics();
    assert_eq!(
        (
            m.connections.get(),
            m.disconnects.get(),
            m.protocol_errors.get()
        ),
        (1, 1, 0)
    );
    assert_eq!(
        m.memory_regions.get(),
        0,
        "the frontend's memory is unmapped"
    );
}

#[test]
fn features_and_queue_num_describe_the_device_without_the_frontends_config_space() {
    let mut rig = Rig::new(2);
    let offered = rig.frontend.get_features().expect("features");
    let bit = |b: u32| 1u64 << b;
    assert_ne!(offered & bit(VIRTIO_NET_F_MQ), 0);
    assert_eq!(
        offered & (bit(VIRTIO_NET_F_MAC) | bit(VIRTIO_NET_F_STATUS)),
        0,
        "the frontend owns the configuration space"
    );
    rig.frontend
        .set_features(VERSION_1 | VHOST_USER_F_PROTOCOL_FEATURES)
        .expect("ack");
    rig.frontend
        .set_protocol_features(VhostUserProtocolFeatures::MQ)
        .expect("protocol");
    assert_eq!(rig.frontend.get_queue_num().expect("queue num"), 2, "pairs");
}

#[test]
fn mq_pairs_follow_set_vring_enable() {
    let mut rig = Rig::new(2);
    let mq = VERSION_1 | 1 << VIRTIO_NET_F_MQ;
    rig.negotiate(mq);
    rig.start(1);
    for i in 2..4 {
        rig.setup_ring(i, 0);
    }
    assert!(rig.running());
    assert_eq!(&rig.transmit(0, b"pair zero")[HDR..], b"pair zero");
    // Pair 1 is set up but disabled: its frames wait.
    rig.queues[3].push_tx(&[7u8; HDR + 3], &[]);
    rig.kicks[3].write(1).expect("kick");
    rig.peers[1]
        .set_timeout(Duration::from_millis(100))
        .expect("timeout");
    assert!(rig.peers[1].recv_frame().is_err(), "disabled pair idle");
    rig.peers[1].set_timeout(TIMEOUT).expect("timeout");
    let starts = rig.metrics().device_starts.get();
    rig.frontend.set_vring_enable(2, true).expect("enable");
    rig.frontend.set_vring_enable(3, true).expect("enable");
    assert_eq!(
        rig.peers[1].recv_frame().expect("pair 1 runs").len(),
        HDR + 3
    );
    assert_eq!(
        rig.metrics().device_starts.get(),
        starts,
        "enabling a pair does not restart the device"
    );
    // Disabling pair 0 stops the device.
    rig.frontend.set_vring_enable(0, false).expect("disable");
    assert!(!rig.running());
}

#[test]
fn memory_slots_are_idempotent_and_a_running_device_restarts_on_new_memory() {
    let mut rig = Rig::new(1);
    let f = &mut rig.frontend;
    f.set_owner().expect("owner");
    f.get_features().expect("features");
    f.set_features(VERSION_1 | VHOST_USER_F_PROTOCOL_FEATURES)
        .expect("features");
    f.get_protocol_features().expect("protocol features");
    f.set_protocol_features(
        VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS | VhostUserProtocolFeatures::REPLY_ACK,
    )
    .expect("protocol");
    f.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    assert_eq!(f.get_max_mem_slots().expect("slots"), MAX_REGIONS as u64);
    let region = rig.region();
    // QEMU sends the same region once per queue pair.
    rig.frontend.add_mem_region(&region).expect("add");
    rig.frontend.add_mem_region(&region).expect("again");
    assert_eq!(rig.metrics().memory_regions.get(), 1);
    rig.start(1);
    assert!(rig.running());
    assert_eq!(&rig.transmit(0, b"x")[HDR..], b"x");
    // A second region while running: stopped and started again, nothing lost.
    let extra = memfd(0x10_0000);
    let more = VhostUserMemoryRegionInfo {
        guest_phys_addr: 0x1000_0000,
        memory_size: 0x10_0000,
        userspace_addr: VA + 0x1000_0000,
        mmap_offset: 0,
        mmap_handle: extra.as_raw_fd(),
    };
    rig.frontend.add_mem_region(&more).expect("add");
    assert!(rig.running());
    assert_eq!(rig.metrics().device_starts.get(), 2);
    assert_eq!(&rig.transmit(0, b"y")[HDR..], b"y");
    rig.frontend.remove_mem_region(&more).expect("remove");
    assert_eq!(rig.metrics().memory_regions.get(), 1);
    assert_eq!(&rig.transmit(0, b"z")[HDR..], b"z");
    assert_eq!(rig.queues[1].used_idx(), 3);
}

/// Runs `hostile` against a fresh connection and checks that it ends it, is counted, and
/// leaves the backend serving the next frontend.
fn refused(pairs: usize, hostile: impl FnOnce(&mut Rig)) {
    let mut rig = Rig::new(pairs);
    hostile(&mut rig);
    let (end, backend, peers) = rig.hang_up();
    assert!(matches!(end, ConnectionEnd::Refused(_)), "{end:?}");
    assert_eq!(lock(&backend).metrics().protocol_errors.get(), 1);
    assert!(!lock(&backend).is_running());
    // The next frontend gets a working device.
    let (frontend, server) = connect(&backend);
    let mut next = Rig::new(pairs);
    next.frontend = frontend;
    next.server = Some(server);
    next.backend = backend;
    next.peers = peers;
    next.negotiate(VERSION_1);
    next.start(1);
    assert_eq!(&next.transmit(0, b"after")[HDR..], b"after");
}

#[test]
fn a_ring_index_out_of_range_is_refused() {
    refused(1, |rig| {
        rig.negotiate(VERSION_1);
        assert!(rig.frontend.set_vring_num(3, QUEUE_SIZE).is_err());
    });
}

#[test]
fn a_ring_size_that_is_not_a_power_of_two_or_too_big_is_refused() {
    refused(1, |rig| {
        rig.negotiate(VERSION_1);
        assert!(rig.frontend.set_vring_num(0, 12).is_err());
    });
    refused(1, |rig| {
        rig.negotiate(VERSION_1);
        assert!(rig.frontend.set_vring_num(0, 512).is_err());
    });
}

#[test]
fn features_that_were_not_offered_are_refused() {
    refused(1, |rig| {
        // No REPLY_ACK yet: the refusal shows as the connection's end.
        let _ = rig
            .frontend
            .set_features(VERSION_1 | VHOST_USER_F_PROTOCOL_FEATURES | 1 << 63);
    });
}

#[test]
fn a_ring_outside_the_memory_table_is_refused_when_the_device_would_start() {
    refused(1, |rig| {
        rig.negotiate(VERSION_1);
        rig.setup_ring(0, 0);
        let f = &mut rig.frontend;
        f.set_vring_num(1, QUEUE_SIZE).expect("num");
        f.set_vring_addr(
            1,
            &VringConfigData {
                queue_max_size: QUEUE_SIZE,
                queue_size: QUEUE_SIZE,
                flags: 0,
                // The used ring past the end of guest memory.
                desc_table_addr: VA,
                used_ring_addr: VA + MEM - 8,
                avail_ring_addr: VA + 0x1000,
                log_addr: None,
            },
        )
        .expect("addresses are kept until the device starts");
        f.set_vring_call(1, &rig.calls[1]).expect("call");
        f.set_vring_kick(1, &rig.kicks[1]).expect("kick");
        f.set_vring_enable(0, true).expect("enable");
        assert!(f.set_vring_enable(1, true).is_err(), "the device refused");
    });
}

#[test]
fn a_ring_address_in_no_region_is_refused() {
    refused(1, |rig| {
        rig.negotiate(VERSION_1);
        rig.setup_ring(0, 0);
        let f = &mut rig.frontend;
        f.set_vring_num(1, QUEUE_SIZE).expect("num");
        let config = VringConfigData {
            queue_max_size: QUEUE_SIZE,
            queue_size: QUEUE_SIZE,
            flags: 0,
            desc_table_addr: 0x1000, // a guest-physical address, not the frontend's
            used_ring_addr: VA + 0x2000,
            avail_ring_addr: VA + 0x3000,
            log_addr: None,
        };
        f.set_vring_addr(1, &config).expect("kept");
        f.set_vring_call(1, &rig.calls[1]).expect("call");
        f.set_vring_kick(1, &rig.kicks[1]).expect("kick");
        f.set_vring_enable(0, true).expect("enable");
        assert!(f.set_vring_enable(1, true).is_err());
    });
}

#[test]
fn a_memory_region_that_is_not_a_file_or_too_short_is_refused() {
    refused(1, |rig| {
        rig.frontend.set_owner().expect("owner");
        let (socket, _other) = UnixStream::pair().expect("pair");
        let mut region = rig.region();
        region.mmap_handle = socket.as_raw_fd();
        let _ = rig.frontend.set_mem_table(&[region]);
    });
    refused(1, |rig| {
        rig.frontend.set_owner().expect("owner");
        let mut region = rig.region();
        region.memory_size = MEM * 4;
        let _ = rig.frontend.set_mem_table(&[region]);
    });
}

#[test]
fn a_polled_ring_without_a_kick_fd_is_refused() {
    refused(1, |rig| {
        rig.negotiate(VERSION_1);
        // SET_VRING_KICK with the "no file descriptor" flag (bit 8), written by hand.
        let mut raw = Vec::new();
        raw.extend_from_slice(&12u32.to_le_bytes()); // SET_VRING_KICK
        raw.extend_from_slice(&1u32.to_le_bytes()); // version 1
        raw.extend_from_slice(&8u32.to_le_bytes());
        raw.extend_from_slice(&0x100u64.to_le_bytes());
        raw_send(rig, &raw);
    });
}

/// Writes `raw` on the frontend's socket behind its back.
fn raw_send(rig: &mut Rig, raw: &[u8]) {
    let fd = rig.frontend.as_raw_fd();
    // SAFETY: a borrowed view of the frontend's socket for one write; ManuallyDrop keeps the
    // descriptor open.
    let mut socket = std::mem::ManuallyDrop::new(unsafe { UnixStream::from_raw_fd(fd) });
    socket.write_all(raw).expect("write");
}

#[test]
fn a_message_with_a_payload_of_the_wrong_size_is_refused() {
    refused(1, |rig| {
        // SET_VRING_NUM claiming a 4-byte payload (it is 8).
        let mut raw = Vec::new();
        raw.extend_from_slice(&8u32.to_le_bytes());
        raw.extend_from_slice(&1u32.to_le_bytes());
        raw.extend_from_slice(&4u32.to_le_bytes());
        raw.extend_from_slice(&16u32.to_le_bytes());
        raw_send(rig, &raw);
    });
}

#[test]
fn a_frontend_that_vanishes_mid_message_only_ends_its_connection() {
    let rig = Rig::new(1);
    let fd = rig.frontend.as_raw_fd();
    // SAFETY: as in `raw_send`.
    let mut socket = std::mem::ManuallyDrop::new(unsafe { UnixStream::from_raw_fd(fd) });
    socket
        .write_all(&8u32.to_le_bytes())
        .expect("half a header");
    let (end, backend, _) = rig.hang_up();
    assert!(matches!(end, ConnectionEnd::Disconnected), "{end:?}");
    assert_eq!(lock(&backend).metrics().disconnects.get(), 1);
}

#[test]
fn split_and_packed_bases_round_trip() {
    let p = |offset, wrap| Position { offset, wrap };
    let split = RingPosition::Split {
        next_avail: 0xfffe,
        next_used: 0xfffe,
    };
    assert_eq!(encode_base(split), 0xfffe);
    assert_eq!(decode_base(0xfffe, false, || 0xfffe), split);
    let packed = RingPosition::Packed {
        next_avail: p(5, false),
        next_used: p(3, true),
    };
    let base = encode_base(packed);
    assert_eq!(base, 5 | (3 | 0x8000) << 16);
    assert_eq!(decode_base(base, true, || unreachable!()), packed);
    // DPDK's form: the avail half only; the used position is the avail one.
    assert_eq!(
        decode_base(0x8000, true, || unreachable!()),
        RingPosition::start(true)
    );
}

/// A raw SET_VRING_ENABLE(`index`, `num`).
fn raw_enable(rig: &mut Rig, index: u32, num: u32) {
    let mut raw = Vec::new();
    raw.extend_from_slice(&18u32.to_le_bytes());
    raw.extend_from_slice(&1u32.to_le_bytes());
    raw.extend_from_slice(&8u32.to_le_bytes());
    raw.extend_from_slice(&index.to_le_bytes());
    raw.extend_from_slice(&num.to_le_bytes());
    raw_send(rig, &raw);
}

#[test]
fn qemus_enable_before_set_features_is_kept() {
    // QEMU 7.2 restores each ring's enable state before SET_FEATURES; the rings must run
    // once the rest is set up, with no enable after the features.
    let mut rig = Rig::new(1);
    rig.frontend.set_owner().expect("owner");
    rig.frontend.get_features().expect("features");
    raw_enable(&mut rig, 0, 1);
    raw_enable(&mut rig, 1, 1);
    rig.negotiate(VERSION_1);
    rig.setup_ring(0, 0);
    rig.setup_ring(1, 0);
    assert!(
        rig.running(),
        "enabled before the features, running once set up"
    );
    assert_eq!(&rig.transmit(0, b"early")[HDR..], b"early");
    // An enable value other than 0 or 1 before the features is refused like any other.
    let (end, ..) = rig.hang_up();
    assert!(matches!(end, ConnectionEnd::Disconnected), "{end:?}");
    refused(1, |rig| raw_enable(rig, 0, 7));
    refused(1, |rig| raw_enable(rig, 9, 1));
}

#[test]
fn a_ring_address_before_the_memory_table_is_refused() {
    refused(1, |rig| {
        rig.frontend.set_owner().expect("owner");
        rig.frontend.get_features().expect("features");
        rig.frontend
            .set_features(VERSION_1 | VHOST_USER_F_PROTOCOL_FEATURES)
            .expect("features");
        let (desc, avail, used) = rig.queues[0].ring_addrs();
        let _ = rig.frontend.set_vring_addr(
            0,
            &VringConfigData {
                queue_max_size: QUEUE_SIZE,
                queue_size: QUEUE_SIZE,
                flags: 0,
                desc_table_addr: VA + desc,
                used_ring_addr: VA + used,
                avail_ring_addr: VA + avail,
                log_addr: None,
            },
        );
    });
}

#[test]
fn a_kick_before_the_ring_is_refused() {
    refused(1, |rig| {
        rig.negotiate(VERSION_1);
        rig.frontend.set_vring_num(0, QUEUE_SIZE).expect("num");
        assert!(rig.frontend.set_vring_kick(0, &rig.kicks[0]).is_err());
    });
}

#[test]
fn a_memory_region_at_an_offset_mmap_cannot_take_is_refused() {
    refused(1, |rig| {
        rig.frontend.set_owner().expect("owner");
        let mut region = rig.region();
        region.mmap_offset = 0x10;
        region.memory_size = MEM / 2;
        let _ = rig.frontend.set_mem_table(&[region]);
    });
}
