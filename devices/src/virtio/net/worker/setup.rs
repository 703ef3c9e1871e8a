//! Activation: what a run needs (backend configured, epoll set, rings resolved), made from the
//! driver's queues; the backend goes back to the device if any step fails.

use super::*;
use virtio_bindings::virtio_config::VIRTIO_F_IN_ORDER;

/// What a run's event loop needs that activation can fail to make; the backend is
/// configured (header size, offloads, queue enabled) on the way.
struct Setup {
    epoll: Epoll,
    ctrl: Option<CtrlQueue>,
    rx: RxQueue,
    tx: TxQueue,
    /// The pair takes part in the run (pair 0 always; others once the driver enabled them).
    enabled: bool,
}

impl Setup {
    fn new<B: NetBackend>(
        a: &Activation,
        backend: &mut B,
        parts: &mut ThreadParts,
        shared: &Shared,
    ) -> Result<Setup, ActivateError> {
        backend
            .set_vnet_hdr_size(VNET_HDR_LEN as u32)
            .and_then(|()| backend.set_offloads(a.offloads))
            .map_err(ActivateError::Backend)?;
        // A stop written after the previous run ended on its own is stale, and so is a wake-up
        // for commands that run never read (they were answered between runs).
        let _ = parts.stop.read();
        let _ = parts.command_ready.read();
        parts
            .timer
            .clear()
            .map_err(|e| ActivateError::EventLoop(io_err(e)))?;
        let enabled = shared.pair == 0 || shared.pair < shared.tuning.active_pairs();
        backend
            .set_queue_enabled(enabled)
            .map_err(ActivateError::Backend)?;
        let epoll =
            EventLoop::<B>::setup_epoll(a, parts, enabled).map_err(ActivateError::EventLoop)?;
        let ctrl = match &a.ctrl {
            None => None,
            Some((queue, kick)) => Some(CtrlQueue {
                vq: AnyRing::resume(queue, &a.mem, a.acked_features, a.positions.ctrl)
                    .map_err(ActivateError::Ring)?,
                kick: kick.try_clone().map_err(ActivateError::EventLoop)?,
                buffers: CtrlBuffers::default(),
            }),
        };
        // A ring refused here is counted as a needs-reset event by the device.
        let (rx, tx) = EventLoop::<B>::queues(a).map_err(ActivateError::Ring)?;
        Ok(Setup {
            epoll,
            ctrl,
            rx,
            tx,
            enabled,
        })
    }
}

/// The tuning a run starts with, and its adapter when adapting (whose choices then replace
/// the operator's fixed busy-poll and coalescing).
fn adapting(mut tuning: NetTuning) -> (NetTuning, Option<Adapter>) {
    let adapter = tuning
        .adaptive
        .enabled
        .then(|| Adapter::new(tuning.adaptive));
    if let Some(adapter) = &adapter {
        tuning.busy_poll_us = adapter.busy_poll_us();
        tuning.interrupt_coalescing = adapter.coalescing();
    }
    (tuning, adapter)
}

impl<'p, B: NetBackend> EventLoop<'p, B> {
    /// Configures the backend for the negotiated features and sets up the epoll set (kicks,
    /// stop, tuning and timer registered; the backend by `update_backend_interest`).
    pub(super) fn prepare(
        a: Activation,
        mut backend: B,
        parts: &'p mut ThreadParts,
        shared: &Shared,
    ) -> Result<Self, (ActivateError, B)> {
        // Every fallible step borrows the backend; on an error it goes back to the caller
        // (the device keeps it for the next activation) from these two places only.
        let setup = match Setup::new(&a, &mut backend, parts, shared) {
            Ok(setup) => setup,
            Err(e) => return Err((e, backend)),
        };
        let mut event_loop = Self::assemble(a, backend, parts, shared, setup);
        match event_loop.watch_backend() {
            Ok(()) => Ok(event_loop),
            Err(e) => Err((e, event_loop.backend)),
        }
    }

