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
//! By concern: this file holds the thread and its commands, the event loop and its tokens, the
//! datapath calls (tx, rx, link) and the metrics publication; `setup` prepares a run at
//! activation (backend, epoll, rings); `control` executes the control queue's commands;
//! `pacing` holds the rate limiters' throttles, interrupt moderation and its timer, busy-poll
//! and run-time tuning.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use log::{debug, error, info, warn};
use seccompiler::BpfProgram;
use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

use super::adapt::{times_sleep, Adapter, Observed};
use super::ctrl::{CtrlCommand, CtrlError, ACK_ERR, ACK_OK, CTRL_CHAINS_PER_CALL};
use super::link::{GuestMac, LinkControl, LinkState};
use super::metrics::{BusyPollCounters, CtrlCounters, NetMetrics, RxCounters, TxCounters};
use super::moderation::{Coalescing, Moderation, Moderator, TimerOp, RX, TX};
use super::rx::{RxMode, RxQueue, RxStop, RX_GATHER_BYTES, RX_GATHER_NO_GSO_BYTES};
use super::tuning::{InterruptCoalescing, KickCoalescing, NetTuning, TuningShared};
use super::tx::{TxQueue, TxStop};
use super::BurstLog;
use super::VNET_HDR_LEN;
use crate::backend::{NetBackend, Offloads};
use crate::error_chain;
use crate::iovec::IovecList;
use crate::virtio::ring::AnyRing;
use crate::virtio::ring::{InterruptDecision, RingError, RingPosition};
use crate::virtio::vring::WalkBudget;
use crate::virtio::{ActivateError, VirtioInterrupt};

mod control;
mod pacing;
mod setup;
mod trickle;

use self::pacing::nonblocking_timerfd;
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

/// Errors of the worker thread outside a run.
#[derive(Debug, thiserror::Error)]
pub enum WorkerThreadError {
    /// The thread or its eventfds could not be created.
    #[error("cannot start the worker thread")]
    Spawn(#[source] io::Error),
    /// The thread is gone (it panicked outside its loop).
    #[error("the worker thread is gone")]
    Gone,
    /// Installing the seccomp filter failed.
    #[error("cannot install the worker's seccomp filter")]
    Seccomp(#[source] seccompiler::Error),
    /// A filter can only be installed while the worker is idle (before activation); or the
    /// worker has not read the commands already sent to it.
    #[error("the worker is busy (running, or commands unread)")]
    Busy,
    /// A queue command needs a running worker.
    #[error("the worker is not running")]
    NotRunning,
}

/// Everything a worker run owns, handed over at activation.
pub(crate) struct Activation {
    pub(crate) mem: GuestMemoryMmap,
    pub(crate) rx: Queue,
    pub(crate) tx: Queue,
    pub(crate) rx_kick: EventFd,
    pub(crate) tx_kick: EventFd,
    /// The control queue and its kick, when VIRTIO_NET_F_CTRL_VQ was negotiated.
    pub(crate) ctrl: Option<(Queue, EventFd)>,
    /// The negotiated features (what the control commands may use).
    pub(crate) acked_features: u64,
    pub(crate) rx_mode: RxMode,
    /// The offloads to set on the backend for the negotiated features.
    pub(crate) offloads: Offloads,
    pub(crate) interrupt: Arc<VirtioInterrupt>,
    /// The queue pairs the driver set up (pairs `0..usable_pairs`): what VQ_PAIRS_SET may
    /// enable.
    pub(crate) usable_pairs: u16,
    /// Where each ring resumes (none: the queue's indexes, a packed ring's start).
    pub(crate) positions: PairPositions,
}

/// Where the rings of one worker stand, each `None` where the run had no such ring (a queue
/// reset and not enabled again, no control queue).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PairPositions {
    /// The receive queue's ring.
    pub rx: Option<RingPosition>,
    /// The transmit queue's ring.
    pub tx: Option<RingPosition>,
    /// The control queue's ring (pair 0 only).
    pub ctrl: Option<RingPosition>,
}

/// What the device shares with its worker for the device's whole life.
pub(crate) struct Shared {
    /// The device's name in log lines (its tap).
    pub(crate) label: Arc<str>,
    pub(crate) metrics: Arc<NetMetrics>,
    pub(crate) tuning: Arc<TuningShared>,
    /// The link status the driver sees, following the backend's link.
    pub(crate) link: LinkControl,
    /// The MAC address the driver set (config space).
    pub(crate) guest_mac: Arc<GuestMac>,
    /// This worker's queue pair (0: the first, which also serves the control queue).
    pub(crate) pair: usize,
    /// The device's queue pairs (`max_virtqueue_pairs`).
    pub(crate) pairs: u16,
}

/// One of a pair's two datapath queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PairQueue {
    Rx,
    Tx,
}

