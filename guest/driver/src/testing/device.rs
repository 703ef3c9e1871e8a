//! [`TestDevice`]: the device half of the split rings, written from the spec (not from the
//! driver's `ring.rs`), over the same [`TestHal`] memory.

use std::sync::atomic::{fence, Ordering};
use std::vec::Vec;

use super::hal::TestHal;
use super::transport::TestTransport;
use crate::features::{NET_F_MRG_RXBUF, RING_F_EVENT_IDX};
use crate::hal::PhysAddr;
use crate::transport::{status, INT_USED_BUFFER};

const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;

/// One descriptor as the device reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Desc {
    pub(crate) addr: u64,
    pub(crate) len: u32,
    pub(crate) flags: u16,
}

impl Desc {
    pub(crate) fn writable(&self) -> bool {
        self.flags & F_WRITE != 0
    }
}

/// A chain the device popped.
#[derive(Clone, Debug)]
pub(crate) struct Chain {
    pub(crate) head: u16,
    pub(crate) descs: Vec<Desc>,
}

/// The device's view of one queue.
pub(crate) struct DevQueue {
    hal: TestHal,
    pub(crate) size: u16,
    desc: PhysAddr,
    avail: PhysAddr,
    used: PhysAddr,
    pub(crate) event_idx: bool,
    pub(crate) next_avail: u16,
    pub(crate) used_idx: u16,
    /// `used_idx` at the last interrupt decision.
    signalled: u16,
}

impl DevQueue {
    pub(crate) fn new(
        hal: TestHal,
        size: u16,
        (desc, avail, used): (PhysAddr, PhysAddr, PhysAddr),
        event_idx: bool,
    ) -> DevQueue {
        DevQueue {
            hal,
            size,
            desc,
            avail,
            used,
            event_idx,
            next_avail: 0,
            used_idx: 0,
            signalled: 0,
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

    /// Overwrites `used.idx` (to fake a broken device).
    pub(crate) fn force_used_idx(&mut self, idx: u16) {
        self.used_idx = idx;
        self.hal
            .atomic_u16(self.used + 2)
            .store(idx, Ordering::Release);
    }

    /// Re-enables notifications after draining; true if more was published meanwhile.
    pub(crate) fn enable_notifications(&mut self) -> bool {
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
        if !self.event_idx {
            self.set_used_flags(1);
        }
    }

    /// The device's interrupt decision after adding used entries.
    pub(crate) fn needs_interrupt(&mut self) -> bool {
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

/// A device consuming the driver's rx (0) and tx (1) queues.
pub(crate) struct TestDevice {
    pub(crate) hal: TestHal,
    pub(crate) transport: TestTransport,
    pub(crate) rx: DevQueue,
    pub(crate) tx: DevQueue,
    pub(crate) mrg: bool,
}

impl TestDevice {
    /// The device as the driver configured it (call after DRIVER_OK).
    pub(crate) fn attach(hal: &TestHal, transport: &TestTransport) -> TestDevice {
        let regs = transport.regs();
        assert_ne!(regs.status & status::DRIVER_OK, 0, "driver not ready");
        let event_idx = regs.driver_features & RING_F_EVENT_IDX != 0;
        let queue = |i: usize| {
            let q = regs.queues[i];
            assert_eq!(q.ready, 1);
            DevQueue::new(
                hal.clone(),
                u16::try_from(q.num).expect("size"),
                (q.desc, q.avail, q.used),
                event_idx,
            )
        };
        TestDevice {
            hal: hal.clone(),
            transport: transport.clone(),
            rx: queue(0),
            tx: queue(1),
            mrg: regs.driver_features & NET_F_MRG_RXBUF != 0,
        }
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
                self.rx.next_avail = self.rx.next_avail.wrapping_sub(chains.len() as u16);
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

    /// Raises the used-buffer interrupt.
    pub(crate) fn interrupt(&self) {
        self.transport.raise(INT_USED_BUFFER);
    }
}
