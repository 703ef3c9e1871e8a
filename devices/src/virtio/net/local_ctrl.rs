//! The control queue a VMM serves itself for a vhost-user backend that does not (as QEMU does
//! for vhost-user and vhost-net): MQ VQ_PAIRS_SET becomes the backend's rings enabled and
//! disabled, the MAC and rx-mode commands are acknowledged (the backend sees every frame the
//! guest sends and delivers what it receives; there is no filter to set), and every other
//! command is answered VIRTIO_NET_ERR. Chains are walked and parsed as the in-process device
//! does (`ctrl::parse_at`), so a malformed chain is refused the same way.

use std::os::fd::{AsRawFd, RawFd};

use serde::Serialize;
use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::ctrl::{self, CtrlCommand, CtrlError, ACK_ERR, ACK_OK, CTRL_CHAINS_PER_CALL};
use crate::counters::Counter;
use crate::iovec::IovecList;
use crate::virtio::ring::{AnyRing, InterruptDecision, Ring, RingError};
use crate::virtio::vring::{GuestView, WalkBudget};

/// The counters of a control queue the VMM serves (`ctrl` in the vhost-user device's
/// metrics).
#[derive(Debug, Default, Serialize)]
pub struct LocalCtrlMetrics {
    /// Commands read.
    pub commands: Counter,
    /// Commands acknowledged VIRTIO_NET_OK.
    pub ok: Counter,
    /// Commands answered VIRTIO_NET_ERR (unsupported, not negotiated, malformed, out of
    /// range, or pairs the backend refused).
    pub errors: Counter,
    /// Chains refused before parsing (malformed, or without a writable ack byte).
    pub malformed_chains: Counter,
    /// VQ_PAIRS_SET carried out.
    pub mq_pairs_sets: Counter,
}

/// What a command asks of the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtrlRequest {
    /// Use queue pairs `0..n` (enable them, disable the others).
    SetPairs(u16),
}

/// A control queue served by the VMM.
pub struct LocalCtrl {
    vq: AnyRing,
    kick: EventFd,
    scratch: Scratch,
}

/// What parsing needs besides the ring, and the buffer each command is copied into. (The
/// walks' iovec lists are not kept: they hold raw pointers, and the queue moves to the control
/// thread; a command is rare enough for a fresh list.)
struct Scratch {
    index: usize,
    acked: u64,
    usable_pairs: u16,
    request: Vec<u8>,
}

impl LocalCtrl {
    /// The control queue `queue` (index `index`, its kick `kick`) of a driver that
    /// acknowledged `acked` and set up `usable_pairs` queue pairs.
    pub fn new(
        queue: &Queue,
        mem: &GuestMemoryMmap,
        acked: u64,
        kick: EventFd,
        index: usize,
        usable_pairs: u16,
    ) -> Result<LocalCtrl, RingError> {
        Ok(LocalCtrl {
            vq: AnyRing::new(queue, mem, acked)?,
            kick,
            scratch: Scratch {
                index,
                acked,
                usable_pairs,
                request: Vec::new(),
            },
        })
    }

    /// The queue's kick eventfd (to poll).
    pub fn kick_fd(&self) -> RawFd {
        self.kick.as_raw_fd()
    }

    /// The queue's index (its interrupt's).
    pub fn index(&self) -> usize {
        self.scratch.index
    }

    /// Drains the kick and answers every queued command; `carry_out` does what a command asks
    /// of the backend and says whether it was done. Returns whether the driver wants an
    /// interrupt. A ring the driver broke is an error (the device then needs a reset).
    pub fn serve(
        &mut self,
        metrics: &LocalCtrlMetrics,
        mut carry_out: impl FnMut(CtrlRequest) -> bool,
    ) -> Result<bool, RingError> {
        let _ = self.kick.read();
        let mut answered = false;
        loop {
            let mut budget = WalkBudget::per_call();
            let (handled, drained) = match &mut self.vq {
                AnyRing::Split(vq) => {
                    let (guest, mut ring) = vq.split();
                    Self::chains(
                        &mut self.scratch,
                        &guest,
                        &mut ring,
                        metrics,
                        &mut carry_out,
                        &mut budget,
                    )?
                }
                AnyRing::Packed(vq) => {
                    let (guest, mut ring) = vq.split();
                    Self::chains(
                        &mut self.scratch,
                        &guest,
                        &mut ring,
                        metrics,
                        &mut carry_out,
                        &mut budget,
                    )?
                }
            };
            answered |= handled > 0;
            if drained {
                break;
            }
        }
        Ok(answered && self.vq.interrupt_decision() == Some(InterruptDecision::Raise))
    }

