//! Pacing: the rate limiters' throttles, interrupt moderation and its timer, the device
//! busy-poll, and the run-time tuning that sets them.

use super::*;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

impl Throttle {
    pub(super) fn new() -> io::Result<Throttle> {
        Ok(Throttle {
            timer: nonblocking_timerfd()?,
            since: None,
        })
    }

    pub(super) fn is_on(&self) -> bool {
        self.since.is_some()
    }

    /// Stops the queue for `wait` (the timer fires then).
    pub(super) fn start(&mut self, wait: Duration) -> Result<(), WorkerError> {
        self.since = Some(Instant::now());
        self.timer
            .reset(wait.max(MIN_THROTTLE), None)
            .map_err(|e| WorkerError::Timer(io_err(e)))
    }

    /// Ends the stop (timer read and disarmed); returns how long it lasted, in µs.
    pub(super) fn end(&mut self) -> Result<u64, WorkerError> {
        let _ = self.timer.wait();
        self.timer
            .clear()
            .map_err(|e| WorkerError::Timer(io_err(e)))?;
        Ok(self
            .since
            .take()
            .map_or(0, |since| since.elapsed().as_micros() as u64))
    }

    /// Forgets any stop, so that nothing fires into the next run.
    pub(super) fn reset(&mut self) {
        self.since = None;
        let _ = self.timer.clear();
    }
}

/// A non-blocking monotonic timerfd.
pub(super) fn nonblocking_timerfd() -> io::Result<TimerFd> {
    // SAFETY: timerfd_create takes no pointers; the result is checked before use.
    let fd = unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh timerfd that nothing else owns; TimerFd closes it on drop.
    Ok(unsafe { TimerFd::from_raw_fd(fd) })
}

/// What a busy-poll window found.
pub(super) enum Found {
    /// Nothing before the window ended.
    Nothing,
    /// The driver queued tx frames.
    Tx,
    /// The driver posted rx buffers while rx waited for some.
    Rx,
    /// An epoll source is ready (backend input, a kick, a timer, a command).
    Event,
}

/// Shortest throttle timer: a zero duration would disarm a timerfd.
const MIN_THROTTLE: Duration = Duration::from_micros(1);

/// Worker rounds between two clock readings for the end of an adaptation interval, where
/// nothing else reads the clock (a flood: ~0.4 ns per round).
pub(super) const ADAPT_CHECK_ROUNDS: u32 = 64;

impl<'p, B: NetBackend> EventLoop<'p, B> {
    /// End of a round: one interrupt for everything completed (now, or held back by
    /// coalescing until its packet or time bound), counters published once.
    pub(super) fn flush(&mut self) -> Result<(), WorkerError> {
        let completed = [self.rx_counters.frames, self.tx_counters.frames];
        self.seen.frames += completed[RX] + completed[TX];
        self.seen.kicks += self.tx_counters.kicks;
        let moderation = self.moderator.end_round(completed, Instant::now);
        self.apply(moderation)?;
        self.publish();
        if self.adapter.is_some() {
            self.rounds = self.rounds.wrapping_add(1);
            if self.interval_start.is_none() {
                if self.seen.frames > 0 {
                    self.start_interval(Some(Instant::now()));
                }
            } else if self.rounds.is_multiple_of(ADAPT_CHECK_ROUNDS) {
                self.interval_check(Instant::now())?;
            }
        }
        Ok(())
    }

    /// The knobs the queues and the busy-poll read directly: the tx budget, sparse rx reads,
    /// the busy-poll window and its sleep between looks. (Sparse reads may leave a frame
    /// queued: the backend fd is polled level-triggered, so it is reported again.)
    pub(super) fn apply_knobs(&mut self, tuning: &NetTuning) {
        self.tx.set_budget(tuning.tx_budget.into());
        self.rx.set_sparse_reads(tuning.rx_sparse_reads);
        self.busy_poll = Duration::from_micros(tuning.busy_poll_us.into());
        self.poll_sleep = Duration::from_micros(tuning.busy_poll_sleep_us.into());
        // Without EVENT_IDX the driver's kicks cannot be put off: no looks to owe.
        let event_idx = self.acked_features & 1 << VIRTIO_RING_F_EVENT_IDX != 0;
        self.set_kick_coalescing(if event_idx {
            tuning.kick_coalescing
        } else {
            KickCoalescing::default()
        });
    }

