//! The control queue end to end through the worker: every command's OK path (NOTF_COAL
//! changing the interrupts frames get, VQ_GET answering what VQ_SET set, RX mode, MAC table,
//! MAC address, guest offloads), every malformed command acked ERR (or, without an ack byte,
//! returned unacked) and counted while the worker keeps running, the operator's knob and the
//! guest's NOTF_COAL on the same coalescing (the last one set wins), and reset.

use std::time::Duration;

use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_CONFIG_GENERATION, VIRTIO_MMIO_STATUS};
use virtio_bindings::virtio_net::*;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::driver::{rig_for, send_frame, DriverRing};
use super::support::{frame, guest_mem, wire, GuestQueue, INDIRECT, NEXT, WRITE};
use super::worker::{
    kick, no_interrupt, queues, reaches, rig, send_one, take_interrupt, Rig, TIMEOUT, VERSION_1,
};
use crate::backend::Offloads;
use crate::test_utils::mmio::{wait_until, Registers};
use crate::test_utils::packed::GuestPackedQueue;
use crate::virtio::net::ctrl::{ACK_ERR, ACK_OK, CTRL_QUEUE_SIZE};
use crate::virtio::net::{
    CoalescingSource, InterruptCoalescing, NetTuning, NetTuningUpdate, CTRL_QUEUE, RX_QUEUE,
    TX_QUEUE,
};
use crate::virtio::MmioTransport;
use crate::BusDevice;

const fn bit(feature: u32) -> u64 {
    1 << feature
}

const CTRL: u64 = VERSION_1 | bit(VIRTIO_NET_F_CTRL_VQ);
const ALL: u64 = CTRL
    | bit(VIRTIO_NET_F_CTRL_RX)
    | bit(VIRTIO_NET_F_CTRL_MAC_ADDR)
    | bit(VIRTIO_NET_F_NOTF_COAL)
    | bit(VIRTIO_NET_F_VQ_NOTF_COAL);

const NOTF_COAL: u8 = VIRTIO_NET_CTRL_NOTF_COAL as u8;
const TX_SET: u8 = VIRTIO_NET_CTRL_NOTF_COAL_TX_SET as u8;
const RX_SET: u8 = VIRTIO_NET_CTRL_NOTF_COAL_RX_SET as u8;
const VQ_SET: u8 = VIRTIO_NET_CTRL_NOTF_COAL_VQ_SET as u8;
const VQ_GET: u8 = VIRTIO_NET_CTRL_NOTF_COAL_VQ_GET as u8;

fn ctrl_queue(mem: &GuestMemoryMmap) -> GuestQueue {
    ctrl_ring(mem)
}

/// The control queue's ring, of either kind.
fn ctrl_ring<Q: DriverRing>(mem: &GuestMemoryMmap) -> Q {
    Q::at(mem, 0x2_0000, CTRL_QUEUE_SIZE, 0x70_0000)
}

/// Negotiates `features` (and `Q`'s ring kind), programs the three queues and sets
/// DRIVER_OK.
fn start_ctrl<Q: DriverRing>(t: &mut MmioTransport, features: u64, rx: &Q, tx: &Q, ctrl: &Q) {
    assert!(
        t.negotiate(features | Q::RING_FEATURES),
        "FEATURES_OK accepted"
    );
    rx.program(t, RX_QUEUE as u32);
    tx.program(t, TX_QUEUE as u32);
    ctrl.program(t, CTRL_QUEUE as u32);
    t.driver_ok();
    assert_eq!(t.status() & 0xff, 0xf, "running, not NEEDS_RESET");
}

/// A [`rig_for`] `Q` on `mem` with its rx and tx queues ([`DriverRing::pair`]) and its control
/// queue ([`ctrl_ring`]) started with `features`.
fn started_ctrl<Q: DriverRing>(mem: &GuestMemoryMmap, features: u64) -> (Rig, Q, Q, Q) {
    let mut rig = rig_for::<Q>(mem, |_| {});
    let (rx, tx) = Q::pair(mem);
    let ctrl = ctrl_ring::<Q>(mem);
    start_ctrl(&mut rig.transport, features, &rx, &tx, &ctrl);
    (rig, rx, tx, ctrl)
}

/// What came back for a command.
#[derive(Debug, PartialEq, Eq)]
struct Reply {
    /// The used length.
    len: u32,
    /// The writable bytes after the device was done (0xAA where it wrote nothing).
    written: Vec<u8>,
}

impl Reply {
    fn ack(&self) -> Option<u8> {
        // The ack is the first writable byte, the result follows.
        (self.len > 0).then(|| *self.written.first().expect("ack byte"))
    }
}

/// Makes a chain of buffers (bytes, flags) available and kicks the control queue; returns
/// what the device wrote once it returned the chain.
fn send_raw<Q: DriverRing>(rig: &Rig, q: &mut Q, bufs: &[(Vec<u8>, u16)]) -> Reply {
    let mut writable = Vec::new();
    let descs: Vec<_> = bufs
        .iter()
        .map(|(bytes, flags)| {
            let addr = q.put(bytes);
            if flags & WRITE != 0 {
                writable.push((addr, bytes.len()));
            }
            (addr, bytes.len() as u32, *flags)
        })
        .collect();
    q.skip_used();
    let id = q.offer(&descs);
    kick(&rig.transport, CTRL_QUEUE);
    let (used_id, len) = q.wait_used();
    assert_eq!(used_id, u32::from(id), "the control chain came back");
    let written = writable
        .iter()
        .flat_map(|&(addr, n)| q.peek(addr, n))
        .collect();
    Reply { len, written }
}