    /// Answers up to [`CTRL_CHAINS_PER_CALL`] commands within `budget`; returns how many and
    /// whether the queue is drained (notifications enabled again).
    fn chains<R: Ring>(
        scratch: &mut Scratch,
        guest: &GuestView<'_>,
        ring: &mut R,
        metrics: &LocalCtrlMetrics,
        carry_out: &mut impl FnMut(CtrlRequest) -> bool,
        budget: &mut WalkBudget,
    ) -> Result<(usize, bool), RingError> {
        let mut handled = 0;
        while handled < CTRL_CHAINS_PER_CALL && !budget.exhausted() {
            let Some(head) = ring.pop_head()? else {
                if ring.enable_notification() {
                    continue;
                }
                return Ok((handled, true));
            };
            handled += 1;
            metrics.commands.add(1);
            let mut readable = IovecList::new();
            let mut writable = IovecList::new();
            let walked = ring.walk_chain_split(
                guest,
                &head,
                ctrl::MAX_CTRL_READABLE,
                &mut readable,
                &mut writable,
                budget,
            );
            let used = match walked {
                Ok((_, writable_len)) if writable_len > 0 => {
                    let iovecs = readable.as_iovecs();
                    scratch.request.resize(iovecs.total_bytes(), 0);
                    iovecs.read_at(0, &mut scratch.request);
                    let parsed = ctrl::parse_at(
                        &scratch.request,
                        writable_len,
                        scratch.acked,
                        scratch.usable_pairs,
                        scratch.index as u16,
                    );
                    let ack = answer(parsed, metrics, carry_out);
                    writable.as_iovecs().write_at(0, &[ack]);
                    1
                }
                _ => {
                    metrics.malformed_chains.add(1);
                    0
                }
            };
            ring.add_used(head, used);
            ring.publish_used();
        }
        Ok((handled, false))
    }
}

/// The ack of a parsed command.
fn answer(
    parsed: Result<CtrlCommand, CtrlError>,
    metrics: &LocalCtrlMetrics,
    carry_out: &mut impl FnMut(CtrlRequest) -> bool,
) -> u8 {
    let done = match parsed {
        Ok(
            CtrlCommand::Promisc(_)
            | CtrlCommand::AllMulti(_)
            | CtrlCommand::MacTable { .. }
            | CtrlCommand::MacAddr(_),
        ) => true,
        Ok(CtrlCommand::SetPairs(n)) => {
            let done = carry_out(CtrlRequest::SetPairs(n));
            if done {
                metrics.mq_pairs_sets.add(1);
            }
            done
        }
        // Features the VMM does not offer when it serves the queue itself (parse_at refuses
        // them as not negotiated first; this is the backstop).
        Ok(_) | Err(_) => false,
    };
    if done {
        metrics.ok.add(1);
        ACK_OK
    } else {
        metrics.errors.add(1);
        ACK_ERR
    }
}

#[cfg(test)]
mod tests {
    use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
    use virtio_bindings::virtio_net::*;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    use super::*;
    use crate::test_utils::queue::{guest_mem, GuestQueue, WRITE};

    const FEATURES: u64 = 1 << VIRTIO_F_VERSION_1
        | 1 << VIRTIO_NET_F_CTRL_VQ
        | 1 << VIRTIO_NET_F_CTRL_RX
        | 1 << VIRTIO_NET_F_MQ;

    /// A control queue (index 4: two pairs) over `q`.
    fn ctrl(q: &GuestQueue) -> LocalCtrl {
        let kick = EventFd::new(EFD_NONBLOCK).expect("eventfd");
        LocalCtrl::new(&q.queue(), q.mem(), FEATURES, kick, 4, 2).expect("ring")
    }

