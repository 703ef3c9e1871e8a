//! The control queue's execution: each command's chain walked, parsed (`super::super::ctrl`)
//! and carried out on the worker, with one [`CtrlOutcome`] acked to the driver.

use super::*;
use crate::virtio::net::{ctrl, stats};
use crate::virtio::ring::{AnyRing, Ring};
use crate::virtio::vring::GuestView;

/// What [`EventLoop::ctrl_chain`] did.
enum CtrlStep {
    /// A command was handled.
    Handled,
    /// None was queued, but one came as notifications were re-enabled: pop again.
    Again,
    /// None is queued (notifications enabled).
    Drained,
}

/// What a control command came to.
enum CtrlOutcome {
    /// Carried out: VIRTIO_NET_OK, after the command's reply (the bytes `execute` left in the
    /// reply buffer, none for most commands).
    Done,
    /// Refused: VIRTIO_NET_ERR.
    Refused(CtrlError),
}

impl<'p, B: NetBackend> EventLoop<'p, B> {
    /// Handles the control queue's pending commands (at most [`CTRL_CHAINS_PER_CALL`] and one
    /// call's descriptor budget; the loop comes back for more), then interrupts the driver if
    /// it wants (not coalesced: NOTF_COAL is about rx and tx).
    pub(super) fn run_ctrl(&mut self) -> Result<(), WorkerError> {
        self.ctrl_more = false;
        let Some(mut ctrl) = self.ctrl.take() else {
            return Ok(());
        };
        let result = self.ctrl_chains(&mut ctrl);
        let decision = ctrl.vq.interrupt_decision();
        self.ctrl = Some(ctrl);
        result?;
        if decision == Some(InterruptDecision::Raise) {
            self.interrupt
                .signal_queue(self.ctrl_queue_index())
                .map_err(WorkerError::Interrupt)?;
            self.metrics.irqfd_signals.add(1);
        }
        Ok(())
    }

    /// The control queue's index: after every pair with MQ, else after the one pair.
    pub(super) fn ctrl_queue_index(&self) -> usize {
        let mq = self.acked_features & 1 << virtio_bindings::virtio_net::VIRTIO_NET_F_MQ != 0;
        2 * if mq { usize::from(self.pairs) } else { 1 }
    }

    pub(super) fn ctrl_chains(&mut self, ctrl: &mut CtrlQueue) -> Result<(), WorkerError> {
        let mut budget = WalkBudget::per_call();
        let mut handled = 0;
        loop {
            if handled == CTRL_CHAINS_PER_CALL || budget.exhausted() {
                self.ctrl_more = true;
                return Ok(());
            }
            let CtrlQueue { vq, buffers, .. } = ctrl;
            // The ring kind is picked per command; below, each has its own code.
            let step = match vq {
                AnyRing::Split(vq) => {
                    let (guest, mut ring) = vq.split();
                    self.ctrl_chain(&guest, &mut ring, buffers, &mut budget)?
                }
                AnyRing::Packed(vq) => {
                    let (guest, mut ring) = vq.split();
                    self.ctrl_chain(&guest, &mut ring, buffers, &mut budget)?
                }
            };
            match step {
                CtrlStep::Handled => handled += 1,
                CtrlStep::Again => {}
                CtrlStep::Drained => return Ok(()),
            }
        }
    }