    /// The kick coalescing in force from the next drain on.
    fn set_kick_coalescing(&mut self, kicks: KickCoalescing) {
        self.kick_coalescing = kicks;
        if !kicks.is_enabled() {
            // A look still due finds the queue as the next kick would.
            self.kick_quiet = false;
            self.trickle.reset();
        }
    }

    /// Kick coalescing: the tx queue drained with the driver's next kick some buffers away;
    /// the device looks at the ring by itself after the time bound.
    pub(super) fn arm_kick_timer(&mut self) -> Result<(), WorkerError> {
        let wait = Duration::from_micros(self.kick_coalescing.max_usecs.into());
        self.parts
            .kick_timer
            .reset(wait.max(MIN_THROTTLE), None)
            .map_err(|e| WorkerError::Timer(io_err(e)))
    }

    /// Kick coalescing's time bound ran out: frames the driver queued without kicking go out
    /// now (and the device waits the same way again); an empty ring means the driver went
    /// quiet, so the next buffer kicks. The adapter's kick coalescing also asks for kicks
    /// again after looks in a row that sent one frame each ([`TrickleWatch`]).
    pub(super) fn kick_look(&mut self) -> Result<(), WorkerError> {
        match self.parts.kick_timer.wait() {
            Ok(_) => {}
            // Re-armed or cleared after it fired: nothing is due.
            Err(e) if e.errno() == libc::EAGAIN => return Ok(()),
            Err(e) => return Err(WorkerError::Timer(io_err(e))),
        }
        self.tx_counters.kick_timer_looks += 1;
        let found = self.tx.avail_pending();
        self.tx_counters.kick_timer_found += u64::from(found);
        let watch = found && self.kick_follows_load;
        self.kick_quiet = !found || watch && self.trickle.quiet_for_look();
        let sent = self.run_tx_counted()?;
        if watch {
            let trickles = self.trickle.looked(sent);
            self.tx_counters.kick_timer_trickles += u64::from(trickles);
            self.kick_quiet = trickles;
        }
        Ok(())
    }

    /// The driver kicked: the next drain coalesces its kicks again, unless the looks found a
    /// trickle and this kick brought it one frame more.
    pub(super) fn kicked(&mut self) -> Result<(), WorkerError> {
        let trickling = self.kick_quiet && self.trickle.trickles();
        self.kick_quiet = trickling;
        let sent = self.run_tx_counted()?;
        if trickling {
            self.kick_quiet = self.trickle.kicked(sent);
        }
        Ok(())
    }

    /// [`EventLoop::run_tx`] as a kick or a look runs it; returns the frames it sent.
    fn run_tx_counted(&mut self) -> Result<u64, WorkerError> {
        let before = self.tx_counters.frames;
        self.run_tx(self.parks())?;
        Ok(self.tx_counters.frames.saturating_sub(before))
    }

    /// The coalescing timer fired: a held interrupt goes out now.
    pub(super) fn timer_expired(&mut self) -> Result<(), WorkerError> {
        match self.parts.timer.wait() {
            Ok(_) => {}
            // Disarmed (by a packet release) after it fired: nothing to do.
            Err(e) if e.errno() == libc::EAGAIN => return Ok(()),
            Err(e) => return Err(WorkerError::Timer(io_err(e))),
        }
        let moderation = self.moderator.timer_fired();
        self.apply(moderation)
    }

    /// Picks up new knobs; an interrupt held under bounds that no longer apply goes out now,
    /// and a queue stopped by a limiter that changed resumes under the new one.
    pub(super) fn retune(&mut self) -> Result<(), WorkerError> {
        let tuning = self.follow_adaptive(self.tuning_shared.load());
        // A parked queue under a window now zero is unparked by the next busy_poll.
        self.apply_knobs(&tuning);
        let generation = self.tuning_shared.operator_coalescing();
        if self.pair != 0 {
            // Pair 0 decides between the operator's and the guest's, and wakes the others.
            self.guest_coalescing = [self.tuning_shared.guest(RX), self.tuning_shared.guest(TX)];
        } else if generation != self.operator_coalescing_seen {
            // The operator set the coalescing after the guest: the last one set wins.
            self.operator_coalescing_seen = generation;
            if self.guest_coalescing != [None, None] {
                info!(
                    "virtio-net {}: the operator's interrupt coalescing replaces the guest's",
                    self.label
                );
                self.guest_coalescing = [None, None];
                self.tuning_shared.set_guest(RX, None);
                self.tuning_shared.set_guest(TX, None);
                self.tuning_shared.notify_except(0);
            }
        }
        let coalescing = self.coalescing(tuning.interrupt_coalescing);
        let moderation = self.moderator.retune(tuning.event_idx, coalescing);
        self.apply(moderation)?;
        if self.apply_limiters() {
            if self.parts.tx_throttle.is_on() {
                self.unthrottle_tx()?;
                self.run_tx(self.parks())?;
            }
            if self.parts.rx_throttle.is_on() {
                self.unthrottle_rx()?;
                self.run_rx()?;
            }
        }
        Ok(())
    }