enum Command {
    Seccomp(Arc<BpfProgram>, SyncSender<Result<(), seccompiler::Error>>),
    Start(Box<Activation>, SyncSender<Result<(), ActivateError>>),
    /// Per-queue reset during a run: stop using the queue, then answer.
    ResetQueue(PairQueue, SyncSender<()>),
    /// Use the reset queue again on this ring (validated by the device).
    EnableQueue(PairQueue, Box<AnyRing>),
}

/// Commands that may wait in the channel: a reset of each of the pair's queues, or a reset and
/// an enable (the transport sends an enable only after the reset was answered).
const COMMAND_CAPACITY: usize = 4;

/// The device's grip on its worker thread.
pub(crate) struct WorkerThread {
    /// `None` once the thread has been told to exit.
    commands: Option<SyncSender<Command>>,
    /// Wakes a running worker to read `commands`.
    command_ready: EventFd,
    /// One message at the end of every run (stopped, or failed on its own): where its rings
    /// stand.
    stopped: Receiver<PairPositions>,
    stop: EventFd,
    running: bool,
    thread: Option<JoinHandle<()>>,
    /// The thread's name (`net-TAP`), for log lines.
    name: String,
}

/// The thread's long-lived file descriptors, and its command channel.
struct ThreadParts {
    commands: Receiver<Command>,
    /// Written after a command is sent: read during a run (epoll), drained between runs.
    command_ready: EventFd,
    stop: EventFd,
    timer: TimerFd,
    /// A sleeping busy-poll's wait between looks ([`NetTuning::busy_poll_sleep_us`]).
    poll_timer: TimerFd,
    /// Kick coalescing's look at the tx ring ([`NetTuning::kick_coalescing`]).
    kick_timer: TimerFd,
    tx_throttle: Throttle,
    rx_throttle: Throttle,
    tuning_changed: EventFd,
}

/// A queue stopped by its rate limiter: the timer that ends the stop, and when it began.
struct Throttle {
    timer: TimerFd,
    since: Option<Instant>,
}

impl ThreadParts {
    fn new(
        tuning: &TuningShared,
        pair: usize,
        commands: Receiver<Command>,
    ) -> io::Result<ThreadParts> {
        Ok(ThreadParts {
            commands,
            command_ready: EventFd::new(EFD_NONBLOCK)?,
            stop: EventFd::new(EFD_NONBLOCK)?,
            timer: nonblocking_timerfd()?,
            poll_timer: nonblocking_timerfd()?,
            kick_timer: nonblocking_timerfd()?,
            tx_throttle: Throttle::new()?,
            rx_throttle: Throttle::new()?,
            tuning_changed: tuning
                .changed
                .get(pair)
                .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?
                .try_clone()?,
        })
    }
}