    /// Pops, walks, answers and returns one command chain of `ring`.
    fn ctrl_chain<R: Ring>(
        &mut self,
        guest: &GuestView<'_>,
        ring: &mut R,
        buffers: &mut CtrlBuffers,
        budget: &mut WalkBudget,
    ) -> Result<CtrlStep, WorkerError> {
        let ring_error = |source| WorkerError::Ring {
            queue: "control",
            source,
        };
        let Some(head) = ring.pop_head().map_err(ring_error)? else {
            return Ok(if ring.enable_notification() {
                CtrlStep::Again
            } else {
                CtrlStep::Drained
            });
        };
        self.ctrl_counters.commands += 1;
        let mut readable = IovecList::reuse(std::mem::take(&mut buffers.readable));
        let mut writable = IovecList::reuse(std::mem::take(&mut buffers.writable));
        let walked = ring.walk_chain_split(
            guest,
            &head,
            ctrl::MAX_CTRL_READABLE,
            &mut readable,
            &mut writable,
            budget,
        );
        let used_len = match walked {
            Err(e) => {
                self.ctrl_counters.malformed_chains += 1;
                self.ctrl_refused(&format_args!("chain refused: {e}"));
                0
            }
            Ok((_, 0)) => {
                self.ctrl_counters.no_ack += 1;
                self.ctrl_refused(&"a command without a writable ack byte");
                0
            }
            Ok((_, writable_len)) => {
                let reuse = (&mut buffers.request, &mut buffers.reply);
                self.answer(&readable, &writable, writable_len, reuse)?;
                writable_len
            }
        };
        buffers.readable = readable.into_storage();
        buffers.writable = writable.into_storage();
        ring.add_used(head, used_len);
        ring.publish_used();
        Ok(CtrlStep::Handled)
    }

    /// Parses and carries out one command whose chain was walked into `readable` and
    /// `writable` (`writable_len` bytes, at least 1), and writes the ack, then the result.
    /// `request` and `reply` are reused buffers.
    fn answer(
        &mut self,
        readable: &IovecList,
        writable: &IovecList,
        writable_len: u32,
        (request, reply): (&mut Vec<u8>, &mut Vec<u8>),
    ) -> Result<(), WorkerError> {
        // Copied once: parsed and carried out from the same bytes.
        let iovecs = readable.as_iovecs();
        request.resize(iovecs.total_bytes(), 0);
        let copied = iovecs.read_at(0, request);
        debug_assert!(copied, "the walk's readable bytes");
        reply.clear();
        let outcome = match ctrl::parse_at(
            request,
            writable_len,
            self.acked_features,
            self.usable_pairs,
            self.ctrl_queue_index() as u16,
        ) {
            Ok(command) => self.execute(command, request, reply)?,
            Err(e) => CtrlOutcome::Refused(e),
        };
        let out = writable.as_iovecs();
        let ack = match outcome {
            CtrlOutcome::Done => {
                self.ctrl_counters.ok += 1;
                // `parse_at` checked the reply fits after the ack.
                debug_assert!(reply.len() < writable_len as usize);
                out.write_at(1, reply);
                ACK_OK
            }
            CtrlOutcome::Refused(e) => {
                e.count(&mut self.ctrl_counters);
                self.ctrl_refused(&format_args!("VIRTIO_NET_ERR: {e}"));
                ACK_ERR
            }
        };
        // The ack comes first, then the command's result (virtio 1.3 §5.1.6.5; Linux lays out
        // the writable part so).
        out.write_at(0, &[ack]);
        Ok(())
    }

    /// Logs a refused control command, at most one line per burst (a driver can send many).
    pub(super) fn ctrl_refused(&mut self, what: &dyn std::fmt::Display) {
        if let Some(more) = self.ctrl_errors.failure(Instant::now()) {
            warn!(
                "virtio-net {}: control queue: {what} ({more} more refused since the last report; \
                 see the `ctrl` metrics)",
                self.label
            );
        }
    }

