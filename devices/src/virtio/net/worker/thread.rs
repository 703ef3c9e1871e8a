//! The worker thread: its spawn, the commands the device sends it (seccomp, start, stop,
//! per-queue reset and enable), and its body, which waits for commands between runs.

use std::io;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Instant;

use log::error;
use seccompiler::BpfProgram;
use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

use super::super::link::{GuestMac, LinkControl};
use super::super::metrics::NetMetrics;
use super::super::rx::RxMode;
use super::super::tuning::TuningShared;
use super::pacing::nonblocking_timerfd;
use super::EventLoop;
use crate::backend::{NetBackend, Offloads};
use crate::virtio::ring::{AnyRing, RingPosition};
use crate::virtio::{ActivateError, VirtioInterrupt};

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

pub(super) enum Command {
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
pub(super) struct ThreadParts {
    pub(super) commands: Receiver<Command>,
    /// Written after a command is sent: read during a run (epoll), drained between runs.
    pub(super) command_ready: EventFd,
    pub(super) stop: EventFd,
    pub(super) timer: TimerFd,
    /// A sleeping busy-poll's wait between looks ([`NetTuning::busy_poll_sleep_us`]).
    pub(super) poll_timer: TimerFd,
    /// Kick coalescing's look at the tx ring ([`NetTuning::kick_coalescing`]).
    pub(super) kick_timer: TimerFd,
    pub(super) tx_throttle: Throttle,
    pub(super) rx_throttle: Throttle,
    pub(super) tuning_changed: EventFd,
}

/// A queue stopped by its rate limiter: the timer that ends the stop, and when it began.
pub(super) struct Throttle {
    pub(super) timer: TimerFd,
    pub(super) since: Option<Instant>,
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
