//! [`TestDevice`]: the device half of the split rings, written from the spec (not from the
//! driver's `ring.rs`), over the same [`TestHal`] memory.

use std::boxed::Box;
use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::vec::Vec;

use super::hal::TestHal;
use super::packed::DevPackedQueue;
use super::transport::{Regs, TestTransport};
use super::Desc;
use crate::features::{F_RING_PACKED, NET_F_MRG_RXBUF, RING_F_EVENT_IDX};
use crate::hal::PhysAddr;
use crate::transport::{status, INT_USED_BUFFER};

const F_NEXT: u16 = 1;

/// A chain the device popped.
#[derive(Clone, Debug)]
pub(crate) struct Chain {
    pub(crate) head: u16,
    pub(crate) descs: Vec<Desc>,
}

/// The device's view of one queue.
pub(crate) struct DevQueue {
    hal: TestHal,
    /// The queue's index.
    pub(crate) index: u16,
    pub(crate) size: u16,
    desc: PhysAddr,
    avail: PhysAddr,
    used: PhysAddr,
    pub(crate) event_idx: bool,
    pub(crate) next_avail: u16,
    pub(crate) used_idx: u16,
    /// `used_idx` at the last interrupt decision.
    signalled: u16,
    /// VIRTIO_F_RING_PACKED: the packed queue behind the same operations (`pop`, `push_used`,
    /// notifications, the interrupt decision); the split fields above are then unused.
    pub(crate) packed: Option<PackedSide>,
}

/// A packed queue and the ring positions each buffer id in flight takes (to skip them when the
/// chain is returned used).
pub(crate) struct PackedSide {
    pub(crate) q: DevPackedQueue,
    descs: Vec<u16>,
}

impl DevQueue {
    pub(crate) fn new(
        hal: TestHal,
        index: u16,
        size: u16,
        (desc, avail, used): (PhysAddr, PhysAddr, PhysAddr),
        event_idx: bool,
    ) -> DevQueue {
        DevQueue {
            hal,
            index,
            size,
            desc,
            avail,
            used,
            event_idx,
            next_avail: 0,
            used_idx: 0,
            signalled: 0,
            packed: None,
        }
    }

    /// Overwrites every split-ring descriptor and avail ring entry with junk (the index and
    /// flags stay): what a device that writes where it may only read leaves behind.
    pub(crate) fn scribble(&self) {
        for i in 0..u64::from(self.size) {
            self.hal.write(self.desc + 16 * i, &[0x5a; 16]);
            self.hal.write(self.avail + 4 + 2 * i, &[0x5a; 2]);
        }
    }

    /// A packed queue at the three areas `(desc, driver, device)`.
    pub(crate) fn new_packed(
        hal: TestHal,
        index: u16,
        size: u16,
        areas: (PhysAddr, PhysAddr, PhysAddr),
        event_idx: bool,
    ) -> DevQueue {
        let q = DevPackedQueue::new(hal.clone(), size, areas, event_idx);
        let mut queue = DevQueue::new(hal, index, size, areas, event_idx);
        queue.packed = Some(PackedSide {
            q,
            descs: std::vec![1; usize::from(size)],
        });
        queue
    }

    /// Gives back `chains` (the last ones popped, in the order popped) for the next pops.
    pub(crate) fn unpop(&mut self, chains: &[Chain]) {
        match self.packed.as_mut() {
            Some(p) => {
                let descs: usize = chains.iter().map(|c| c.descs.len()).sum();
                p.q.avail_abs -= descs as u64;
            }
            None => self.next_avail = self.next_avail.wrapping_sub(chains.len() as u16),
        }
    }

    pub(crate) fn avail_idx(&self) -> u16 {
        self.hal.atomic_u16(self.avail + 2).load(Ordering::Acquire)
    }

    pub(crate) fn avail_flags(&self) -> u16 {
        self.hal.atomic_u16(self.avail).load(Ordering::Acquire)
    }