    /// The coalescing in force: the operator's (`Shared`), unless the guest set a direction.
    /// While adapting the guest's bounds are held within the operator's.
    pub(super) fn coalescing(&self, operator: InterruptCoalescing) -> Coalescing {
        let guest = |c: Option<InterruptCoalescing>| {
            c.map_or(operator, |c| self.bounded_guest_coalescing(c))
        };
        match self.guest_coalescing {
            [None, None] => Coalescing::Shared(operator),
            [rx, tx] => Coalescing::Split([guest(rx), guest(tx)]),
        }
    }

    /// Installs the rate limiters if they changed; returns whether they did.
    pub(super) fn apply_limiters(&mut self) -> bool {
        let limiters = self.tuning_shared.limiters();
        if limiters.generation == self.limiter_generation {
            return false;
        }
        self.limiter_generation = limiters.generation;
        self.rx.set_rate_limiter(&limiters.rx);
        self.tx.set_rate_limiter(&limiters.tx);
        if self.pair == 0 {
            // Each pair applies the same buckets (its own); one line for the device.
            info!(
                "virtio-net {}: rate limiters rx {:?}, tx {:?}",
                self.label, limiters.rx, limiters.tx
            );
        }
        true
    }

    /// The tx queue may go again: account the time it was stopped.
    pub(super) fn unthrottle_tx(&mut self) -> Result<(), WorkerError> {
        self.tx_counters.rate_limiter_throttled_us += self.parts.tx_throttle.end()?;
        Ok(())
    }

    /// The backend may be read again: account the time it was not.
    pub(super) fn unthrottle_rx(&mut self) -> Result<(), WorkerError> {
        self.rx_counters.rate_limiter_throttled_us += self.parts.rx_throttle.end()?;
        self.update_backend_interest().map_err(WorkerError::Epoll)
    }

    /// Carries out the moderator's decision on the timer and the irqfd.
    pub(super) fn apply(&mut self, moderation: Moderation) -> Result<(), WorkerError> {
        let timer = match moderation.timer {
            TimerOp::Keep => Ok(()),
            TimerOp::Arm(after) => self.parts.timer.reset(after, None),
            TimerOp::Clear => self.parts.timer.clear(),
        };
        timer.map_err(|e| WorkerError::Timer(io_err(e)))?;
        if moderation.signal {
            self.seen.interrupts += 1;
            // This pair's queues that wanted it (their MSI-X vectors; the one line on mmio).
            let (rx, tx) = (2 * self.pair, 2 * self.pair + 1);
            match self.moderator.take_wanted() {
                [true, false] => self.interrupt.signal_queue(rx),
                [false, true] => self.interrupt.signal_queue(tx),
                _ => self.interrupt.signal_queue_pair(rx, tx),
            }
            .map_err(WorkerError::Interrupt)?;
            self.metrics.irqfd_signals.add(1);
        }
        Ok(())
    }