impl WorkerThread {
    /// Starts the thread that will run `backend`'s datapath. On failure the backend is handed
    /// back.
    pub(crate) fn spawn<B: NetBackend>(
        name: &str,
        backend: B,
        shared: Shared,
    ) -> Result<WorkerThread, (io::Error, B)> {
        let (command_tx, command_rx) = mpsc::sync_channel(COMMAND_CAPACITY);
        let parts = match ThreadParts::new(&shared.tuning, shared.pair, command_rx) {
            Ok(parts) => parts,
            Err(e) => return Err((e, backend)),
        };
        let (stop, command_ready) = match (parts.stop.try_clone(), parts.command_ready.try_clone())
        {
            (Ok(stop), Ok(ready)) => (stop, ready),
            (Err(e), _) | (_, Err(e)) => return Err((e, backend)),
        };
        let (stopped_tx, stopped_rx) = mpsc::sync_channel(1);
        // The backend is sent after the thread exists, so a failed spawn keeps it here.
        let (backend_tx, backend_rx) = mpsc::sync_channel::<B>(1);
        let spawned = thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || thread_main(backend_rx, stopped_tx, parts, shared));
        let thread = match spawned {
            Ok(thread) => thread,
            Err(e) => return Err((e, backend)),
        };
        if let Err(mpsc::SendError(backend)) = backend_tx.send(backend) {
            return Err((io::Error::other("worker thread exited early"), backend));
        }
        Ok(WorkerThread {
            commands: Some(command_tx),
            command_ready,
            stopped: stopped_rx,
            stop,
            running: false,
            thread: Some(thread),
            name: name.to_owned(),
        })
    }

    /// Installs `filter` on the worker thread (it then applies to every later run).
    pub(crate) fn apply_seccomp(&self, filter: Arc<BpfProgram>) -> Result<(), WorkerThreadError> {
        if self.running {
            // The thread only reads commands between runs.
            return Err(WorkerThreadError::Busy);
        }
        let (reply_tx, reply_rx) = mpsc::sync_channel(1);
        self.send(Command::Seccomp(filter, reply_tx))?;
        reply_rx
            .recv()
            .map_err(|_| WorkerThreadError::Gone)?
            .map_err(WorkerThreadError::Seccomp)
    }

    /// Starts a run; returns once the thread has taken the activation (or refused it).
    pub(crate) fn start(&mut self, activation: Activation) -> Result<(), ActivateError> {
        self.stop();
        let (reply_tx, reply_rx) = mpsc::sync_channel(1);
        self.send(Command::Start(Box::new(activation), reply_tx))
            .map_err(|_| ActivateError::BackendUnavailable)?;
        reply_rx
            .recv()
            .map_err(|_| ActivateError::BackendUnavailable)??;
        self.running = true;
        Ok(())
    }

    /// Ends the current run, if any, and waits until the thread is idle again. Returns where
    /// the run's rings stand, every chain it took either used or handed back (none: no run,
    /// or the thread is gone).
    pub(crate) fn stop(&mut self) -> Option<PairPositions> {
        if !self.running {
            return None;
        }
        self.running = false;
        if let Err(e) = self.stop.write(1) {
            error!("{}: failed to signal the worker to stop: {e}", self.name);
        }
        match self.stopped.recv() {
            Ok(positions) => Some(positions),
            Err(_) => {
                error!("{}: the worker thread is gone; backend lost", self.name);
                None
            }
        }
    }

    /// True between a successful [`start`](Self::start) and the next [`stop`](Self::stop).
    pub(crate) fn is_running(&self) -> bool {
        self.running
    }

    /// Asks the running worker to stop using `queue` (per-queue reset). Returns at once; the
    /// receiver gets a message once the queue is stopped, or is disconnected if the run ended
    /// first (then nothing uses the queue either).
    pub(crate) fn reset_queue(&self, queue: PairQueue) -> Result<Receiver<()>, WorkerThreadError> {
        let (reply_tx, reply_rx) = mpsc::sync_channel(1);
        self.send_now(Command::ResetQueue(queue, reply_tx))?;
        Ok(reply_rx)
    }

    /// Hands the running worker the ring of a queue it reset. Returns at once.
    pub(crate) fn enable_queue(
        &self,
        queue: PairQueue,
        vq: AnyRing,
    ) -> Result<(), WorkerThreadError> {
        self.send_now(Command::EnableQueue(queue, Box::new(vq)))
    }

    /// Sends a command to a running worker without blocking, and wakes it.
    fn send_now(&self, command: Command) -> Result<(), WorkerThreadError> {
        if !self.running {
            return Err(WorkerThreadError::NotRunning);
        }
        match self.commands.as_ref().map(|c| c.try_send(command)) {
            Some(Ok(())) => {}
            Some(Err(mpsc::TrySendError::Full(_))) => return Err(WorkerThreadError::Busy),
            None | Some(Err(mpsc::TrySendError::Disconnected(_))) => {
                return Err(WorkerThreadError::Gone)
            }
        }
        self.command_ready
            .write(1)
            .map_err(|_| WorkerThreadError::Gone)
    }

    fn send(&self, command: Command) -> Result<(), WorkerThreadError> {
        self.commands
            .as_ref()
            .ok_or(WorkerThreadError::Gone)?
            .send(command)
            .map_err(|_| WorkerThreadError::Gone)
    }
}

impl Drop for WorkerThread {
    fn drop(&mut self) {
        self.stop();
        // Closing the command channel ends the thread's wait.
        self.commands = None;
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                error!("{}: worker thread panicked outside its loop", self.name);
            }
        }
    }
}