    pub(crate) fn used_event(&self) -> u16 {
        self.hal
            .atomic_u16(self.avail + 4 + 2 * u64::from(self.size))
            .load(Ordering::Acquire)
    }

    pub(crate) fn set_avail_event(&self, value: u16) {
        self.hal
            .atomic_u16(self.used + 4 + 8 * u64::from(self.size))
            .store(value, Ordering::Release);
    }

    pub(crate) fn set_used_flags(&self, value: u16) {
        self.hal
            .atomic_u16(self.used)
            .store(value, Ordering::Release);
    }

    /// Chains published and not popped.
    pub(crate) fn pending(&self) -> u16 {
        if let Some(p) = &self.packed {
            return p.q.available_chains();
        }
        self.avail_idx().wrapping_sub(self.next_avail)
    }

    pub(crate) fn read_desc(&self, i: u16) -> (Desc, u16) {
        let at = self.desc + 16 * u64::from(i);
        let desc = Desc {
            addr: self.hal.read_u64(at),
            len: self.hal.read_u32(at + 8),
            flags: self.hal.read_u16(at + 12),
        };
        (desc, self.hal.read_u16(at + 14))
    }

    /// Pops the next published chain.
    pub(crate) fn pop(&mut self) -> Option<Chain> {
        if let Some(p) = self.packed.as_mut() {
            let chain = p.q.pop()?;
            assert!(chain.id < self.size, "buffer id {} out of range", chain.id);
            p.descs[usize::from(chain.id)] = chain.descs.len() as u16;
            return Some(Chain {
                head: chain.id,
                descs: chain.descs,
            });
        }
        if self.pending() == 0 {
            return None;
        }
        assert!(
            self.pending() <= self.size,
            "driver published past the ring"
        );
        let slot = u64::from(self.next_avail % self.size);
        let head = self.hal.read_u16(self.avail + 4 + 2 * slot);
        assert!(head < self.size, "avail head {head} out of range");
        self.next_avail = self.next_avail.wrapping_add(1);
        let mut descs = Vec::new();
        let mut i = head;
        loop {
            let (desc, next) = self.read_desc(i);
            descs.push(desc);
            assert!(descs.len() <= usize::from(self.size), "descriptor loop");
            if desc.flags & F_NEXT == 0 {
                break;
            }
            i = next;
        }
        Some(Chain { head, descs })
    }

    /// Writes a used element with any id (also invalid ones) and publishes it.
    pub(crate) fn push_used_raw(&mut self, id: u32, len: u32) {
        if let Some(p) = self.packed.as_mut() {
            let skip = p.descs.get(id as usize).copied().unwrap_or(1);
            p.q.push_used_raw(id as u16, len, len > 0, skip);
            return;
        }
        let at = self.used + 4 + 8 * u64::from(self.used_idx % self.size);
        self.hal.write(at, &id.to_le_bytes());
        self.hal.write(at + 4, &len.to_le_bytes());
        self.used_idx = self.used_idx.wrapping_add(1);
        fence(Ordering::Release);
        self.hal
            .atomic_u16(self.used + 2)
            .store(self.used_idx, Ordering::Release);
    }

    pub(crate) fn push_used(&mut self, head: u16, len: u32) {
        self.push_used_raw(u32::from(head), len);
    }

    /// IN_ORDER: returns `heads` (chains popped in this order, the oldest first) with one used
    /// entry carrying the last one's head and `len` (split: `used.idx` moves on by the batch's
    /// size; packed: the used position skips every chain's descriptors).
    pub(crate) fn push_used_batch(&mut self, heads: &[u16], len: u32) {
        let last = *heads.last().expect("a batch");
        if let Some(p) = self.packed.as_mut() {
            let skip: u16 = heads.iter().map(|&h| p.descs[usize::from(h)]).sum();
            p.q.push_used_raw(last, len, len > 0, skip);
            return;
        }
        let at = self.used + 4 + 8 * u64::from(self.used_idx % self.size);
        self.hal.write(at, &u32::from(last).to_le_bytes());
        self.hal.write(at + 4, &len.to_le_bytes());
        self.used_idx = self.used_idx.wrapping_add(heads.len() as u16);
        fence(Ordering::Release);
        self.hal
            .atomic_u16(self.used + 2)
            .store(self.used_idx, Ordering::Release);
    }

