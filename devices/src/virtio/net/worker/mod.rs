//! The per-device worker thread and its epoll loop.
//!
//! The thread is started with the device (on the thread that builds the VM) and lives as long
//! as the device. Between activations it waits for commands; at activation it receives the
//! queues, kick eventfds, guest memory and interrupt, and runs one epoll loop over typed tokens
//! until the device is reset. No lock is taken on any path from a kick to the backend and back
//! to the irqfd.
//!
//! Because the thread exists before the guest runs, it can confine itself with a seccomp filter
//! (`Command::Seccomp`) before it ever sees guest memory, and the vCPU thread that activates the
//! device only sends it a message: the vCPU's own filter needs no thread-creation, epoll or tap
//! system calls.
//!
//! Why a hand-written epoll loop and not the `event-manager` crate (which the VMM thread uses):
//! the datapath wants typed tokens matched in one `match` with no dynamic dispatch (event-manager
//! calls a subscriber through `MutEventSubscriber::process` per event and hands it an `Events`
//! whose data it must decode anyway), registration that changes per round (the backend fd is
//! added, modified and removed as rx pauses and tx waits, several times a second under load),
//! a zero-timeout poll when the tx budget left work, and nothing between a kick and `write` but
//! this loop. event-manager would add a layer on the hottest path and buy nothing here: the
//! loop has one owner, and its sources are fixed at activation.
//!
//! A worker run that hits a ring-level error (or panics) marks the device DEVICE_NEEDS_RESET,
//! raises a configuration interrupt and returns to waiting; the backend stays with the thread,
//! so the driver can reset the device and start over.
//!
//! By concern: this file holds the event loop and its tokens, the datapath calls (tx, rx, link)
//! and the metrics publication; `thread` the thread and its commands; `setup` prepares a run at
//! activation (backend, epoll, rings); `queues` follows queue pairs enabled and disabled and
//! single queues reset and enabled again; `control` executes the control queue's commands;
//! `pacing` holds the rate limiters' throttles, interrupt moderation and its timer, busy-poll
//! and run-time tuning; `trickle` watches a slow tx ring for kick coalescing.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{debug, error, info, warn};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use super::adapt::{times_sleep, Adapter, Observed};
use super::ctrl::{CtrlCommand, CtrlError, ACK_ERR, ACK_OK, CTRL_CHAINS_PER_CALL};
use super::link::{GuestMac, LinkControl, LinkState};
use super::metrics::{BusyPollCounters, CtrlCounters, NetMetrics, RxCounters, TxCounters};
use super::moderation::{Coalescing, Moderation, Moderator, TimerOp, RX, TX};
use super::rx::{RxQueue, RxStop, RX_GATHER_BYTES, RX_GATHER_NO_GSO_BYTES};
use super::tuning::{InterruptCoalescing, KickCoalescing, NetTuning, TuningShared};
use super::tx::{TxQueue, TxStop};
use super::BurstLog;
use super::VNET_HDR_LEN;
use crate::backend::{NetBackend, Offloads};
use crate::error_chain;
use crate::iovec::IovecList;
use crate::virtio::ring::AnyRing;
use crate::virtio::ring::{InterruptDecision, RingError};
use crate::virtio::vring::WalkBudget;
use crate::virtio::{ActivateError, VirtioInterrupt};

mod control;
mod pacing;
mod queues;
mod setup;
mod thread;
mod trickle;

pub(crate) use self::thread::{Activation, PairQueue, Shared, WorkerThread};
use self::thread::{Command, ThreadParts, Throttle};
pub use self::thread::{PairPositions, WorkerThreadError};

use self::trickle::TrickleWatch;

/// What woke the worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    /// The driver kicked the tx queue.
    TxKick,
    /// The driver kicked the rx queue (it posted buffers).
    RxKick,
    /// The backend is readable and/or writable.
    Backend,
    /// The device is being reset or dropped.
    Stop,
    /// The tuning changed.
    Tuning,
    /// The interrupt-coalescing timer expired.
    CoalesceTimer,
    /// A sleeping busy-poll's wait between two looks ended.
    PollTimer,
    /// Kick coalescing's time bound: the tx ring is due a look by the device.
    KickTimer,
    /// The backend's link may have changed.
    Link,
    /// The tx rate limiter's wait is over.
    TxThrottle,
    /// The rx rate limiter's wait is over.
    RxThrottle,
    /// The driver kicked the control queue.
    CtrlKick,
    /// The device sent a command during the run (a per-queue reset or re-enable).
    Command,
}