    /// The device busy-poll: the queues are drained and the round's interrupt is out, with tx
    /// notifications still off (the tx queue parked) or rx waiting for backend input
    /// ([`EventLoop::rx_polls`]: receive-only traffic polls too, as vhost-net's busy loop
    /// does). Looks at the tx avail index (and the rx avail index while rx waits for buffers)
    /// for up to the window, spinning or sleeping between looks ([`EventLoop::look`]), and at
    /// epoll for backend input and the other events. Work found is done at once and the
    /// window starts again; an event ready returns to the loop (which does not sleep, then
    /// comes back); a window that ends with nothing re-enables the parked queues'
    /// notifications (re-checking the race) so the loop can sleep.
    pub(super) fn busy_poll(&mut self) -> Result<(), WorkerError> {
        let mut ready = [EpollEvent::default(); 1];
        while self.polls() {
            if self.busy_poll.is_zero() {
                return self.end_busy_poll();
            }
            let start = Instant::now();
            self.interval_check(start)?;
            self.poll_counters.polls += 1;
            self.seen.windows += 1;
            let found = self.look(start, &mut ready)?;
            self.polled_ns += u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
            // Work for the adapter's evidence: frames, or backend input (not a timer).
            self.seen.windows_found += u64::from(match found {
                Found::Tx | Found::Rx => true,
                Found::Event => Token::from_data(ready[0].data()) == Some(Token::Backend),
                Found::Nothing => false,
            });
            match found {
                Found::Nothing => {
                    self.window_ran_out = self.adapter.is_some();
                    return self.end_busy_poll();
                }
                Found::Event => {
                    self.poll_counters.found_work += 1;
                    self.events_pending = true;
                    return Ok(());
                }
                Found::Tx => {
                    self.poll_counters.found_work += 1;
                    self.run_tx(self.parks())?;
                }
                Found::Rx => {
                    self.poll_counters.found_work += 1;
                    self.resume_rx()?;
                }
            }
            self.flush()?;
            if self.tx_more {
                // Budget spent: the loop looks at its other events, then runs tx again.
                return Ok(());
            }
        }
        Ok(())
    }

    /// Looks at the rings until one has work, an epoll event is ready or the window that
    /// began at `start` ends. Between looks the worker spins, looking at epoll and the clock
    /// every few microseconds, or, with a sleep set, waits on epoll for the poll timer (armed
    /// for the sleep or the rest of the window, whichever is shorter) or any other event.
    fn look(&mut self, start: Instant, ready: &mut [EpollEvent; 1]) -> Result<Found, WorkerError> {
        /// Spins between two looks at epoll and the clock (~1-3 µs).
        const SPINS_PER_CHECK: u32 = 64;
        let mut spins = 0u32;
        loop {
            // Only a parked tx queue: one that is not waits for its kick (or for the backend
            // to take more), and running it would do nothing again and again.
            if self.tx_parked && self.tx.avail_pending() {
                return Ok(Found::Tx);
            }
            if self.rx_waits_for_buffers() && self.rx.avail_pending() {
                return Ok(Found::Rx);
            }
            let timeout = if self.poll_sleep.is_zero() {
                spins += 1;
                if !spins.is_multiple_of(SPINS_PER_CHECK) {
                    std::hint::spin_loop();
                    continue;
                }
                0
            } else {
                let left = self.busy_poll.saturating_sub(start.elapsed());
                if left.is_zero() {
                    return Ok(Found::Nothing);
                }
                self.poll_counters.sleeps += 1;
                // Re-arming also clears an expiry left unread by an earlier look.
                self.parts
                    .poll_timer
                    .reset(self.poll_sleep.min(left), None)
                    .map_err(|e| WorkerError::Timer(io_err(e)))?;
                -1
            };
            match self.epoll.wait(timeout, ready) {
                Ok(0) => {}
                Ok(_) if Token::from_data(ready[0].data()) == Some(Token::PollTimer) => {
                    let _ = self.parts.poll_timer.wait();
                }
                Ok(_) => return Ok(Found::Event),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(WorkerError::Epoll(e)),
            }
            if start.elapsed() >= self.busy_poll {
                return Ok(Found::Nothing);
            }
        }
    }

    /// Ends a busy-poll: the parked queues' notifications back on (with the race re-checked,
    /// and anything that raced in sent or received), and this round's interrupt.
    fn end_busy_poll(&mut self) -> Result<(), WorkerError> {
        let rx_parked = self.rx_hold == RxHold::Parked;
        if !self.tx_parked && !rx_parked {
            return Ok(());
        }
        if self.tx_parked {
            self.run_tx(false)?;
        }
        if rx_parked {
            self.rx_hold = RxHold::Reading;
            self.run_rx_with(false)?;
        }
        self.flush()
    }
}