    /// Overwrites `used.idx` (to fake a broken device).
    pub(crate) fn force_used_idx(&mut self, idx: u16) {
        self.used_idx = idx;
        self.hal
            .atomic_u16(self.used + 2)
            .store(idx, Ordering::Release);
    }

    /// Re-enables notifications after draining; true if more was published meanwhile.
    pub(crate) fn enable_notifications(&mut self) -> bool {
        if let Some(p) = self.packed.as_mut() {
            return p.q.enable_notifications();
        }
        if self.event_idx {
            self.set_avail_event(self.next_avail);
        } else {
            self.set_used_flags(0);
        }
        fence(Ordering::SeqCst);
        self.pending() != 0
    }

    /// Asks for no notifications (flag form; with EVENT_IDX the device just leaves
    /// `avail_event` behind).
    pub(crate) fn disable_notifications(&mut self) {
        if let Some(p) = self.packed.as_mut() {
            return p.q.disable_notifications();
        }
        if !self.event_idx {
            self.set_used_flags(1);
        }
    }

    /// The device's interrupt decision after adding used entries.
    pub(crate) fn needs_interrupt(&mut self) -> bool {
        if let Some(p) = self.packed.as_mut() {
            return p.q.needs_interrupt();
        }
        fence(Ordering::SeqCst);
        let (old, new) = (self.signalled, self.used_idx);
        self.signalled = new;
        if self.event_idx {
            let event = self.used_event();
            // vring_need_event, spelled out independently of the driver's copy.
            new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
        } else {
            self.avail_flags() & 1 == 0
        }
    }
}

/// How the test device's control queue answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CtrlBehaviour {
    /// As [`CtrlDevice::model`] decides (a small spec-conforming device).
    Model,
    /// VIRTIO_NET_ERR to everything.
    AlwaysErr,
    /// Pops commands and keeps them (`held`) without answering.
    Silent,
    /// Returns the chain with this ack byte and a used length of 1 (no reply written).
    RawAck(u8),
    /// Answers as the model, with a used length of 1 whatever it wrote.
    ShortLen,
}

/// One control command as the device read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CtrlRecord {
    pub(crate) class: u8,
    pub(crate) cmd: u8,
    /// Command data (the device-readable bytes after the header).
    pub(crate) data: Vec<u8>,
    /// Length of each descriptor, device-readable ones first (`true`: device-writable).
    pub(crate) layout: Vec<(u32, bool)>,
}

/// The device side of the control queue (queue 2): a small model of the NOTF_COAL and RX
/// classes, written from the spec.
pub(crate) struct CtrlDevice {
    hal: TestHal,
    pub(crate) q: DevQueue,
    pub(crate) behaviour: CtrlBehaviour,
    /// Every command popped, in order.
    pub(crate) log: Vec<CtrlRecord>,
    /// Commands popped under [`CtrlBehaviour::Silent`], not answered yet.
    pub(crate) held: Vec<Chain>,
    /// (max_packets, usecs) of the rx queue (index 0) and the tx queue (index 1).
    pub(crate) coal: [(u32, u32); 2],
    pub(crate) promisc: bool,
    /// Leave notifications as they are after serving (a device that never re-enables them).
    pub(crate) suppress: bool,
    /// The device's `max_virtqueue_pairs`.
    pub(crate) max_pairs: u16,
    /// Pairs enabled by the last VQ_PAIRS_SET (1 before any).
    pub(crate) pairs_set: u16,
    /// Commands answered VIRTIO_NET_OK (STATS CVQ's `ok_num`).
    pub(crate) oks: u64,
    /// STATS QUERY's answer (the spec's mask of this project's device by default).
    pub(crate) stats_supported: u64,
    /// Applied to every STATS GET reply before it is written (to fake a malformed one).
    pub(crate) stats_tamper: Option<fn(&mut Vec<u8>)>,
}