    /// Queues `class.command` with `data` and a one-byte ack; returns the ack's address.
    fn command(q: &mut GuestQueue, class: u32, command: u32, data: &[u8]) -> u64 {
        let mut readable = vec![class as u8, command as u8];
        readable.extend_from_slice(data);
        let out = q.alloc(&readable);
        let ack = q.alloc(&[0xAA]);
        let head = q.write_chain(&[(out, readable.len() as u32, 0), (ack, 1, WRITE)]);
        q.publish(head);
        ack
    }

    #[test]
    fn pairs_set_is_carried_out_and_acked_and_rx_mode_acked() {
        let mem = guest_mem();
        let mut q = GuestQueue::new(&mem, 16);
        let mut ctrl = ctrl(&q);
        let metrics = LocalCtrlMetrics::default();
        let pairs_ack = command(
            &mut q,
            VIRTIO_NET_CTRL_MQ,
            VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET,
            &2u16.to_le_bytes(),
        );
        let promisc_ack = command(&mut q, VIRTIO_NET_CTRL_RX, VIRTIO_NET_CTRL_RX_PROMISC, &[1]);
        let mut asked = vec![];
        let interrupt = ctrl
            .serve(&metrics, |r| {
                asked.push(r);
                true
            })
            .expect("ring");
        assert!(interrupt, "the driver wants to hear of its commands");
        assert_eq!(asked, [CtrlRequest::SetPairs(2)]);
        assert_eq!(q.read(pairs_ack, 1), [ACK_OK]);
        assert_eq!(q.read(promisc_ack, 1), [ACK_OK]);
        assert_eq!(q.used_idx(), 2);
        assert_eq!(q.used(0), (0, 1), "the ack byte written");
        assert_eq!((metrics.commands.get(), metrics.ok.get()), (2, 2));
        assert_eq!(metrics.mq_pairs_sets.get(), 1);
    }

    #[test]
    fn refused_pairs_unsupported_commands_and_bad_chains_get_errors() {
        let mem = guest_mem();
        let mut q = GuestQueue::new(&mem, 16);
        let mut ctrl = ctrl(&q);
        let metrics = LocalCtrlMetrics::default();
        // More pairs than the driver set up, a refused change, a command whose feature the
        // VMM does not offer, an unknown class.
        let too_many = command(
            &mut q,
            VIRTIO_NET_CTRL_MQ,
            VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET,
            &3u16.to_le_bytes(),
        );
        let refused = command(
            &mut q,
            VIRTIO_NET_CTRL_MQ,
            VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET,
            &1u16.to_le_bytes(),
        );
        let offloads = command(
            &mut q,
            VIRTIO_NET_CTRL_GUEST_OFFLOADS,
            VIRTIO_NET_CTRL_GUEST_OFFLOADS_SET,
            &0u64.to_le_bytes(),
        );
        let unknown = command(&mut q, 200, 0, &[]);
        // A chain with no writable byte, and one whose descriptor points outside memory.
        let out = q.alloc(&[VIRTIO_NET_CTRL_RX as u8, 0, 1]);
        let head = q.write_chain(&[(out, 3, 0)]);
        q.publish(head);
        let head = q.write_chain(&[(u64::MAX - 4, 3, 0), (out, 1, WRITE)]);
        q.publish(head);
        let mut asked = vec![];
        ctrl.serve(&metrics, |r| {
            asked.push(r);
            false
        })
        .expect("bad chains break no ring");
        assert_eq!(
            asked,
            [CtrlRequest::SetPairs(1)],
            "out of range is not asked"
        );
        for ack in [too_many, refused, offloads, unknown] {
            assert_eq!(q.read(ack, 1), [ACK_ERR]);
        }
        assert_eq!(q.used_idx(), 6, "every chain is returned");
        assert_eq!(metrics.errors.get(), 4);
        assert_eq!(metrics.malformed_chains.get(), 2);
        assert_eq!(metrics.ok.get(), 0);
    }
}