impl Token {
    const ALL: [Token; 13] = [
        Token::TxKick,
        Token::RxKick,
        Token::Backend,
        Token::Stop,
        Token::Tuning,
        Token::CoalesceTimer,
        Token::PollTimer,
        Token::KickTimer,
        Token::Link,
        Token::TxThrottle,
        Token::RxThrottle,
        Token::CtrlKick,
        Token::Command,
    ];

    fn data(self) -> u64 {
        self as u64
    }

    fn from_data(data: u64) -> Option<Token> {
        Token::ALL.into_iter().find(|t| t.data() == data)
    }
}

/// Why a worker run stopped on its own.
#[derive(Debug, thiserror::Error)]
enum WorkerError {
    #[error("epoll failed")]
    Epoll(#[source] io::Error),
    #[error("reading a kick eventfd failed")]
    Kick(#[source] io::Error),
    #[error("the {queue} queue is broken")]
    Ring {
        queue: &'static str,
        #[source]
        source: RingError,
    },
    #[error("signalling the guest failed")]
    Interrupt(#[source] io::Error),
    #[error(
        "a timer (interrupt coalescing, a rate limiter's stop or the busy-poll's sleep) failed"
    )]
    Timer(#[source] io::Error),
}

/// The control queue of a run, and the storage its chain walks reuse.
struct CtrlQueue {
    vq: AnyRing,
    kick: EventFd,
    buffers: CtrlBuffers,
}

/// The storage the control queue's chain walks and commands reuse.
#[derive(Default)]
struct CtrlBuffers {
    readable: Vec<libc::iovec>,
    writable: Vec<libc::iovec>,
    /// The command's readable bytes, copied once out of guest memory (the driver cannot
    /// change them between the checks and the execution).
    request: Vec<u8>,
    /// The reply being built.
    reply: Vec<u8>,
}

/// What the driver set over the control queue that has no effect on a tap, recorded (and
/// logged) as the device's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct RxFilter {
    promisc: bool,
    allmulti: bool,
    unicast_entries: u32,
    multicast_entries: u32,
}

/// A running worker's state.
struct EventLoop<'p, B> {
    label: Arc<str>,
    rx: RxQueue,
    tx: TxQueue,
    rx_kick: EventFd,
    tx_kick: EventFd,
    backend: B,
    interrupt: Arc<VirtioInterrupt>,
    metrics: Arc<NetMetrics>,
    tuning_shared: Arc<TuningShared>,
    link: LinkControl,
    /// Rx read failures, logged once per burst.
    rx_errors: BurstLog,
    parts: &'p mut ThreadParts,
    epoll: Epoll,
    /// Interrupt decisions, coalescing and the EVENT_IDX override (the knobs in force).
    moderator: Moderator,
    rx_counters: RxCounters,
    tx_counters: TxCounters,
    /// Whether rx reads the backend, and if not, what it waits for.
    rx_hold: RxHold,
    /// The backend refused a frame with EAGAIN: waiting for it to become writable.
    tx_waiting: bool,
    /// process_tx stopped on its budget with frames left: run it again after the other events.
    tx_more: bool,
    /// The tx queue drained with the driver's notifications left off (busy-poll on): poll it,
    /// then re-enable them before sleeping.
    tx_parked: bool,
    /// A busy-poll saw an epoll event ready: the next wait must not sleep.
    events_pending: bool,
    /// The busy-poll window (zero: off).
    busy_poll: Duration,
    /// The busy-poll's sleep between looks (zero: it spins).
    poll_sleep: Duration,
    /// Kick coalescing (off: `max_packets` 0).
    kick_coalescing: KickCoalescing,
    /// Kick coalescing's last look found the tx ring empty: the driver is asked to kick at its
    /// next buffer until a kick or a look finds work.
    kick_quiet: bool,
    /// The kick coalescing in force is the adapter's (the operator fixed none).
    kick_follows_load: bool,
    /// The adapter's kick coalescing, watched look by look for a trickle.
    trickle: TrickleWatch,
    /// What the busy-poll found.
    poll_counters: BusyPollCounters,
    /// Polling time not yet published (below a microsecond).
    polled_ns: u64,
    /// The backend reached end of file: never polled again.
    backend_gone: bool,
    /// The rate-limiter change count applied.
    limiter_generation: u64,
    /// What the backend fd is registered for in epoll (empty: not registered).
    registered: EventSet,
    /// The control queue (CTRL_VQ negotiated).
    ctrl: Option<CtrlQueue>,
    ctrl_counters: CtrlCounters,
    /// The control queue stopped on its per-call bound with chains left.
    ctrl_more: bool,
    acked_features: u64,
    /// The coalescing the guest set with NOTF_COAL, `[rx, tx]` (None: the operator's).
    guest_coalescing: [Option<InterruptCoalescing>; 2],
    /// The operator's coalescing change count last seen.
    operator_coalescing_seen: u64,
    guest_mac: Arc<GuestMac>,
    rx_filter: RxFilter,
    /// Refused control commands, logged once per burst.
    ctrl_errors: BurstLog,
    /// This worker's queue pair.
    pair: usize,
    /// The device's queue pairs (`max_virtqueue_pairs`).
    pairs: u16,
    /// The pairs the driver set up (what VQ_PAIRS_SET may ask for).
    usable_pairs: u16,
    /// The pair is in use (pair 0 always; pair i once the driver enabled more than i pairs
    /// with VQ_PAIRS_SET): a disabled pair's kicks and backend are not polled.
    enabled: bool,
    /// Device-side adaptation (`adaptive=on`).
    adapter: Option<Adapter>,
    /// What the current adaptation interval showed so far.
    seen: Observed,
    /// When the current adaptation interval began (None: none runs until frames come).
    interval_start: Option<Instant>,
    /// Rounds while adapting: the clock is read for the interval's end every
    /// [`pacing::ADAPT_CHECK_ROUNDS`] of them (where nothing else reads it).
    rounds: u32,
    /// The last busy-poll window ended with nothing found (the idle gap began before it).
    window_ran_out: bool,
    /// Adapting: when the device last ran out of work (a busy-poll window that ran out
    /// included), until work wakes it; only for the sleeps that are timed.
    idle_since: Option<Instant>,
    /// Sleeps in this adaptation interval (those [`times_sleep`] picks are timed).
    sleeps: u32,
}