/// Sends `class.command` with `data` and `writable` bytes for the reply and ack.
fn send<Q: DriverRing>(
    rig: &Rig,
    q: &mut Q,
    class: u8,
    command: u8,
    data: &[u8],
    writable: usize,
) -> Reply {
    let mut readable = vec![class, command];
    readable.extend_from_slice(data);
    send_raw(rig, q, &[(readable, 0), (vec![0xAA; writable], WRITE)])
}

fn coal(max_packets: u32, max_usecs: u32) -> Vec<u8> {
    let mut data = max_packets.to_le_bytes().to_vec();
    data.extend_from_slice(&max_usecs.to_le_bytes());
    data
}

fn vq_coal(vqn: u16, max_packets: u32, max_usecs: u32) -> Vec<u8> {
    let mut data = vqn.to_le_bytes().to_vec();
    data.extend_from_slice(&[0, 0]);
    data.extend_from_slice(&coal(max_packets, max_usecs));
    data
}

fn vq_get<Q: DriverRing>(rig: &Rig, q: &mut Q, vqn: u16) -> (u32, u32) {
    let mut data = vqn.to_le_bytes().to_vec();
    data.extend_from_slice(&[0, 0]);
    let reply = send(rig, q, NOTF_COAL, VQ_GET, &data, 9);
    assert_eq!(reply.ack(), Some(ACK_OK), "{reply:?}");
    assert_eq!(reply.len, 9);
    let w = &reply.written[1..];
    (
        u32::from_le_bytes(w[..4].try_into().expect("4 bytes")),
        u32::from_le_bytes(w[4..8].try_into().expect("4 bytes")),
    )
}

#[test]
fn the_control_features_are_offered_and_need_ctrl_vq() {
    let mem = guest_mem();
    let mut rig = rig(&mem);
    let offered = rig.transport.device().features();
    for feature in [
        VIRTIO_NET_F_CTRL_VQ,
        VIRTIO_NET_F_CTRL_RX,
        VIRTIO_NET_F_CTRL_MAC_ADDR,
        VIRTIO_NET_F_NOTF_COAL,
        VIRTIO_NET_F_VQ_NOTF_COAL,
    ] {
        assert_ne!(offered & bit(feature), 0, "feature {feature} offered");
    }
    assert_eq!(offered & bit(VIRTIO_NET_F_MQ), 0, "no multiqueue");
    // The pair backend offers checksum offloads, so GUEST_OFFLOADS can be changed.
    assert_ne!(offered & bit(VIRTIO_NET_F_CTRL_GUEST_OFFLOADS), 0);
    assert_eq!(
        rig.transport.device().queue_max_sizes(),
        &[256, 256, CTRL_QUEUE_SIZE]
    );
    for feature in [
        VIRTIO_NET_F_CTRL_RX,
        VIRTIO_NET_F_NOTF_COAL,
        VIRTIO_NET_F_VQ_NOTF_COAL,
    ] {
        assert!(
            !rig.transport.negotiate(VERSION_1 | bit(feature)),
            "feature {feature} without CTRL_VQ refused"
        );
    }
    // Without CTRL_VQ the driver sets up two queues only (the existing tests run so too).
    let (rx, tx) = queues(&mem);
    assert!(rig.transport.negotiate(VERSION_1));
    rig.transport.setup_queue(0, 256, rx.ring_addrs());
    rig.transport.setup_queue(1, 256, tx.ring_addrs());
    rig.transport.driver_ok();
    assert_eq!(rig.transport.status() & 0xff, 0xf);
    // With CTRL_VQ, the control queue must be there.
    assert!(rig.transport.negotiate(CTRL));
    rig.transport.setup_queue(0, 256, rx.ring_addrs());
    rig.transport.setup_queue(1, 256, tx.ring_addrs());
    rig.transport.driver_ok();
    assert_ne!(
        rig.transport.status() & virtio_bindings::virtio_config::VIRTIO_CONFIG_S_NEEDS_RESET,
        0,
        "DRIVER_OK without the control queue it negotiated"
    );
}

#[test]
fn notf_coal_tx_set_holds_tx_interrupts_until_max_packets() {
    guest_set_tx_coalescing::<GuestQueue>(false);
}

#[test]
fn notf_coal_vq_set_holds_tx_interrupts_on_a_packed_ring() {
    guest_set_tx_coalescing::<GuestPackedQueue>(true);
}