    /// Carries out a validated control command parsed from `request`; its reply (VQ_GET,
    /// STATS) goes into `reply`.
    fn execute(
        &mut self,
        command: CtrlCommand,
        request: &[u8],
        reply: &mut Vec<u8>,
    ) -> Result<CtrlOutcome, WorkerError> {
        let c = &mut self.ctrl_counters;
        match command {
            CtrlCommand::Promisc(on) => {
                c.rx_mode_sets += 1;
                self.rx_filter.promisc = on;
            }
            CtrlCommand::AllMulti(on) => {
                c.rx_mode_sets += 1;
                self.rx_filter.allmulti = on;
            }
            CtrlCommand::MacTable { unicast, multicast } => {
                c.mac_table_sets += 1;
                self.rx_filter.unicast_entries = unicast;
                self.rx_filter.multicast_entries = multicast;
            }
            CtrlCommand::MacAddr(mac) => {
                c.mac_addr_sets += 1;
                self.guest_mac.set(mac);
                self.link.bump_generation();
                info!("virtio-net {}: the driver set MAC {mac}", self.label);
                return Ok(CtrlOutcome::Done);
            }
            CtrlCommand::GuestOffloads(offloads) => return Ok(self.guest_offloads(offloads)),
            CtrlCommand::SetCoalescing(dir, bounds) => {
                c.coalescing_sets += 1;
                self.set_guest_coalescing(dir, bounds)?;
                return Ok(CtrlOutcome::Done);
            }
            CtrlCommand::GetCoalescing(dir) => {
                c.coalescing_gets += 1;
                let bounds = self.guest_coalescing[dir & 1]
                    .unwrap_or_else(|| self.operator_coalescing(&self.tuning_shared.load()));
                reply.extend_from_slice(&u32::from(bounds.max_packets).to_le_bytes());
                reply.extend_from_slice(&bounds.max_usecs.to_le_bytes());
                return Ok(CtrlOutcome::Done);
            }
            CtrlCommand::QueryStats => {
                c.stats_queries += 1;
                reply.extend_from_slice(&stats::SUPPORTED.to_le_bytes());
                return Ok(CtrlOutcome::Done);
            }
            CtrlCommand::GetStats { reply_len, .. } => {
                c.stats_gets += 1;
                // This worker's own counts first, so the reply is as fresh as the metrics can
                // be (the other pairs' workers publish after every batch).
                self.publish();
                stats::write_reply(&self.metrics, stats::requests(request), reply);
                debug_assert_eq!(reply.len(), reply_len as usize);
                return Ok(CtrlOutcome::Done);
            }
            CtrlCommand::SetPairs(pairs) => {
                c.mq_pairs_sets += 1;
                self.tuning_shared.set_active_pairs(usize::from(pairs));
                self.tuning_shared.notify_except(0);
                info!(
                    "virtio-net {}: the driver set {pairs} queue pair(s)",
                    self.label
                );
                return Ok(CtrlOutcome::Done);
            }
        }
        debug!(
            "virtio-net {}: receive filter {:?} recorded (a tap does not filter)",
            self.label, self.rx_filter
        );
        Ok(CtrlOutcome::Done)
    }

    /// GUEST_OFFLOADS SET: the backend's offloads, or ERR if it refuses them.
    fn guest_offloads(&mut self, offloads: Offloads) -> CtrlOutcome {
        if let Err(e) = self.backend.set_offloads(offloads) {
            warn!(
                "virtio-net {}: the backend refused offloads {offloads:?}: {e}",
                self.label
            );
            return CtrlOutcome::Refused(CtrlError::Backend);
        }
        self.ctrl_counters.offloads_sets += 1;
        CtrlOutcome::Done
    }

    /// NOTF_COAL from the guest: direction `dir`'s bounds, for this worker and the other
    /// pairs' (coalescing is per direction, device-wide).
    fn set_guest_coalescing(
        &mut self,
        dir: usize,
        bounds: InterruptCoalescing,
    ) -> Result<(), WorkerError> {
        let bounds = self.bounded_guest_coalescing(bounds);
        self.guest_coalescing[dir & 1] = Some(bounds);
        self.tuning_shared.set_guest(dir, Some(bounds));
        self.tuning_shared.notify_except(0);
        let tuning = self.tuning_shared.load();
        let coalescing = self.coalescing(self.operator_coalescing(&tuning));
        let moderation = self.moderator.retune(tuning.event_idx, coalescing);
        self.apply(moderation)?;
        // Linux's adaptive coalescing (DIM) may send these often: not an info line.
        debug!(
            "virtio-net {}: the driver set {} interrupt coalescing {bounds:?}",
            self.label,
            if dir == RX { "rx" } else { "tx" }
        );
        Ok(())
    }
}