impl<B: NetBackend> EventLoop<'_, B> {
    /// The tuning in force with adaptation applied: starts, re-bounds or stops the adapter as
    /// the operator's `adaptive` says, and puts its choices in place of the fixed
    /// `busy_poll_us` and `interrupt_coalescing`.
    pub(super) fn follow_adaptive(&mut self, mut tuning: NetTuning) -> NetTuning {
        let bounds = tuning.adaptive;
        match (&mut self.adapter, bounds.enabled) {
            (None, true) => self.adapter = Some(Adapter::new(bounds)),
            // Values now outside the bounds come down; they are read back below.
            (Some(adapter), true) => _ = adapter.set_bounds(bounds),
            (Some(_), false) => {
                self.adapter = None;
                self.idle_since = None;
                self.interval_start = None;
                self.seen = Observed::default();
            }
            (None, false) => {}
        }
        self.kick_follows_load = false;
        if let Some(adapter) = &self.adapter {
            tuning.busy_poll_us = adapter.busy_poll_us();
            tuning.interrupt_coalescing = adapter.coalescing();
            // The operator's kick coalescing, where set, wins.
            if !tuning.kick_coalescing.is_enabled() {
                tuning.kick_coalescing = adapter.kick_coalescing();
                self.kick_follows_load = true;
            }
        }
        if !self.kick_follows_load {
            self.trickle.reset();
        }
        self.publish_adaptive();
        tuning
    }

    /// The operator's side of the coalescing: the adapter's choice while adapting, else the
    /// fixed `interrupt_coalescing`.
    pub(super) fn operator_coalescing(&self, tuning: &NetTuning) -> InterruptCoalescing {
        self.adapter
            .as_ref()
            .map_or(tuning.interrupt_coalescing, Adapter::coalescing)
    }

    /// A guest's NOTF_COAL bounds as the device applies them: while adapting, the time bound
    /// never exceeds the operator's `adaptive.max_coalesce_usecs` (0: coalescing off).
    pub(super) fn bounded_guest_coalescing(
        &self,
        bounds: InterruptCoalescing,
    ) -> InterruptCoalescing {
        let Some(max) = self.adapter.as_ref().map(|a| a.bounds().max_coalesce_usecs) else {
            return bounds;
        };
        if bounds.max_usecs <= max {
            bounds
        } else if max == 0 {
            InterruptCoalescing::OFF
        } else {
            InterruptCoalescing {
                max_usecs: max,
                ..bounds
            }
        }
    }

    /// Adapting: the worker is about to sleep; its idle gap began now, or when the busy-poll
    /// window that just ran out began.
    pub(super) fn going_idle(&mut self) {
        if self.adapter.is_none() || self.idle_since.is_some() {
            return;
        }
        // A timed sleep costs two clock reads, the others a count.
        self.sleeps = self.sleeps.saturating_add(1);
        if !times_sleep(self.sleeps) {
            self.window_ran_out = false;
            return;
        }
        let now = Instant::now();
        let window = std::mem::take(&mut self.window_ran_out).then_some(self.busy_poll);
        self.idle_since = Some(window.and_then(|w| now.checked_sub(w)).unwrap_or(now));
    }

    /// The worker woke while idle: a wake-up on work (a kick or the backend) ends the idle
    /// gap and tells the adapter how long it was; other wake-ups (timers, the API) do not.
    pub(super) fn woke(&mut self, events: &[EpollEvent]) -> Result<(), WorkerError> {
        let on_work = events.iter().any(|e| {
            matches!(
                Token::from_data(e.data()),
                Some(Token::TxKick | Token::RxKick | Token::Backend)
            )
        });
        let (true, Some(adapter), Some(since)) = (on_work, &self.adapter, self.idle_since) else {
            return Ok(());
        };
        self.idle_since = None;
        let now = Instant::now();
        let gap = now.saturating_duration_since(since);
        if gap <= Duration::from_micros(adapter.bounds().max_busy_poll_us.into()) {
            self.seen.short_gaps += 1;
            // Within the bound, so within u32 microseconds.
            let us = u32::try_from(gap.as_micros()).unwrap_or(u32::MAX);
            self.seen.longest_short_gap_us = self.seen.longest_short_gap_us.max(us);
        } else {
            self.seen.long_gaps += 1;
        }
        self.interval_check(now)
    }

    /// Ends the adaptation interval if it is over by `now`, a clock reading the worker took
    /// anyway (a busy-poll window's start, a timed sleep's end) or one in
    /// [`ADAPT_CHECK_ROUNDS`] rounds. No timer of its own: a timer's interrupt on the core a
    /// window polls from would delay the frame it waits for (1 in ~50 round trips of a
    /// ping-pong at 1 ms intervals, all of its p99); an idle worker has nothing to decide.
    pub(super) fn interval_check(&mut self, now: Instant) -> Result<(), WorkerError> {
        let (Some(adapter), Some(start)) = (&self.adapter, self.interval_start) else {
            return Ok(());
        };
        let every = Duration::from_micros(adapter.interval_us().into());
        if now.saturating_duration_since(start) < every {
            return Ok(());
        }
        self.end_interval(start, now)
    }

    /// An adaptation interval ended: the adapter decides, the worker applies. An interval
    /// that saw nothing starts no other until frames come back.
    fn end_interval(&mut self, start: Instant, now: Instant) -> Result<(), WorkerError> {
        let Some(adapter) = &mut self.adapter else {
            return Ok(());
        };
        let mut seen = std::mem::take(&mut self.seen);
        let elapsed = now.saturating_duration_since(start);
        seen.elapsed_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        seen.guest_coalesces = self.guest_coalescing != [None, None];
        // Without EVENT_IDX the driver's kicks cannot be put off; the operator's setting wins.
        let acked_event_idx = self.acked_features & 1 << VIRTIO_RING_F_EVENT_IDX != 0;
        seen.kicks_fixed =
            !acked_event_idx || self.tuning_shared.load().kick_coalescing.is_enabled();
        let idle = seen.frames == 0 && seen.short_gaps + seen.long_gaps == 0;
        let was = adapter.busy_poll_us();
        let was_coalescing = adapter.coalescing();
        let decision = adapter.observe(seen);
        if let Some(us) = decision.busy_poll_us {
            debug!(
                "virtio-net {}: adaptive busy-poll {was} -> {us} µs after {seen:?}",
                self.label
            );
            self.busy_poll = Duration::from_micros(us.into());
        }
        if let Some(coalescing) = decision.coalescing {
            debug!(
                "virtio-net {}: adaptive coalescing {} -> {} µs after {seen:?}",
                self.label, was_coalescing.max_usecs, coalescing.max_usecs
            );
            let event_idx = self.tuning_shared.load().event_idx;
            let moderation = self
                .moderator
                .retune(event_idx, self.coalescing(coalescing));
            self.apply(moderation)?;
        }
        if let Some(kicks) = decision.kick_coalescing {
            debug!(
                "virtio-net {}: adaptive kick coalescing {} buffers, {} µs after {seen:?}",
                self.label, kicks.max_packets, kicks.max_usecs
            );
            if !seen.kicks_fixed {
                self.set_kick_coalescing(kicks);
            }
        }
        let floods = self.adapter.as_ref().is_some_and(Adapter::kick_floods);
        if self.trickle.trickles() && floods {
            // The interval ran at the flood's rate: the looks' trickle was a dip.
            self.trickle.reset();
            self.kick_quiet = false;
        }
        self.publish_adaptive();
        self.start_interval((!idle).then_some(now));
        Ok(())
    }

    /// The next adaptation interval starts `at` (`None`: when frames come), its sleeps counted
    /// from 1 (an idle device's sleeps belong to no interval).
    fn start_interval(&mut self, at: Option<Instant>) {
        self.interval_start = at;
        self.sleeps = 0;
    }

    /// Publishes the adapter's choices (pair 0's) and its counts.
    pub(super) fn publish_adaptive(&mut self) {
        let m = &self.metrics.adaptive;
        if let Some(adapter) = &mut self.adapter {
            let c = std::mem::take(&mut adapter.counters);
            m.intervals.add(c.intervals);
            m.busy_poll_changes.add(c.busy_poll_changes);
            m.coalescing_changes.add(c.coalescing_changes);
            m.kick_coalescing_changes.add(c.kick_coalescing_changes);
        }
        if self.pair == 0 {
            let (busy_poll, coalescing, kicks) = self.adapter.as_ref().map_or(
                (0, InterruptCoalescing::OFF, KickCoalescing::default()),
                |a| (a.busy_poll_us(), a.coalescing(), a.kick_coalescing()),
            );
            m.enabled.set(u64::from(self.adapter.is_some()));
            m.busy_poll_us.set(busy_poll.into());
            m.coalesce_usecs.set(coalescing.max_usecs.into());
            m.coalesce_packets.set(coalescing.max_packets.into());
            m.kick_coalesce_packets.set(kicks.max_packets.into());
            m.kick_coalesce_usecs.set(kicks.max_usecs.into());
        }
    }
}