/// The NOTF_COAL/RX constants, spelled out from the spec (not from `ctrl.rs`).
const OK: u8 = 0;
const ERR: u8 = 1;

impl CtrlDevice {
    fn u32_at(data: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes"))
    }

    /// The model's answer to `class`/`cmd` with `data`: (ack, reply bytes).
    pub(crate) fn model(&mut self, class: u8, cmd: u8, data: &[u8]) -> (u8, Vec<u8>) {
        let vqn = |data: &[u8]| usize::from(u16::from_le_bytes([data[0], data[1]]));
        match (class, cmd, data.len()) {
            // NOTF_COAL TX_SET / RX_SET: tx_max_packets, tx_usecs (rx likewise).
            (6, 0, 8) => {
                self.coal[1] = (Self::u32_at(data, 0), Self::u32_at(data, 4));
                (OK, Vec::new())
            }
            (6, 1, 8) => {
                self.coal[0] = (Self::u32_at(data, 0), Self::u32_at(data, 4));
                (OK, Vec::new())
            }
            // VQ_SET: vqn, reserved, max_packets, max_usecs; only queues 0 and 1 exist.
            (6, 2, 12) if vqn(data) < 2 => {
                self.coal[vqn(data)] = (Self::u32_at(data, 4), Self::u32_at(data, 8));
                (OK, Vec::new())
            }
            // VQ_GET: vqn, reserved → max_packets, max_usecs.
            (6, 3, 4) if vqn(data) < 2 => {
                let (packets, usecs) = self.coal[vqn(data)];
                let mut reply = packets.to_le_bytes().to_vec();
                reply.extend_from_slice(&usecs.to_le_bytes());
                (OK, reply)
            }
            // MQ VQ_PAIRS_SET: le16 pairs in 1..=max_virtqueue_pairs.
            (4, 0, 2) => {
                let pairs = u16::from_le_bytes([data[0], data[1]]);
                if (1..=self.max_pairs).contains(&pairs) {
                    self.pairs_set = pairs;
                    (OK, Vec::new())
                } else {
                    (ERR, Vec::new())
                }
            }
            // RX PROMISC: one byte, 0 or 1.
            (0, 0, 1) if data[0] <= 1 => {
                self.promisc = data[0] == 1;
                (OK, Vec::new())
            }
            _ => (ERR, Vec::new()),
        }
    }

    /// STATS QUERY and GET, written from the spec: a GET entry's blocks in ascending bit
    /// order, each `{type, 0, vq_index, 0, size}` and its counters; counter `i` of type `t` of
    /// queue `q` is `q << 16 | t << 8 | i` (CVQ: the real command counts). `room`: the reply
    /// bytes the chain offers (ack excluded), which must be exactly the blocks' size.
    pub(crate) fn stats(&mut self, cmd: u8, data: &[u8], room: usize) -> (u8, Vec<u8>) {
        match (cmd, data.len()) {
            (0, 0) if room == 8 => (OK, self.stats_supported.to_le_bytes().to_vec()),
            (1, n) if n > 0 && n % 16 == 0 => {
                let ctrl_index = self.q.index;
                let data_queues = if ctrl_index == 2 { 2 } else { ctrl_index };
                let mut reply = Vec::new();
                for entry in data.chunks(16) {
                    let vq = u16::from_le_bytes([entry[0], entry[1]]);
                    let types = u64::from_le_bytes(entry[8..].try_into().expect("8 bytes"));
                    if types == 0 || types & !self.stats_supported != 0 {
                        return (ERR, Vec::new());
                    }
                    for bit in (0..64u8).filter(|b| types & (1 << b) != 0) {
                        let (fits, counters) = match bit {
                            32 => (vq == ctrl_index, 2),
                            0 | 3 => (
                                vq < data_queues && vq % 2 == 0,
                                if bit == 0 { 6 } else { 2 },
                            ),
                            16 | 19 => (
                                vq < data_queues && vq % 2 == 1,
                                if bit == 16 { 6 } else { 2 },
                            ),
                            _ => (false, 0),
                        };
                        if !fits {
                            return (ERR, Vec::new());
                        }
                        let size = 8 + 8 * counters as u16;
                        reply.extend_from_slice(&[bit, 0]);
                        reply.extend_from_slice(&vq.to_le_bytes());
                        reply.extend_from_slice(&[0, 0]);
                        reply.extend_from_slice(&size.to_le_bytes());
                        for i in 0..counters {
                            let value = if bit == 32 {
                                [self.log.len() as u64, self.oks][i]
                            } else {
                                u64::from(vq) << 16 | u64::from(bit) << 8 | i as u64
                            };
                            reply.extend_from_slice(&value.to_le_bytes());
                        }
                    }
                }
                if reply.len() != room {
                    return (ERR, Vec::new());
                }
                if let Some(tamper) = self.stats_tamper {
                    tamper(&mut reply);
                }
                (OK, reply)
            }
            _ => (ERR, Vec::new()),
        }
    }