/// The guest's tx coalescing, set with TX_SET or (`per_queue`) VQ_SET on queue 1.
fn guest_set_tx_coalescing<Q: DriverRing>(per_queue: bool) {
    let mem = guest_mem();
    let (mut rig, _rx, mut tx, mut ctrl) = started_ctrl::<Q>(&mem, ALL);
    let set = |max_packets, max_usecs| {
        if per_queue {
            (VQ_SET, vq_coal(1, max_packets, max_usecs))
        } else {
            (TX_SET, coal(max_packets, max_usecs))
        }
    };

    let (command, data) = set(4, 1_000_000);
    let reply = send(&rig, &mut ctrl, NOTF_COAL, command, &data, 1);
    assert_eq!(
        reply,
        Reply {
            len: 1,
            written: vec![ACK_OK]
        }
    );
    take_interrupt(&mut rig.transport); // the command's completion
    let in_force = rig.tuning.coalescing_in_force();
    assert_eq!(in_force.tx.source, CoalescingSource::Guest);
    assert_eq!(
        (in_force.tx.max_packets, in_force.tx.max_usecs),
        (4, 1_000_000)
    );
    assert_eq!(in_force.rx.source, CoalescingSource::Operator);

    for seed in 0..3 {
        send_frame(&rig, &mut tx, seed);
    }
    assert!(no_interrupt(&rig.transport), "held: 3 of 4 tx frames");
    send_frame(&rig, &mut tx, 3);
    take_interrupt(&mut rig.transport);
    assert!(reaches(&rig.metrics.coalesce_packet_releases, 1));
    assert_eq!(rig.metrics.ctrl.coalescing_sets.get(), 1);
    assert_eq!(rig.metrics.ctrl.ok.get(), 1);
    assert_eq!(rig.metrics.ctrl.errors.get(), 0);

    // Linux turns it off with 0/0: every frame interrupts again.
    let (command, data) = set(0, 0);
    let reply = send(&rig, &mut ctrl, NOTF_COAL, command, &data, 1);
    assert_eq!(reply.ack(), Some(ACK_OK));
    take_interrupt(&mut rig.transport);
    send_frame(&rig, &mut tx, 9);
    take_interrupt(&mut rig.transport);
}

#[test]
fn vq_get_returns_what_vq_set_set_and_the_operators_otherwise() {
    let mem = guest_mem();
    let mut rig = rig(&mem);
    rig.tuning
        .update(&NetTuningUpdate {
            interrupt_coalescing: Some(InterruptCoalescing {
                max_packets: 16,
                max_usecs: 200,
            }),
            ..NetTuningUpdate::default()
        })
        .expect("valid");
    let (rx, tx) = queues(&mem);
    let mut ctrl = ctrl_queue(&mem);
    start_ctrl(&mut rig.transport, ALL, &rx, &tx, &ctrl);
    assert_eq!(vq_get(&rig, &mut ctrl, 0), (16, 200), "the operator's");
    let reply = send(&rig, &mut ctrl, NOTF_COAL, VQ_SET, &vq_coal(0, 8, 500), 1);
    assert_eq!(reply.ack(), Some(ACK_OK));
    assert_eq!(vq_get(&rig, &mut ctrl, 0), (8, 500));
    assert_eq!(
        vq_get(&rig, &mut ctrl, 1),
        (16, 200),
        "tx keeps the operator's"
    );
    let reply = send(&rig, &mut ctrl, NOTF_COAL, RX_SET, &coal(32, 50), 1);
    assert_eq!(reply.ack(), Some(ACK_OK));
    assert_eq!(vq_get(&rig, &mut ctrl, 0), (32, 50), "RX_SET is queue 0's");
    assert!(reaches(&rig.metrics.ctrl.coalescing_gets, 4));
    let in_force = rig.tuning.coalescing_in_force();
    assert_eq!(in_force.rx.source, CoalescingSource::Guest);
    assert_eq!((in_force.rx.max_packets, in_force.rx.max_usecs), (32, 50));
}

#[test]
fn the_last_one_set_wins_and_a_reset_forgets_the_guests() {
    let mem = guest_mem();
    let (mut rig, _rx, _tx, mut ctrl) = started_ctrl::<GuestQueue>(&mem, ALL);
    let operator = |packets, usecs| NetTuningUpdate {
        interrupt_coalescing: Some(InterruptCoalescing {
            max_packets: packets,
            max_usecs: usecs,
        }),
        ..NetTuningUpdate::default()
    };
    assert_eq!(
        send(&rig, &mut ctrl, NOTF_COAL, TX_SET, &coal(8, 100), 1).ack(),
        Some(ACK_OK)
    );
    assert_eq!(vq_get(&rig, &mut ctrl, 1), (8, 100));
    // The operator sets it afterwards: theirs, in both directions.
    rig.tuning.update(&operator(2, 300)).expect("valid");
    assert!(wait_until(TIMEOUT, || rig
        .tuning
        .coalescing_in_force()
        .tx
        .source
        == CoalescingSource::Operator));
    assert_eq!(vq_get(&rig, &mut ctrl, 1), (2, 300));
    // A PATCH of another knob does not take it back from the guest.
    assert_eq!(
        send(&rig, &mut ctrl, NOTF_COAL, TX_SET, &coal(8, 100), 1).ack(),
        Some(ACK_OK)
    );
    rig.tuning
        .update(&NetTuningUpdate {
            tx_budget: Some(64),
            ..NetTuningUpdate::default()
        })
        .expect("valid");
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(vq_get(&rig, &mut ctrl, 1), (8, 100));
    assert_eq!(
        rig.tuning.coalescing_in_force().tx.source,
        CoalescingSource::Guest
    );
    // A device reset: the operator's again.
    rig.transport.w32(VIRTIO_MMIO_STATUS, 0);
    let in_force = rig.tuning.coalescing_in_force();
    assert_eq!(in_force.tx.source, CoalescingSource::Operator);
    assert_eq!((in_force.tx.max_packets, in_force.tx.max_usecs), (2, 300));
    let (rx2, tx2) = (
        GuestQueue::at(&mem, GuestAddress(0x3_0000), 256, 0x50_0000),
        GuestQueue::at(&mem, GuestAddress(0x4_0000), 256, 0x60_0000),
    );
    let mut ctrl2 = GuestQueue::at(&mem, GuestAddress(0x5_0000), CTRL_QUEUE_SIZE, 0x78_0000);
    start_ctrl(&mut rig.transport, ALL, &rx2, &tx2, &ctrl2);
    assert_eq!(vq_get(&rig, &mut ctrl2, 1), (2, 300));
}