/// Whether rx reads the backend, and if not, what resumes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RxHold {
    /// Reading whenever the backend has frames.
    Reading,
    /// Out of buffers (or the queue reset) with the driver's notifications on: until its rx
    /// kick, or the buffers a busy-poll sees.
    Buffers,
    /// Out of buffers with the driver's notifications left off (busy-poll on): the busy-poll
    /// watches the avail ring, and re-enables them when its window runs out.
    Parked,
    /// A backend read failed: only the driver's next rx kick resumes it, never a busy-poll
    /// that sees buffers (it would read and fail again and again).
    Failed,
}

impl<'p, B: NetBackend> EventLoop<'p, B> {
    /// Runs until stopped or failed, then hands the backend back with where the rings stand
    /// (the rx chains popped ahead of frames handed back to the ring first).
    fn run_to_end(mut self) -> (B, PairPositions) {
        let result = panic::catch_unwind(AssertUnwindSafe(|| self.run()));
        let failure = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(error_chain(&e)),
            Err(_) => Some("the worker panicked".to_owned()),
        };
        self.publish();
        if let Some(why) = failure {
            error!(
                "virtio-net {}: worker stopped, device needs reset: {why}",
                self.label
            );
            self.metrics.needs_reset_events.add(1);
            if let Err(e) = self.interrupt.set_needs_reset() {
                error!(
                    "virtio-net {}: failed to signal DEVICE_NEEDS_RESET: {e}",
                    self.label
                );
            }
        }
        if self.pair == 0 {
            // A reset forgets what the guest set: the operator's coalescing is in force again.
            self.tuning_shared.set_guest(RX, None);
            self.tuning_shared.set_guest(TX, None);
        } else if let Err(e) = self.backend.set_queue_enabled(false) {
            // Not polled until the next run enables it: the host should not steer to it.
            warn!(
                "virtio-net {}: queue pair {}: cannot detach its backend queue: {e}",
                self.label, self.pair
            );
        }
        // The timers must not fire into the next run.
        let _ = self.parts.timer.clear();
        let _ = self.parts.poll_timer.clear();
        let _ = self.parts.kick_timer.clear();
        self.parts.tx_throttle.reset();
        self.parts.rx_throttle.reset();
        self.rx.give_back();
        let positions = PairPositions {
            rx: self.rx.ring().map(AnyRing::position),
            tx: self.tx.ring().map(AnyRing::position),
            ctrl: self.ctrl.as_ref().map(|c| c.vq.position()),
        };
        (self.backend, positions)
    }

    /// Waits for events: sleeps unless tx work is left over or events were seen while polling
    /// (then only looks at what is ready). `None`: interrupted by a signal.
    fn wait(&mut self, events: &mut [EpollEvent]) -> Result<Option<usize>, WorkerError> {
        let timeout = if self.tx_more || self.ctrl_more || self.events_pending {
            0
        } else {
            -1
        };
        self.events_pending = false;
        if timeout < 0 {
            self.going_idle();
        }
        let n = match self.epoll.wait(timeout, events) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(None),
            Err(e) => return Err(WorkerError::Epoll(e)),
        };
        if self.idle_since.is_some() {
            self.woke(&events[..n])?;
        }
        Ok(Some(n))
    }

    fn run(&mut self) -> Result<(), WorkerError> {
        // Kicks and frames may have arrived before activation.
        self.run_tx(self.parks())?;
        self.run_rx()?;
        self.run_ctrl()?;
        self.flush()?;
        let mut events = [EpollEvent::default(); 8];
        loop {
            if self.polls() && !self.events_pending {
                self.busy_poll()?;
            }
            let Some(n) = self.wait(&mut events)? else {
                continue;
            };
            for event in &events[..n] {
                match Token::from_data(event.data()) {
                    Some(Token::Stop) => return Ok(()),
                    Some(Token::TxKick) => {
                        self.tx_counters.kicks += drain(&self.tx_kick)?;
                        self.kicked()?;
                    }
                    Some(Token::RxKick) => {
                        self.rx_counters.kicks += drain(&self.rx_kick)?;
                        self.resume_rx()?;
                    }
                    Some(Token::Backend) => self.backend_ready(event.event_set())?,
                    Some(Token::Tuning) => {
                        drain(&self.parts.tuning_changed)?;
                        self.retune()?;
                        self.sync_enabled()?;
                    }
                    Some(Token::CoalesceTimer) => self.timer_expired()?,
                    // Ended a sleep a busy-poll left for another event: nothing to do.
                    Some(Token::PollTimer) => _ = self.parts.poll_timer.wait(),
                    Some(Token::KickTimer) => self.kick_look()?,
                    Some(Token::Link) => self.link_changed(),
                    Some(Token::TxThrottle) => {
                        self.unthrottle_tx()?;
                        self.run_tx(self.parks())?;
                    }
                    Some(Token::RxThrottle) => {
                        self.unthrottle_rx()?;
                        self.run_rx()?;
                    }
                    Some(Token::CtrlKick) => {
                        if let Some(ctrl) = &self.ctrl {
                            self.ctrl_counters.kicks += drain(&ctrl.kick)?;
                        }
                        self.run_ctrl()?;
                    }
                    Some(Token::Command) => self.commands()?,
                    None => warn!(
                        "virtio-net {}: unknown epoll token {}",
                        self.label,
                        event.data()
                    ),
                }
            }
            if self.tx_more {
                self.run_tx(self.parks())?;
            }
            if self.ctrl_more {
                self.run_ctrl()?;
            }
            self.flush()?;
        }
    }

    /// Carries out the commands the device sent during the run (per-queue reset and enable).
    fn commands(&mut self) -> Result<(), WorkerError> {
        drain(&self.parts.command_ready)?;
        while let Ok(command) = self.parts.commands.try_recv() {
            match command {
                Command::ResetQueue(queue, reply) => {
                    self.reset_queue(queue)?;
                    // The device may have stopped waiting (it polls later, or was reset).
                    let _ = reply.send(());
                }
                Command::EnableQueue(queue, vq) => self.enable_queue(queue, *vq)?,
                // The device sends these only between runs (it stops a run first); dropping
                // the reply refuses them.
                Command::Seccomp(..) | Command::Start(..) => {
                    error!("virtio-net {}: lifecycle command during a run", self.label)
                }
            }
        }
        Ok(())
    }

    /// Whether a drained tx queue, or an rx queue out of buffers, stays parked (notifications
    /// off): with busy-poll on, for [`EventLoop::busy_poll`].
    fn parks(&self) -> bool {
        !self.busy_poll.is_zero()
    }

    /// Whether the loop busy-polls before it sleeps: a queue is parked (always polled, and
    /// unparked at once when busy-poll is off), or rx waits with busy-poll on.
    fn polls(&self) -> bool {
        self.tx_parked || self.rx_hold == RxHold::Parked || self.rx_polls()
    }

    /// Whether rx waits with busy-poll on, for backend input or for the driver's buffers: the
    /// worker then polls for the window before it sleeps, whatever tx does.
    fn rx_polls(&self) -> bool {
        !self.busy_poll.is_zero()
            && (self.registered.contains(EventSet::IN) || self.rx_waits_for_buffers())
    }

    /// Rx is paused until the driver posts buffers (not by a read failure), on an attached
    /// queue of an enabled pair whose backend still delivers.
    fn rx_waits_for_buffers(&self) -> bool {
        matches!(self.rx_hold, RxHold::Buffers | RxHold::Parked)
            && self.enabled
            && !self.backend_gone
            && self.rx.is_attached()
    }

    /// Sends what the driver queued; `park`: leave a drained queue's notifications off.
    fn run_tx(&mut self, park: bool) -> Result<(), WorkerError> {
        self.tx_more = false;
        if !self.enabled
            || !self.tx.is_attached()
            || self.tx_waiting
            || self.parts.tx_throttle.is_on()
        {
            return Ok(());
        }
        let ahead = if self.kick_quiet {
            0
        } else {
            self.kick_coalescing.max_packets
        };
        self.tx.set_kick_ahead(ahead);
        let (backend, counters) = (&mut self.backend, &mut self.tx_counters);
        let outcome = self
            .tx
            .run(backend, counters, park)
            .map_err(|source| WorkerError::Ring {
                queue: "tx",
                source,
            })?;
        self.moderator
            .batch(TX, outcome.needs_interrupt, outcome.suppressed_by_event_idx);
        self.tx_parked = outcome.stop == TxStop::Idle;
        match outcome.stop {
            // Asleep with the next kick `ahead` buffers away: fewer are the device's to find.
            TxStop::Drained if ahead > 0 => self.arm_kick_timer()?,
            TxStop::Drained | TxStop::Idle => {}
            TxStop::BackendFull => {
                self.tx_waiting = true;
                self.update_backend_interest().map_err(WorkerError::Epoll)?;
            }
            // Come back after the other pending events: the driver will not kick for these.
            TxStop::Budget => self.tx_more = true,
            TxStop::Throttled(wait) => self.parts.tx_throttle.start(wait)?,
        }
        Ok(())
    }

    fn run_rx(&mut self) -> Result<(), WorkerError> {
        self.run_rx_with(self.parks())
    }

    /// Receives what the backend has into the driver's buffers; `park`: out of buffers, leave
    /// the driver's notifications off.
    fn run_rx_with(&mut self, park: bool) -> Result<(), WorkerError> {
        if !self.enabled
            || !self.rx.is_attached()
            || self.rx_hold != RxHold::Reading
            || self.backend_gone
            || self.parts.rx_throttle.is_on()
        {
            return Ok(());
        }
        let outcome = self
            .rx
            .run::<_, false>(&mut self.backend, &mut self.rx_counters, park)
            .map_err(|source| WorkerError::Ring {
                queue: "rx",
                source,
            })?;
        self.moderator
            .batch(RX, outcome.needs_interrupt, outcome.suppressed_by_event_idx);
        match outcome.stop {
            // Level-triggered epoll reports the backend again if frames remain.
            RxStop::BackendEmpty | RxStop::Budget | RxStop::Yielded => {}
            RxStop::NoBuffers => self.rx_hold = RxHold::Buffers,
            RxStop::Parked => self.rx_hold = RxHold::Parked,
            RxStop::BackendFailed => {
                if let Some(more) = self.rx_errors.failure(std::time::Instant::now()) {
                    warn!(
                        "virtio-net {}: backend read failed ({more} more since the last report); \
                         rx paused until the next rx kick",
                        self.label
                    );
                }
                self.rx_hold = RxHold::Failed;
            }
            RxStop::Throttled(wait) => self.parts.rx_throttle.start(wait)?,
            RxStop::BackendClosed => {
                info!(
                    "virtio-net {}: backend closed; it is no longer polled",
                    self.label
                );
                self.backend_gone = true;
            }
        }
        self.update_backend_interest().map_err(WorkerError::Epoll)
    }

    /// The backend's link changed: the driver sees it in the STATUS field, with a
    /// configuration interrupt.
    fn link_changed(&mut self) {
        if let Some(up) = self.backend.poll_link() {
            let state = if up { LinkState::Up } else { LinkState::Down };
            if self.link.link() != state {
                info!(
                    "virtio-net {}: backend link {}",
                    self.label,
                    if up { "up" } else { "down" }
                );
                self.link.set_link(state);
            }
        }
    }

    fn resume_rx(&mut self) -> Result<(), WorkerError> {
        self.rx_hold = RxHold::Reading;
        self.run_rx()
    }

    fn backend_ready(&mut self, events: EventSet) -> Result<(), WorkerError> {
        let failed = events.intersects(EventSet::ERROR | EventSet::HANG_UP);
        if self.tx_waiting && (events.contains(EventSet::OUT) || failed) {
            self.tx_waiting = false;
            self.update_backend_interest().map_err(WorkerError::Epoll)?;
            self.run_tx(self.parks())?;
        }
        if events.contains(EventSet::IN) || failed {
            self.run_rx()?;
        }
        Ok(())
    }

    /// Registers the backend fd for exactly what we wait for. With nothing to wait for it is
    /// removed, so that a persistent error condition (always reported) cannot spin the loop.
    fn update_backend_interest(&mut self) -> io::Result<()> {
        let mut want = EventSet::empty();
        if self.enabled && !self.backend_gone {
            if self.rx.is_attached()
                && self.rx_hold == RxHold::Reading
                && !self.parts.rx_throttle.is_on()
            {
                want |= EventSet::IN;
            }
            if self.tx_waiting {
                want |= EventSet::OUT;
            }
        }
        if want == self.registered {
            return Ok(());
        }
        let fd = self.backend.as_raw_fd();
        let op = match (self.registered.is_empty(), want.is_empty()) {
            (true, _) => ControlOperation::Add,
            (false, true) => ControlOperation::Delete,
            (false, false) => ControlOperation::Modify,
        };
        self.epoll
            .ctl(op, fd, EpollEvent::new(want, Token::Backend.data()))?;
        self.registered = want;
        Ok(())
    }

    fn publish(&mut self) {
        self.poll_counters.polled_us += self.polled_ns / 1000;
        self.polled_ns %= 1000;
        self.poll_counters.publish(&self.metrics.busy_poll);
        if let Some(pair) = self.metrics.queues.get(self.pair) {
            // Copies: `publish` zeroes what it adds.
            let (mut rx, mut tx) = (self.rx_counters, self.tx_counters);
            rx.publish(&pair.rx);
            tx.publish(&pair.tx);
        }
        self.rx_counters.publish(&self.metrics.rx);
        self.tx_counters.publish(&self.metrics.tx);
        self.ctrl_counters.publish(&self.metrics.ctrl);
        let c = std::mem::take(&mut self.moderator.counters);
        self.metrics.interrupts_held.add(c.interrupts_held);
        self.metrics
            .coalesce_packet_releases
            .add(c.coalesce_packet_releases);
        self.metrics
            .coalesce_timer_releases
            .add(c.coalesce_timer_releases);
        self.metrics.event_idx_overrides.add(c.event_idx_overrides);
    }
}

/// Reads a kick eventfd; returns how many kicks it counted (0 if it was already drained).
fn drain(kick: &EventFd) -> Result<u64, WorkerError> {
    match kick.read() {
        Ok(n) => Ok(n),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
        Err(e) => Err(WorkerError::Kick(e)),
    }
}

fn io_err(e: vmm_sys_util::errno::Error) -> io::Error {
    io::Error::from_raw_os_error(e.errno())
}