    /// Answers `chain`: the ack then the reply into its device-writable buffers, in order.
    fn answer(&mut self, chain: &Chain) {
        let readable: Vec<u8> = chain
            .descs
            .iter()
            .filter(|d| !d.writable())
            .flat_map(|d| self.hal.read(d.addr, d.len as usize))
            .collect();
        let writable: Vec<Desc> = chain.descs.iter().copied().filter(Desc::writable).collect();
        assert!(
            chain
                .descs
                .iter()
                .skip_while(|d| !d.writable())
                .all(Desc::writable),
            "device-readable descriptor after a device-writable one"
        );
        let room: usize = writable.iter().map(|d| d.len as usize).sum();
        let (ack, reply) = match self.behaviour {
            CtrlBehaviour::RawAck(ack) => {
                let first = writable.first().expect("no writable ack");
                self.hal.write(first.addr, &[ack]);
                self.q.push_used(chain.head, 1);
                return;
            }
            CtrlBehaviour::AlwaysErr => (ERR, Vec::new()),
            CtrlBehaviour::Model | CtrlBehaviour::ShortLen | CtrlBehaviour::Silent => {
                if readable.len() < 2 || room < 1 {
                    (ERR, Vec::new())
                } else if readable[0] == 8 {
                    self.stats(readable[1], &readable[2..], room - 1)
                } else {
                    self.model(readable[0], readable[1], &readable[2..])
                }
            }
        };
        // Ack first, reply after it; a reply that does not fit (with the ack) is an error.
        let (ack, reply) = if reply.len() + 1 > room {
            (ERR, Vec::new())
        } else {
            (ack, reply)
        };
        if ack == OK {
            self.oks += 1;
        }
        let mut bytes = Vec::from([ack]);
        bytes.extend_from_slice(&reply);
        bytes.resize(room, 0);
        let mut rest = &bytes[..];
        for d in &writable {
            let n = d.len as usize;
            self.hal.write(d.addr, &rest[..n]);
            rest = &rest[n..];
        }
        let written = match self.behaviour {
            CtrlBehaviour::ShortLen => 1,
            _ => room as u32,
        };
        self.q.push_used(chain.head, written);
    }