#[test]
fn malformed_commands_are_refused_counted_and_the_worker_keeps_running() {
    let mem = guest_mem();
    // NOTF_COAL but not VQ_NOTF_COAL nor CTRL_MAC_ADDR.
    let features = CTRL | bit(VIRTIO_NET_F_NOTF_COAL) | bit(VIRTIO_NET_F_CTRL_RX);
    let (rig, _rx, mut tx, mut ctrl) = started_ctrl::<GuestQueue>(&mem, features);
    let rx_class = VIRTIO_NET_CTRL_RX as u8;
    let mac_class = VIRTIO_NET_CTRL_MAC as u8;
    let cases: Vec<(&str, Vec<u8>, usize)> = vec![
        ("unknown class", vec![9, 0], 1),
        ("unknown command", vec![NOTF_COAL, 7], 1),
        (
            "TX_SET data too short",
            [vec![NOTF_COAL, TX_SET], coal(4, 100)[..7].to_vec()].concat(),
            1,
        ),
        (
            "TX_SET data too long",
            [vec![NOTF_COAL, TX_SET], coal(4, 100), vec![0]].concat(),
            1,
        ),
        (
            "TX_SET with reply space",
            [vec![NOTF_COAL, TX_SET], coal(4, 100)].concat(),
            9,
        ),
        (
            "usecs above the maximum",
            [vec![NOTF_COAL, RX_SET], coal(4, 1_000_001)].concat(),
            1,
        ),
        (
            "max_packets above 65535",
            [vec![NOTF_COAL, TX_SET], coal(65_536, 100)].concat(),
            1,
        ),
        (
            "a packet bound without a time bound",
            [vec![NOTF_COAL, TX_SET], coal(8, 0)].concat(),
            1,
        ),
        (
            "VQ_SET not negotiated",
            [vec![NOTF_COAL, VQ_SET], vq_coal(0, 4, 100)].concat(),
            1,
        ),
        (
            "MAC ADDR_SET not negotiated",
            vec![mac_class, 1, 2, 0, 0, 0, 0, 9],
            1,
        ),
        (
            "RX ALLUNI (CTRL_RX_EXTRA) not negotiated",
            vec![rx_class, 2, 1],
            1,
        ),
        ("promisc 2", vec![rx_class, 0, 2], 1),
        (
            "MAC table shorter than its entries",
            [vec![mac_class, 0], 2u32.to_le_bytes().to_vec(), vec![0; 6]].concat(),
            1,
        ),
        (
            "MAC table entries overflowing",
            [vec![mac_class, 0], u32::MAX.to_le_bytes().to_vec()].concat(),
            1,
        ),
    ];
    for (i, (what, readable, writable)) in cases.iter().enumerate() {
        let reply = send_raw(
            &rig,
            &mut ctrl,
            &[(readable.clone(), 0), (vec![0xAA; *writable], WRITE)],
        );
        assert_eq!(reply.len, *writable as u32, "{what}");
        assert_eq!(reply.ack(), Some(ACK_ERR), "{what}: {reply:?}");
        assert!(
            reply.written[1..].iter().all(|&b| b == 0xAA),
            "{what}: no reply written"
        );
        assert!(wait_until(TIMEOUT, || rig.metrics.ctrl.errors.get() == i as u64 + 1));
    }
    let c = &rig.metrics.ctrl;
    assert_eq!(c.unsupported.get(), 2);
    assert_eq!(c.bad_length.get(), 5);
    assert_eq!(c.out_of_range.get(), 4);
    assert_eq!(c.not_negotiated.get(), 3);

    // A short header: one byte.
    let reply = send_raw(
        &rig,
        &mut ctrl,
        &[(vec![NOTF_COAL], 0), (vec![0xAA], WRITE)],
    );
    assert_eq!(reply.ack(), Some(ACK_ERR));
    assert!(wait_until(TIMEOUT, || c.bad_length.get() == 6));
    // No writable byte at all, or the "ack" descriptor read-only: cannot be acked.
    let unacked: [&[(Vec<u8>, u16)]; 2] = [
        &[([vec![NOTF_COAL, TX_SET], coal(4, 100)].concat(), 0)],
        &[
            (vec![NOTF_COAL, TX_SET], 0),
            (coal(4, 100), 0),
            (vec![0xAA], 0),
        ],
    ];
    for chain in unacked {
        let reply = send_raw(&rig, &mut ctrl, chain);
        assert_eq!(reply.len, 0);
    }
    assert!(wait_until(TIMEOUT, || c.no_ack.get() == 2));
    // A readable buffer after the writable one: the ring walk refuses the chain.
    let reply = send_raw(
        &rig,
        &mut ctrl,
        &[
            (vec![NOTF_COAL, TX_SET], 0),
            (vec![0xAA], WRITE),
            (coal(4, 100), 0),
        ],
    );
    assert_eq!(
        reply,
        Reply {
            len: 0,
            written: vec![0xAA]
        }
    );
    assert!(wait_until(TIMEOUT, || c.malformed_chains.get() == 1));
    assert_eq!(c.ok.get(), 0);
    assert_eq!(rig.metrics.coalesce_packet_releases.get(), 0);
    assert_eq!(
        rig.tuning.coalescing_in_force().tx.source,
        CoalescingSource::Operator,
        "nothing refused took effect"
    );

    // Still running: a good command, and frames.
    assert_eq!(
        send(&rig, &mut ctrl, NOTF_COAL, TX_SET, &coal(2, 100_000), 1).ack(),
        Some(ACK_OK)
    );
    send_one(&rig, &mut tx, 1);
    send_one(&rig, &mut tx, 2);
    assert!(reaches(&rig.metrics.coalesce_packet_releases, 1));
    assert_eq!(rig.metrics.needs_reset_events.get(), 0);
    assert!(wait_until(TIMEOUT, || c.commands.get() == 19));
}