/// The thread body: waits for commands until the device goes away.
fn thread_main<B: NetBackend>(
    backend: Receiver<B>,
    stopped: SyncSender<PairPositions>,
    mut parts: ThreadParts,
    shared: Shared,
) {
    let Ok(mut backend) = backend.recv() else {
        return;
    };
    while let Ok(command) = parts.commands.recv() {
        match command {
            // Sent to a run that ended on its own: dropping the reply says "not running" (and
            // nothing uses the queue); a ring for no run is dropped.
            Command::ResetQueue(..) | Command::EnableQueue(..) => {}
            Command::Seccomp(filter, reply) => {
                // The device waits for the reply; it cannot have gone away meanwhile.
                let _ = reply.send(seccompiler::apply_filter(&filter));
            }
            Command::Start(activation, reply) => {
                match EventLoop::prepare(*activation, backend, &mut parts, &shared) {
                    Ok(event_loop) => {
                        let _ = reply.send(Ok(()));
                        let positions;
                        (backend, positions) = event_loop.run_to_end();
                        let _ = stopped.send(positions);
                    }
                    Err((error, returned)) => {
                        backend = returned;
                        let _ = reply.send(Err(error));
                    }
                }
            }
        }
    }
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
    /// Follows the driver's active queue pairs (VQ_PAIRS_SET, carried out by pair 0): a pair
    /// enabled starts polling its kicks and backend queue (attached to the tap again) and
    /// runs what is pending; a pair disabled stops polling them and detaches its tap queue.
    fn sync_enabled(&mut self) -> Result<(), WorkerError> {
        if self.pair == 0 {
            return Ok(());
        }
        let want = self.pair < self.tuning_shared.active_pairs();
        if want == self.enabled {
            return Ok(());
        }
        self.enabled = want;
        if let Err(e) = self.backend.set_queue_enabled(want) {
            warn!(
                "virtio-net {}: queue pair {}: the backend refused to {} its queue: {e}",
                self.label,
                self.pair,
                if want { "attach" } else { "detach" }
            );
        }
        Self::watch_kicks(
            &self.epoll,
            self.tx_kick.as_raw_fd(),
            self.rx_kick.as_raw_fd(),
            want,
        )
        .map_err(WorkerError::Epoll)?;
        info!(
            "virtio-net {}: queue pair {} {}",
            self.label,
            self.pair,
            if want { "enabled" } else { "disabled" }
        );
        if want {
            self.rx_hold = RxHold::Reading;
            self.update_backend_interest().map_err(WorkerError::Epoll)?;
            self.run_tx(self.parks())?;
            self.run_rx()?;
        } else {
            self.tx_parked = false;
            if self.rx_hold == RxHold::Parked {
                // Nothing polls a disabled pair; enabling it runs rx again.
                self.rx_hold = RxHold::Buffers;
            }
            self.tx_more = false;
            self.tx_waiting = false;
            self.update_backend_interest().map_err(WorkerError::Epoll)?;
        }
        Ok(())
    }

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

    /// Per-queue reset: the queue is no longer used, polled or completed; every other queue
    /// keeps running. What was completed is already published (every datapath call publishes
    /// before it returns); rx chains popped ahead of frames are dropped unused.
    fn reset_queue(&mut self, queue: PairQueue) -> Result<(), WorkerError> {
        match queue {
            PairQueue::Rx => {
                let pooled = self.rx.detach();
                // Not polling the backend until the queue is back (frames wait in the tap).
                self.rx_hold = RxHold::Buffers;
                debug!(
                    "virtio-net {}: pair {} rx queue reset ({pooled} pooled chains dropped)",
                    self.label, self.pair
                );
            }
            PairQueue::Tx => {
                self.tx.detach();
                self.tx_parked = false;
                self.tx_more = false;
                self.tx_waiting = false;
                debug!(
                    "virtio-net {}: pair {} tx queue reset",
                    self.label, self.pair
                );
            }
        }
        self.metrics.queue_resets.add(1);
        self.update_backend_interest().map_err(WorkerError::Epoll)
    }

    /// The reset queue runs again on `vq` (its rings checked by the device, like at
    /// activation); kicks that came while it was reset are dropped, and whatever the driver
    /// queued is taken at once.
    fn enable_queue(&mut self, queue: PairQueue, vq: AnyRing) -> Result<(), WorkerError> {
        let attached = match queue {
            PairQueue::Rx => self.rx.is_attached(),
            PairQueue::Tx => self.tx.is_attached(),
        };
        if attached {
            // The transport enables only a reset queue; keep the ring in use.
            error!(
                "virtio-net {}: pair {}: {queue:?} queue enabled while running",
                self.label, self.pair
            );
            return Ok(());
        }
        self.metrics.queue_reenables.add(1);
        match queue {
            PairQueue::Rx => {
                self.rx.attach(vq);
                drain(&self.rx_kick)?;
                self.resume_rx()
            }
            PairQueue::Tx => {
                self.tx.attach(vq);
                drain(&self.tx_kick)?;
                self.run_tx(self.parks())
            }
        }
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