    /// Pops every published command, records it, and answers it (or holds it when
    /// [`CtrlBehaviour::Silent`]). Returns the number popped.
    pub(crate) fn serve(&mut self) -> usize {
        let mut n = 0;
        while let Some(chain) = self.q.pop() {
            n += 1;
            let readable: Vec<u8> = chain
                .descs
                .iter()
                .filter(|d| !d.writable())
                .flat_map(|d| self.hal.read(d.addr, d.len as usize))
                .collect();
            self.log.push(CtrlRecord {
                class: readable.first().copied().unwrap_or(0xff),
                cmd: readable.get(1).copied().unwrap_or(0xff),
                data: readable.get(2..).unwrap_or_default().to_vec(),
                layout: chain.descs.iter().map(|d| (d.len, d.writable())).collect(),
            });
            if self.behaviour == CtrlBehaviour::Silent {
                self.held.push(chain);
            } else {
                self.answer(&chain);
            }
        }
        // Notifications back on (EVENT_IDX: `avail_event` at the next slot), as a device does
        // after draining; the driver kicks for the next command.
        if !self.suppress {
            self.q.enable_notifications();
        }
        n
    }

    /// Answers the held commands as the model would.
    pub(crate) fn release(&mut self) {
        self.behaviour = CtrlBehaviour::Model;
        for chain in std::mem::take(&mut self.held) {
            self.answer(&chain);
        }
    }
}

/// A device consuming the driver's rx (0) and tx (1) queues, and its control queue (2) if the
/// driver set one up; with MQ negotiated, also the other pairs' queues (control queue `2N`).
pub(crate) struct TestDevice {
    pub(crate) hal: TestHal,
    pub(crate) transport: TestTransport,
    pub(crate) rx: DevQueue,
    pub(crate) tx: DevQueue,
    /// Pairs 1.. (rx, tx) with MQ (empty without).
    pub(crate) more: Vec<(DevQueue, DevQueue)>,
    pub(crate) mrg: bool,
    /// The control queue, served synchronously from the driver's kick (a notification hook
    /// on the transport).
    pub(crate) ctrl: Option<Arc<Mutex<CtrlDevice>>>,
}

/// The control queue's device side once the driver set it up, shared by the notification hook
/// [`serve_ctrl_from_bring_up`] installs and the [`TestDevice`] attached afterwards.
pub(crate) type CtrlSlot = Arc<Mutex<Option<Arc<Mutex<CtrlDevice>>>>>;

/// The queue index of the control queue under the negotiated features (2, or 2 ×
/// `max_virtqueue_pairs` with MQ) and the pairs the driver set up (ready rx/tx queues).
fn layout(regs: &Regs) -> (usize, usize) {
    if regs.driver_features & crate::features::NET_F_MQ == 0 {
        return (2, 1);
    }
    let max = usize::from(u16::from_le_bytes([regs.config[8], regs.config[9]]));
    let pairs = (0..max)
        .take_while(|&p| regs.queues[2 * p].ready == 1 && regs.queues[2 * p + 1].ready == 1)
        .count();
    (2 * max, pairs)
}

fn dev_queue(hal: &TestHal, regs: &Regs, i: usize) -> DevQueue {
    let q = regs.queues[i];
    assert_eq!(q.ready, 1, "queue {i} not ready");
    let new = if regs.driver_features & F_RING_PACKED != 0 {
        DevQueue::new_packed
    } else {
        DevQueue::new
    };
    new(
        hal.clone(),
        u16::try_from(i).expect("queue index"),
        u16::try_from(q.num).expect("size"),
        (q.desc, q.avail, q.used),
        regs.driver_features & RING_F_EVENT_IDX != 0,
    )
}

/// The control queue's device side as the driver programmed it, if it did.
fn ctrl_from_regs(hal: &TestHal, regs: &Regs, behaviour: CtrlBehaviour) -> Option<CtrlDevice> {
    let (ctrl_index, _) = layout(regs);
    (regs.queues[ctrl_index].ready == 1).then(|| CtrlDevice {
        hal: hal.clone(),
        q: dev_queue(hal, regs, ctrl_index),
        behaviour,
        log: Vec::new(),
        held: Vec::new(),
        coal: [(0, 0); 2],
        promisc: false,
        suppress: false,
        max_pairs: u16::from_le_bytes([regs.config[8], regs.config[9]]),
        pairs_set: 1,
        oks: 0,
        stats_supported: (1 << 32) | (1 << 0) | (1 << 3) | (1 << 16) | (1 << 19),
        stats_tamper: None,
    })
}