#[test]
fn rx_mode_mac_table_mac_address_and_guest_offloads() {
    let mem = guest_mem();
    let features = ALL | bit(VIRTIO_NET_F_GUEST_CSUM) | bit(VIRTIO_NET_F_CTRL_GUEST_OFFLOADS);
    let (mut rig, _rx, _tx, mut ctrl) = started_ctrl::<GuestQueue>(&mem, features);
    let rx_class = VIRTIO_NET_CTRL_RX as u8;
    let mac_class = VIRTIO_NET_CTRL_MAC as u8;
    let offloads_class = VIRTIO_NET_CTRL_GUEST_OFFLOADS as u8;
    assert_eq!(rig.peer.offloads(), Offloads::CSUM);

    for (cmd, on) in [(0u8, 1u8), (1, 1), (0, 0)] {
        assert_eq!(
            send(&rig, &mut ctrl, rx_class, cmd, &[on], 1).ack(),
            Some(ACK_OK)
        );
    }
    let table = [
        1u32.to_le_bytes().to_vec(),
        vec![2, 0, 0, 0, 0, 7],
        2u32.to_le_bytes().to_vec(),
        vec![1, 0, 0x5e, 0, 0, 1, 0x33, 0x33, 0, 0, 0, 1],
    ]
    .concat();
    assert_eq!(
        send(&rig, &mut ctrl, mac_class, 0, &table, 1).ack(),
        Some(ACK_OK)
    );
    let empty = [0u32.to_le_bytes(), 0u32.to_le_bytes()].concat();
    assert_eq!(
        send(&rig, &mut ctrl, mac_class, 0, &empty, 1).ack(),
        Some(ACK_OK)
    );

    // ADDR_SET: config space reads the new address; the generation moves.
    let generation = rig.transport.r32(VIRTIO_MMIO_CONFIG_GENERATION);
    let new_mac = [2, 0x11, 0x22, 0x33, 0x44, 0x55];
    assert_eq!(
        send(&rig, &mut ctrl, mac_class, 1, &new_mac, 1).ack(),
        Some(ACK_OK)
    );
    let mut config = [0u8; 6];
    rig.transport.read(0x100, &mut config);
    assert_eq!(config, new_mac);
    assert_ne!(rig.transport.r32(VIRTIO_MMIO_CONFIG_GENERATION), generation);
    for bad in [[3u8, 0, 0, 0, 0, 1], [0; 6]] {
        assert_eq!(
            send(&rig, &mut ctrl, mac_class, 1, &bad, 1).ack(),
            Some(ACK_ERR),
            "{bad:?}"
        );
    }

    // GUEST_OFFLOADS_SET: the tap's offloads follow; an offload not negotiated is refused.
    let off = 0u64.to_le_bytes();
    assert_eq!(
        send(&rig, &mut ctrl, offloads_class, 0, &off, 1).ack(),
        Some(ACK_OK)
    );
    assert_eq!(rig.peer.offloads(), Offloads::NONE);
    let csum = bit(VIRTIO_NET_F_GUEST_CSUM).to_le_bytes();
    assert_eq!(
        send(&rig, &mut ctrl, offloads_class, 0, &csum, 1).ack(),
        Some(ACK_OK)
    );
    assert_eq!(rig.peer.offloads(), Offloads::CSUM);
    let tso = (bit(VIRTIO_NET_F_GUEST_CSUM) | bit(VIRTIO_NET_F_GUEST_TSO4)).to_le_bytes();
    assert_eq!(
        send(&rig, &mut ctrl, offloads_class, 0, &tso, 1).ack(),
        Some(ACK_ERR)
    );
    assert_eq!(rig.peer.offloads(), Offloads::CSUM, "unchanged");

    let c = &rig.metrics.ctrl;
    assert!(wait_until(TIMEOUT, || c.commands.get() == 11));
    assert_eq!(c.rx_mode_sets.get(), 3);
    assert_eq!(c.mac_table_sets.get(), 2);
    assert_eq!(c.mac_addr_sets.get(), 1);
    assert_eq!(c.offloads_sets.get(), 2);
    assert_eq!(c.ok.get(), 8);
    assert_eq!(c.out_of_range.get(), 3);

    // A reset restores the configured MAC.
    rig.transport.w32(VIRTIO_MMIO_STATUS, 0);
    rig.transport.read(0x100, &mut config);
    assert_eq!(config, [2, 0, 0, 0, 0, 1]);
}