    /// The event loop of a run, from what [`Setup::new`] prepared.
    // long: one struct literal, a line per field of the event loop
    fn assemble(
        a: Activation,
        backend: B,
        parts: &'p mut ThreadParts,
        shared: &Shared,
        setup: Setup,
    ) -> Self {
        let Setup {
            epoll,
            ctrl,
            rx,
            tx,
            enabled,
        } = setup;
        let (tuning, adapter) = adapting(shared.tuning.load());
        let mut event_loop = EventLoop {
            label: shared.label.clone(),
            rx: rx.with_label(shared.label.clone()),
            tx: tx.with_label(shared.label.clone()),
            rx_kick: a.rx_kick,
            tx_kick: a.tx_kick,
            backend,
            interrupt: a.interrupt,
            metrics: shared.metrics.clone(),
            tuning_shared: shared.tuning.clone(),
            link: shared.link.clone(),
            rx_errors: BurstLog::default(),
            parts,
            epoll,
            moderator: Moderator::new(tuning),
            rx_counters: RxCounters::default(),
            tx_counters: TxCounters::default(),
            rx_hold: RxHold::Reading,
            tx_waiting: false,
            tx_more: false,
            tx_parked: false,
            events_pending: false,
            busy_poll: Duration::ZERO,
            poll_sleep: Duration::ZERO,
            kick_coalescing: KickCoalescing::default(),
            kick_quiet: false,
            kick_follows_load: false,
            trickle: TrickleWatch::default(),
            poll_counters: BusyPollCounters::default(),
            polled_ns: 0,
            backend_gone: false,
            limiter_generation: 0,
            registered: EventSet::empty(),
            ctrl,
            ctrl_counters: CtrlCounters::default(),
            ctrl_more: false,
            acked_features: a.acked_features,
            guest_coalescing: [None; 2],
            operator_coalescing_seen: shared.tuning.operator_coalescing(),
            guest_mac: shared.guest_mac.clone(),
            rx_filter: RxFilter::default(),
            ctrl_errors: BurstLog::default(),
            pair: shared.pair,
            pairs: shared.pairs,
            usable_pairs: a.usable_pairs,
            enabled,
            adapter,
            seen: Observed::default(),
            interval_start: None,
            rounds: 0,
            window_ran_out: false,
            idle_since: None,
            sleeps: 0,
        };
        event_loop.apply_knobs(&tuning);
        event_loop.publish_adaptive();
        if shared.pair == 0 {
            // A new run starts from the operator's coalescing (a reset forgets the guest's).
            shared.tuning.set_guest(RX, None);
            shared.tuning.set_guest(TX, None);
        } else {
            // Pair 0 (the control queue's) owns what the guest set; the others follow it.
            event_loop.guest_coalescing = [shared.tuning.guest(RX), shared.tuning.guest(TX)];
        }
        event_loop.apply_limiters();
        event_loop
    }

    /// Starts polling the backend (its frames, and its link if it has one).
    pub(super) fn watch_backend(&mut self) -> Result<(), ActivateError> {
        self.update_backend_interest()
            .map_err(ActivateError::EventLoop)?;
        if let Some(fd) = self.backend.link_fd() {
            let event = EpollEvent::new(EventSet::IN, Token::Link.data());
            self.epoll
                .ctl(ControlOperation::Add, fd, event)
                .map_err(ActivateError::EventLoop)?;
        }
        Ok(())
    }

    /// Resolves the rings (refusing nonsensical ones: the device then needs a reset).
    pub(super) fn queues(a: &Activation) -> Result<(RxQueue, TxQueue), RingError> {
        let big_frames = Offloads::TSO4 | Offloads::TSO6 | Offloads::UFO;
        let gather = if a.offloads.bits() & big_frames.bits() != 0 {
            RX_GATHER_BYTES
        } else {
            RX_GATHER_NO_GSO_BYTES
        };
        let acked = a.acked_features;
        let in_order = acked & 1 << VIRTIO_F_IN_ORDER != 0;
        let rx_ring = AnyRing::resume(&a.rx, &a.mem, acked, a.positions.rx)?;
        let mut rx = RxQueue::new(rx_ring, a.rx_mode, gather);
        rx.set_in_order(in_order);
        let mut tx = TxQueue::new(AnyRing::resume(&a.tx, &a.mem, acked, a.positions.tx)?);
        tx.set_in_order(in_order);
        Ok((rx, tx))
    }

    pub(super) fn setup_epoll(
        a: &Activation,
        parts: &ThreadParts,
        enabled: bool,
    ) -> io::Result<Epoll> {
        let epoll = Epoll::new()?;
        if enabled {
            Self::watch_kicks(&epoll, a.tx_kick.as_raw_fd(), a.rx_kick.as_raw_fd(), true)?;
        }
        for (fd, token) in [
            (parts.stop.as_raw_fd(), Token::Stop),
            (parts.command_ready.as_raw_fd(), Token::Command),
            (parts.tuning_changed.as_raw_fd(), Token::Tuning),
            (parts.timer.as_raw_fd(), Token::CoalesceTimer),
            (parts.poll_timer.as_raw_fd(), Token::PollTimer),
            (parts.kick_timer.as_raw_fd(), Token::KickTimer),
            (parts.tx_throttle.timer.as_raw_fd(), Token::TxThrottle),
            (parts.rx_throttle.timer.as_raw_fd(), Token::RxThrottle),
        ] {
            epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, token.data()),
            )?;
        }
        if let Some((_, kick)) = &a.ctrl {
            epoll.ctl(
                ControlOperation::Add,
                kick.as_raw_fd(),
                EpollEvent::new(EventSet::IN, Token::CtrlKick.data()),
            )?;
        }
        Ok(epoll)
    }

    /// Adds (or removes) the two kick eventfds to (from) the epoll set.
    pub(super) fn watch_kicks(
        epoll: &Epoll,
        tx_kick: RawFd,
        rx_kick: RawFd,
        add: bool,
    ) -> io::Result<()> {
        for (fd, token) in [(tx_kick, Token::TxKick), (rx_kick, Token::RxKick)] {
            let op = if add {
                ControlOperation::Add
            } else {
                ControlOperation::Delete
            };
            epoll.ctl(op, fd, EpollEvent::new(EventSet::IN, token.data()))?;
        }
        Ok(())
    }
}