/// Answers control commands from the driver's first control kick on, so that commands sent
/// during bring-up (VQ_PAIRS_SET) are served (install before `VirtioNet::new`; hand the slot
/// to [`TestDevice::attach_with`]).
pub(crate) fn serve_ctrl_from_bring_up(
    hal: &TestHal,
    transport: &TestTransport,
    behaviour: CtrlBehaviour,
) -> CtrlSlot {
    let slot: CtrlSlot = Arc::new(Mutex::new(None));
    let (hal, regs_of, shared) = (hal.clone(), transport.clone(), Arc::clone(&slot));
    transport.set_notify_hook(Some(Box::new(move |queue| {
        let mut slot = shared.lock().expect("slot lock");
        if slot.is_none() {
            let regs = regs_of.regs();
            if layout(&regs).0 != usize::from(queue) {
                return;
            }
            *slot = ctrl_from_regs(&hal, &regs, behaviour).map(|c| Arc::new(Mutex::new(c)));
        }
        if let Some(ctrl) = slot.as_ref() {
            let mut ctrl = ctrl.lock().expect("ctrl lock");
            if usize::from(queue) == usize::from(ctrl.q.index) {
                ctrl.serve();
            }
        }
    })));
    slot
}

impl TestDevice {
    /// The device as the driver configured it (call after DRIVER_OK).
    pub(crate) fn attach(hal: &TestHal, transport: &TestTransport) -> TestDevice {
        TestDevice::attach_with(hal, transport, None)
    }

    /// [`Self::attach`], keeping the control queue served since bring-up by `early`'s hook.
    pub(crate) fn attach_with(
        hal: &TestHal,
        transport: &TestTransport,
        early: Option<CtrlSlot>,
    ) -> TestDevice {
        let regs = transport.regs();
        assert_ne!(regs.status & status::DRIVER_OK, 0, "driver not ready");
        let (ctrl_index, pairs) = layout(&regs);
        let served = early.and_then(|slot| slot.lock().expect("slot lock").clone());
        let hooked = served.is_some();
        let ctrl = served.or_else(|| {
            ctrl_from_regs(hal, &regs, CtrlBehaviour::Model).map(|c| Arc::new(Mutex::new(c)))
        });
        let device = TestDevice {
            hal: hal.clone(),
            transport: transport.clone(),
            rx: dev_queue(hal, &regs, 0),
            tx: dev_queue(hal, &regs, 1),
            more: (1..pairs)
                .map(|p| {
                    (
                        dev_queue(hal, &regs, 2 * p),
                        dev_queue(hal, &regs, 2 * p + 1),
                    )
                })
                .collect(),
            mrg: regs.driver_features & NET_F_MRG_RXBUF != 0,
            ctrl,
        };
        drop(regs);
        if let (Some(ctrl), false) = (&device.ctrl, hooked) {
            let ctrl = Arc::clone(ctrl);
            let ctrl_index = u16::try_from(ctrl_index).expect("queue index");
            transport.set_notify_hook(Some(Box::new(move |queue| {
                if queue == ctrl_index {
                    ctrl.lock().expect("ctrl lock").serve();
                }
            })));
        }
        device
    }

    /// Picks queue `q` (even rx, odd tx; a pair other than 0's inside [`Self::on_pair`]) up
    /// again as the driver re-enabled it after a per-queue reset: new device state, indexes
    /// from 0.
    pub(crate) fn reattach(&mut self, q: usize) {
        let regs = self.transport.regs();
        assert_eq!(regs.queues[q].ready, 1, "queue {q} not re-enabled");
        let queue = dev_queue(&self.hal, &regs, q);
        drop(regs);
        if q.is_multiple_of(2) {
            self.rx = queue;
        } else {
            self.tx = queue;
        }
    }