#[test]
fn a_full_control_ring_is_handled_in_bounded_rounds_from_one_kick() {
    let mem = guest_mem();
    let (rig, _rx, _tx, mut ctrl) = started_ctrl::<GuestQueue>(&mem, ALL);
    let n = CTRL_QUEUE_SIZE / 2; // two descriptors each
    assert!(usize::from(n) > crate::virtio::net::ctrl::CTRL_CHAINS_PER_CALL);
    let mut acks = Vec::new();
    let mut heads = Vec::new();
    for i in 0..n {
        let readable = ctrl.alloc(&[vec![NOTF_COAL, RX_SET], coal(u32::from(i) + 2, 100)].concat());
        let ack = ctrl.alloc(&[0xAA]);
        let first = ctrl.next_slot();
        let descs = [
            (readable, 10, NEXT, (first + 1) % CTRL_QUEUE_SIZE),
            (ack, 1, WRITE, 0),
        ];
        heads.push(ctrl.write_descs(&descs)[0]);
        acks.push(ack);
    }
    ctrl.publish_all(heads);
    kick(&rig.transport, CTRL_QUEUE);
    assert!(wait_until(TIMEOUT, || ctrl.used_idx() == n));
    for ack in acks {
        assert_eq!(ctrl.read(ack, 1), [ACK_OK]);
    }
    assert!(wait_until(TIMEOUT, || rig.metrics.ctrl.ok.get() == u64::from(n)));
    assert_eq!(rig.metrics.ctrl.kicks.get(), 1);
    assert_eq!(
        vq_get(&rig, &mut ctrl, 0),
        (u32::from(n) + 1, 100),
        "the last one set"
    );
}

#[test]
fn a_command_in_an_indirect_table_is_handled() {
    let mem = guest_mem();
    let features = ALL | bit(virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC);
    let (rig, _rx, _tx, mut ctrl) = started_ctrl::<GuestQueue>(&mem, features);
    // Linux puts a command's buffers in an indirect table when INDIRECT_DESC is negotiated.
    let header = ctrl.alloc(&[NOTF_COAL, VQ_SET]);
    let data = ctrl.alloc(&vq_coal(1, 6, 700));
    let ack = ctrl.alloc(&[0xAA]);
    let mut table = Vec::new();
    for (addr, len, flags, next) in [
        (header, 2u32, NEXT, 1u16),
        (data, 12, NEXT, 2),
        (ack, 1, WRITE, 0),
    ] {
        table.extend_from_slice(&addr.to_le_bytes());
        table.extend_from_slice(&len.to_le_bytes());
        table.extend_from_slice(&flags.to_le_bytes());
        table.extend_from_slice(&next.to_le_bytes());
    }
    let table_addr = ctrl.alloc(&table);
    let head = ctrl.write_descs(&[(table_addr, table.len() as u32, INDIRECT, 0)])[0];
    ctrl.publish(head);
    kick(&rig.transport, CTRL_QUEUE);
    assert!(wait_until(TIMEOUT, || ctrl.used_idx() == 1));
    assert_eq!(ctrl.used(0), (u32::from(head), 1));
    assert_eq!(ctrl.read(ack, 1), [ACK_OK]);
    assert_eq!(vq_get(&rig, &mut ctrl, 1), (6, 700));
}

mod device_stats {
    use super::*;
    use crate::virtio::net::stats::{
        SUPPORTED, TYPE_CVQ, TYPE_RX_BASIC, TYPE_RX_SPEED, TYPE_TX_BASIC, TYPE_TX_SPEED,
        VIRTIO_NET_CTRL_STATS, VIRTIO_NET_CTRL_STATS_GET, VIRTIO_NET_CTRL_STATS_QUERY,
        VIRTIO_NET_F_DEVICE_STATS,
    };
    use crate::virtio::net::{BucketConfig, RateLimiterConfig};

    const STATS: u64 = ALL | bit(VIRTIO_NET_F_DEVICE_STATS);

    fn get_data(requests: &[(u16, u64)]) -> Vec<u8> {
        let mut data = Vec::new();
        for &(vq, types) in requests {
            data.extend_from_slice(&vq.to_le_bytes());
            data.extend_from_slice(&[0; 6]);
            data.extend_from_slice(&types.to_le_bytes());
        }
        data
    }

    /// One reply block: (type, vq, counters).
    fn blocks(reply: &[u8]) -> Vec<(u8, u16, Vec<u64>)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < reply.len() {
            let size = usize::from(u16::from_le_bytes([reply[at + 6], reply[at + 7]]));
            assert!(size >= 8 && at + size <= reply.len(), "block size {size}");
            let counters = reply[at + 8..at + size]
                .chunks(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect();
            let vq = u16::from_le_bytes([reply[at + 2], reply[at + 3]]);
            out.push((reply[at], vq, counters));
            at += size;
        }
        out
    }

    #[test]
    fn offered_and_needs_ctrl_vq() {
        let mem = guest_mem();
        let mut rig = rig(&mem);
        let offered = rig.transport.device().features();
        assert_ne!(offered & bit(VIRTIO_NET_F_DEVICE_STATS), 0);
        assert!(
            !rig.transport
                .negotiate(VERSION_1 | bit(VIRTIO_NET_F_DEVICE_STATS)),
            "DEVICE_STATS without CTRL_VQ refused"
        );
    }

    #[test]
    fn query_and_get_answer_what_the_metrics_say() {
        query_and_get::<GuestQueue>();
    }

    #[test]
    fn query_and_get_answer_what_the_metrics_say_on_packed_rings() {
        query_and_get::<GuestPackedQueue>();
    }

    fn query_and_get<Q: DriverRing>() {
        let mem = guest_mem();
        let (rig, mut rx, mut tx, mut ctrl) = started_ctrl::<Q>(&mem, STATS);
        for seed in 0..3 {
            send_frame(&rig, &mut tx, seed);
        }
        // And two frames in.
        for seed in 0..2 {
            rx.offer_rx(&[2048]);
            kick(&rig.transport, RX_QUEUE);
            rig.peer.send_frame(&wire(&frame(100, seed))).expect("send");
            assert_eq!(rx.wait_used().1, 12 + 100);
        }
        let class = VIRTIO_NET_CTRL_STATS;
        let reply = send(&rig, &mut ctrl, class, VIRTIO_NET_CTRL_STATS_QUERY, &[], 9);
        assert_eq!(reply.ack(), Some(ACK_OK), "{reply:?}");
        assert_eq!(reply.len, 9);
        assert_eq!(reply.written[1..], SUPPORTED.to_le_bytes());
        // As Linux lays it out: header, then the ack and the result in descriptors of their own.
        let reply = send_raw(
            &rig,
            &mut ctrl,
            &[
                (vec![class, VIRTIO_NET_CTRL_STATS_QUERY], 0),
                (vec![0xAA], WRITE),
                (vec![0xAA; 8], WRITE),
            ],
        );
        assert_eq!(reply.len, 9);
        assert_eq!(
            reply.written[0], ACK_OK,
            "the ack in its own first descriptor"
        );
        assert_eq!(reply.written[1..], SUPPORTED.to_le_bytes());

        // What Linux asks for: every data queue with its types, then the control queue.
        let data = get_data(&[
            (0, TYPE_RX_BASIC | TYPE_RX_SPEED),
            (1, TYPE_TX_BASIC | TYPE_TX_SPEED),
            (2, TYPE_CVQ),
        ]);
        let reply_len = 56 + 24 + 56 + 24 + 24;
        let reply = send(
            &rig,
            &mut ctrl,
            class,
            VIRTIO_NET_CTRL_STATS_GET,
            &data,
            reply_len + 1,
        );
        assert_eq!(reply.ack(), Some(ACK_OK), "{reply:?}");
        assert_eq!(reply.len as usize, reply_len + 1);
        let blocks = blocks(&reply.written[1..]);
        let m = &rig.metrics;
        let types: Vec<(u8, u16)> = blocks.iter().map(|b| (b.0, b.1)).collect();
        assert_eq!(types, [(0, 0), (3, 0), (16, 1), (19, 1), (32, 2)]);
        let tx_basic = &blocks[2].2;
        assert_eq!(tx_basic[1], 3, "tx_packets");
        assert_eq!(tx_basic[0], m.tx.kicks.get(), "tx_notifications");
        assert_eq!(tx_basic[1], m.tx.frames.get());
        assert_eq!(tx_basic[2], m.tx.bytes.get(), "tx_bytes");
        assert_eq!(tx_basic[2], 3 * 64);
        assert_eq!(tx_basic[3], m.tx.interrupts_raised.get(), "tx_interrupts");
        assert_eq!(tx_basic[4..], [0, 0], "no drops");
        assert!(tx_basic[0] >= 1, "the kicks were counted");
        let rx_basic = &blocks[0].2;
        assert_eq!(rx_basic[1], m.rx.frames.get(), "rx_packets");
        assert_eq!(rx_basic[1], 2);
        assert_eq!(rx_basic[2], m.rx.bytes.get(), "rx_bytes");
        assert_eq!(rx_basic[2], 2 * 100);
        assert_eq!(
            blocks[4].2,
            [3, 2],
            "command_num counts this GET, ok_num not yet"
        );
        assert!(wait_until(TIMEOUT, || m.ctrl.ok.get() == 3
            && m.ctrl.stats_gets.get() == 1
            && m.ctrl.stats_queries.get() == 2));
    }

    #[test]
    fn speed_counts_the_frames_the_rate_limiter_held() {
        let mem = guest_mem();
        let mut rig = rig(&mem);
        let one_a_second = RateLimiterConfig {
            bandwidth: None,
            ops: Some(BucketConfig {
                size: 1,
                one_time_burst: 0,
                refill_time: 1000,
            }),
        };
        rig.tuning
            .set_rate_limiters(RateLimiterConfig::default(), one_a_second)
            .expect("valid");
        let (rx, mut tx) = queues(&mem);
        let mut ctrl = ctrl_queue(&mem);
        start_ctrl(&mut rig.transport, STATS, &rx, &tx, &ctrl);
        send_one(&rig, &mut tx, 1);
        // The second frame waits for the ops bucket (one frame a second).
        tx.push_tx(&wire(&frame(64, 2)), &[]);
        kick(&rig.transport, TX_QUEUE);
        let m = &rig.metrics;
        assert!(wait_until(TIMEOUT, || m.tx.rate_limiter_ops_exceeded.get() >= 1));
        let data = get_data(&[(1, TYPE_TX_SPEED)]);
        let reply = send(
            &rig,
            &mut ctrl,
            VIRTIO_NET_CTRL_STATS,
            VIRTIO_NET_CTRL_STATS_GET,
            &data,
            25,
        );
        assert_eq!(reply.ack(), Some(ACK_OK), "{reply:?}");
        let speed = &blocks(&reply.written[1..])[0].2;
        assert!(speed[0] >= 1, "packets_allowance_exceeded {speed:?}");
        assert_eq!(speed[0], m.tx.rate_limiter_ops_exceeded.get());
        assert_eq!(speed[1], 0, "no bandwidth bucket");
    }