    /// The control queue's device side (panics if the driver set none up).
    pub(crate) fn ctrl(&self) -> MutexGuard<'_, CtrlDevice> {
        self.ctrl
            .as_ref()
            .expect("no control queue")
            .lock()
            .expect("ctrl lock")
    }

    /// Bytes of a device-readable chain (header included).
    pub(crate) fn chain_bytes(&self, chain: &Chain) -> Vec<u8> {
        let mut out = Vec::new();
        for d in &chain.descs {
            assert!(!d.writable(), "tx descriptor is device-writable");
            out.extend(self.hal.read(d.addr, d.len as usize));
        }
        out
    }

    /// Pops every published tx chain without returning it.
    pub(crate) fn tx_take(&mut self) -> Vec<(Chain, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some(chain) = self.tx.pop() {
            let bytes = self.chain_bytes(&chain);
            out.push((chain, bytes));
        }
        out
    }

    /// Pops every published tx chain, returns it used, and gives back the frames (without
    /// their header, which must be all zeros).
    pub(crate) fn tx_drain(&mut self) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        for (chain, bytes) in self.tx_take() {
            assert_eq!(&bytes[..12], &[0u8; 12], "tx header not zero");
            frames.push(bytes[12..].to_vec());
            self.tx.push_used(chain.head, 0);
        }
        frames
    }

    /// Writes header + `frame` into rx chains without returning them; returns (head, bytes)
    /// per chain used. With MRG_RXBUF the frame may span chains; otherwise it must fit one.
    pub(crate) fn rx_fill(&mut self, frame: &[u8]) -> Option<Vec<(u16, u32)>> {
        let mut data = std::vec![0u8; 12];
        data.extend_from_slice(frame);
        let mut chains = Vec::new();
        let mut capacity = 0usize;
        while capacity < data.len() {
            let Some(chain) = self.rx.pop() else {
                // Not enough buffers: put back what was popped.
                self.rx.unpop(&chains);
                return None;
            };
            assert!(
                chain.descs.iter().all(Desc::writable),
                "rx descriptor not writable"
            );
            capacity += chain.descs.iter().map(|d| d.len as usize).sum::<usize>();
            chains.push(chain);
            if !self.mrg {
                break;
            }
        }
        let num_buffers = u16::try_from(chains.len()).expect("count");
        data[10..12].copy_from_slice(&num_buffers.to_le_bytes());
        let mut rest = &data[..];
        let mut used = Vec::new();
        for chain in &chains {
            let mut written = 0u32;
            for d in &chain.descs {
                let n = rest.len().min(d.len as usize);
                self.hal.write(d.addr, &rest[..n]);
                rest = &rest[n..];
                written += n as u32;
            }
            used.push((chain.head, written));
        }
        assert!(
            rest.is_empty(),
            "frame of {} bytes did not fit",
            frame.len()
        );
        Some(used)
    }

    /// Delivers `frame` (rx_fill + returning every chain). False if no buffers were posted.
    pub(crate) fn rx_deliver(&mut self, frame: &[u8]) -> bool {
        match self.rx_fill(frame) {
            Some(used) => {
                for (head, len) in used {
                    self.rx.push_used(head, len);
                }
                true
            }
            None => false,
        }
    }

    /// Runs `f` with pair `pair`'s queues in `self.rx`/`self.tx` (so that the single-pair
    /// helpers serve any pair).
    pub(crate) fn on_pair<R>(&mut self, pair: usize, f: impl FnOnce(&mut Self) -> R) -> R {
        if pair == 0 {
            return f(self);
        }
        let swap = |d: &mut Self| {
            let (rx, tx) = &mut d.more[pair - 1];
            std::mem::swap(&mut d.rx, rx);
            std::mem::swap(&mut d.tx, tx);
        };
        swap(self);
        let result = f(self);
        swap(self);
        result
    }

    /// Raises the used-buffer interrupt.
    pub(crate) fn interrupt(&self) {
        self.transport.raise(INT_USED_BUFFER);
    }
}