    #[test]
    fn malformed_requests_get_err_nothing_written_and_the_worker_keeps_running() {
        let mem = guest_mem();
        let (rig, _rx, _tx, mut ctrl) = started_ctrl::<GuestQueue>(&mem, STATS);
        let class = VIRTIO_NET_CTRL_STATS;
        let get = VIRTIO_NET_CTRL_STATS_GET;
        let cases: Vec<(&str, u8, Vec<u8>, usize)> = vec![
            ("QUERY with data", VIRTIO_NET_CTRL_STATS_QUERY, vec![0], 9),
            (
                "QUERY reply too small",
                VIRTIO_NET_CTRL_STATS_QUERY,
                vec![],
                8,
            ),
            (
                "QUERY reply too large",
                VIRTIO_NET_CTRL_STATS_QUERY,
                vec![],
                10,
            ),
            ("GET without requests", get, vec![], 1),
            (
                "GET partial request",
                get,
                get_data(&[(0, TYPE_RX_BASIC)])[..15].to_vec(),
                57,
            ),
            (
                "GET reply too small",
                get,
                get_data(&[(0, TYPE_RX_BASIC)]),
                56,
            ),
            (
                "GET reply too large",
                get,
                get_data(&[(0, TYPE_RX_BASIC)]),
                58,
            ),
            (
                "GET a queue that does not exist",
                get,
                get_data(&[(5, TYPE_TX_BASIC)]),
                57,
            ),
            ("GET an unsupported type", get, get_data(&[(0, 1 << 1)]), 33),
            (
                "GET a tx type of an rx queue",
                get,
                get_data(&[(0, TYPE_TX_BASIC)]),
                57,
            ),
            ("GET no type", get, get_data(&[(1, 0)]), 1),
            (
                "GET too many requests",
                get,
                get_data(&[(2, TYPE_CVQ); 4]),
                97,
            ),
            ("unknown STATS command", 2, vec![], 1),
        ];
        for (i, (what, command, data, writable)) in cases.iter().enumerate() {
            let reply = send(&rig, &mut ctrl, class, *command, data, *writable);
            assert_eq!(reply.ack(), Some(ACK_ERR), "{what}: {reply:?}");
            assert!(
                reply.written[1..].iter().all(|&b| b == 0xAA),
                "{what}: nothing but the ack written"
            );
            let m = &rig.metrics.ctrl;
            assert!(
                wait_until(TIMEOUT, || m.errors.get() == i as u64 + 1),
                "{what} counted"
            );
        }
        let m = &rig.metrics.ctrl;
        assert_eq!(m.bad_length.get(), 8);
        assert_eq!(m.out_of_range.get(), 4);
        assert_eq!(m.unsupported.get(), 1);
        // The worker still answers.
        let reply = send(&rig, &mut ctrl, class, get, &get_data(&[(2, TYPE_CVQ)]), 25);
        assert_eq!(reply.ack(), Some(ACK_OK), "{reply:?}");
        assert_eq!(m.stats_gets.get(), 1);
    }

    #[test]
    fn without_the_feature_stats_are_refused() {
        let mem = guest_mem();
        let (rig, _rx, _tx, mut ctrl) = started_ctrl::<GuestQueue>(&mem, ALL);
        let class = VIRTIO_NET_CTRL_STATS;
        let reply = send(&rig, &mut ctrl, class, VIRTIO_NET_CTRL_STATS_QUERY, &[], 9);
        assert_eq!(reply.ack(), Some(ACK_ERR));
        assert!(reaches(&rig.metrics.ctrl.not_negotiated, 1));
    }
}

#[test]
fn while_the_device_adapts_a_guests_coalescing_stays_within_the_operators_bound() {
    let mem = guest_mem();
    let mut rig = rig_for::<GuestQueue>(&mem, |_| {});
    rig.tuning
        .set(NetTuning {
            adaptive: crate::virtio::net::Adaptive {
                enabled: true,
                max_coalesce_usecs: 32,
                ..Default::default()
            },
            ..NetTuning::default()
        })
        .expect("valid");
    let (rx, tx) = GuestQueue::pair(&mem);
    let mut ctrl = ctrl_ring::<GuestQueue>(&mem);
    start_ctrl(&mut rig.transport, ALL, &rx, &tx, &ctrl);
    // A second's hold asked for on tx, within bounds on rx: tx is cut to the bound.
    for (command, data) in [(TX_SET, coal(64, 1_000_000)), (RX_SET, coal(8, 20))] {
        let reply = send(&rig, &mut ctrl, NOTF_COAL, command, &data, 1);
        assert_eq!(reply.ack(), Some(ACK_OK));
    }
    let in_force = rig.tuning.coalescing_in_force();
    assert_eq!(in_force.tx.source, CoalescingSource::Guest);
    assert_eq!((in_force.tx.max_packets, in_force.tx.max_usecs), (64, 32));
    assert_eq!((in_force.rx.max_packets, in_force.rx.max_usecs), (8, 20));
    // The guest reads back what the device applies.
    assert_eq!(vq_get(&rig, &mut ctrl, 1), (64, 32));
}
