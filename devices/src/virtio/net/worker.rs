//! The per-device worker thread: it owns the queues, kick eventfds, backend and interrupt
//! handed over at activation, and runs one epoll loop over typed tokens. No lock is taken on
//! any path from a kick to the backend and back to the irqfd.
//!
//! A worker that hits a ring-level error (or panics) marks the device DEVICE_NEEDS_RESET,
//! raises a configuration interrupt and exits; the backend is handed back when the device is
//! reset, so the driver can start over.

use std::error::Error;
use std::io;
use std::os::fd::AsRawFd;
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use log::{error, info, warn};
use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::metrics::{NetMetrics, RxCounters, TxCounters};
use super::rx::{process_rx, RxMode, RxStop};
use super::tx::{process_tx, TxStop};
use crate::backend::NetBackend;
use crate::virtio::ring::RingError;
use crate::virtio::{ActivateError, VirtioInterrupt};

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
}

impl Token {
    fn data(self) -> u64 {
        match self {
            Token::TxKick => 0,
            Token::RxKick => 1,
            Token::Backend => 2,
            Token::Stop => 3,
        }
    }

    fn from_data(data: u64) -> Option<Token> {
        match data {
            0 => Some(Token::TxKick),
            1 => Some(Token::RxKick),
            2 => Some(Token::Backend),
            3 => Some(Token::Stop),
            _ => None,
        }
    }
}

/// Why the worker stopped on its own.
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
}

/// Everything a worker owns, as handed over at activation.
pub(crate) struct Worker<B> {
    pub(crate) mem: GuestMemoryMmap,
    pub(crate) rx: Queue,
    pub(crate) tx: Queue,
    pub(crate) rx_kick: EventFd,
    pub(crate) tx_kick: EventFd,
    pub(crate) backend: B,
    pub(crate) rx_mode: RxMode,
    pub(crate) interrupt: Arc<VirtioInterrupt>,
    pub(crate) metrics: Arc<NetMetrics>,
}

/// A worker that could not be started, with the backend handed back.
pub(crate) struct SpawnError<B> {
    pub(crate) error: ActivateError,
    pub(crate) backend: B,
}

/// The device's grip on a running worker.
pub(crate) struct WorkerHandle<B> {
    stop: EventFd,
    thread: JoinHandle<Option<B>>,
}

impl<B> WorkerHandle<B> {
    /// Stops the worker (if still running) and takes the backend back.
    pub(crate) fn stop(self) -> Option<B> {
        if let Err(e) = self.stop.write(1) {
            error!("virtio-net: failed to signal the worker to stop: {e}");
        }
        match self.thread.join() {
            Ok(backend) => backend,
            Err(_) => {
                error!("virtio-net: worker thread panicked outside its loop; backend lost");
                None
            }
        }
    }
}

impl<B: NetBackend> Worker<B> {
    /// Sets up the event loop and starts the thread.
    pub(crate) fn spawn(self, name: &str) -> Result<WorkerHandle<B>, SpawnError<B>> {
        let (epoll, stop) = match EventLoop::setup(&self) {
            Ok(parts) => parts,
            Err(e) => {
                return Err(SpawnError {
                    error: ActivateError::EventLoop(e),
                    backend: self.backend,
                })
            }
        };
        let mut event_loop = EventLoop::new(self, epoll, stop);
        if let Err(e) = event_loop.update_backend_interest() {
            return Err(SpawnError {
                error: ActivateError::EventLoop(e),
                backend: event_loop.w.backend,
            });
        }
        let stop = match event_loop.stop.try_clone() {
            Ok(stop) => stop,
            Err(e) => {
                return Err(SpawnError {
                    error: ActivateError::EventLoop(e),
                    backend: event_loop.w.backend,
                })
            }
        };
        // The loop is sent after the thread exists, so a failed spawn keeps the backend here.
        let (sender, receiver) = mpsc::sync_channel::<EventLoop<B>>(1);
        let thread = thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || receiver.recv().ok().map(EventLoop::run_to_end));
        let thread = match thread {
            Ok(thread) => thread,
            Err(e) => {
                return Err(SpawnError {
                    error: ActivateError::Spawn(e),
                    backend: event_loop.w.backend,
                })
            }
        };
        if let Err(mpsc::SendError(event_loop)) = sender.send(event_loop) {
            return Err(SpawnError {
                error: ActivateError::Spawn(io::Error::other("worker thread exited early")),
                backend: event_loop.w.backend,
            });
        }
        Ok(WorkerHandle { stop, thread })
    }
}

/// The running worker's state.
struct EventLoop<B> {
    w: Worker<B>,
    epoll: Epoll,
    stop: EventFd,
    rx_counters: RxCounters,
    tx_counters: TxCounters,
    /// Not polling the backend for input: no rx buffers (or a read error) until the next kick.
    rx_paused: bool,
    /// The backend refused a frame with EAGAIN: waiting for it to become writable.
    tx_waiting: bool,
    /// process_tx stopped on its budget with frames left: run it again after the other events.
    tx_more: bool,
    /// The backend reached end of file: never polled again.
    backend_gone: bool,
    /// What the backend fd is registered for in epoll (empty: not registered).
    registered: EventSet,
    /// Used buffers were returned this round and the guest wants an interrupt.
    irq_pending: bool,
}

impl<B: NetBackend> EventLoop<B> {
    /// The epoll set (kicks and stop registered) and the stop eventfd.
    fn setup(w: &Worker<B>) -> io::Result<(Epoll, EventFd)> {
        let epoll = Epoll::new()?;
        let stop = EventFd::new(EFD_NONBLOCK)?;
        for (fd, token) in [
            (w.tx_kick.as_raw_fd(), Token::TxKick),
            (w.rx_kick.as_raw_fd(), Token::RxKick),
            (stop.as_raw_fd(), Token::Stop),
        ] {
            epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, token.data()),
            )?;
        }
        Ok((epoll, stop))
    }

    /// The loop state; the backend is not registered yet (see `update_backend_interest`).
    fn new(w: Worker<B>, epoll: Epoll, stop: EventFd) -> Self {
        EventLoop {
            w,
            epoll,
            stop,
            rx_counters: RxCounters::default(),
            tx_counters: TxCounters::default(),
            rx_paused: false,
            tx_waiting: false,
            tx_more: false,
            backend_gone: false,
            registered: EventSet::empty(),
            irq_pending: false,
        }
    }

    /// The thread body: runs until stopped or failed, then hands the backend back.
    fn run_to_end(mut self) -> B {
        let result = panic::catch_unwind(AssertUnwindSafe(|| self.run()));
        let failure = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(error_chain(&e)),
            Err(_) => Some("the worker panicked".to_owned()),
        };
        self.publish();
        if let Some(why) = failure {
            error!("virtio-net worker stopped, device needs reset: {why}");
            self.w.metrics.needs_reset_events.add(1);
            if let Err(e) = self.w.interrupt.set_needs_reset() {
                error!("virtio-net: failed to signal DEVICE_NEEDS_RESET: {e}");
            }
        }
        self.w.backend
    }

    fn run(&mut self) -> Result<(), WorkerError> {
        // Kicks and frames may have arrived before activation.
        self.run_tx()?;
        self.run_rx()?;
        self.flush()?;
        let mut events = [EpollEvent::default(); 8];
        loop {
            // With tx work left over, only look at what else is ready, do not sleep.
            let timeout = if self.tx_more { 0 } else { -1 };
            let n = match self.epoll.wait(timeout, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(WorkerError::Epoll(e)),
            };
            for event in &events[..n] {
                match Token::from_data(event.data()) {
                    Some(Token::Stop) => return Ok(()),
                    Some(Token::TxKick) => {
                        self.tx_counters.kicks += drain(&self.w.tx_kick)?;
                        self.run_tx()?;
                    }
                    Some(Token::RxKick) => {
                        self.rx_counters.kicks += drain(&self.w.rx_kick)?;
                        self.resume_rx()?;
                    }
                    Some(Token::Backend) => self.backend_ready(event.event_set())?,
                    None => warn!("virtio-net worker: unknown epoll token {}", event.data()),
                }
            }
            if self.tx_more {
                self.run_tx()?;
            }
            self.flush()?;
        }
    }

    fn run_tx(&mut self) -> Result<(), WorkerError> {
        self.tx_more = false;
        if self.tx_waiting {
            return Ok(());
        }
        let outcome = process_tx(
            &mut self.w.tx,
            &self.w.mem,
            &mut self.w.backend,
            &mut self.tx_counters,
        )
        .map_err(|source| WorkerError::Ring {
            queue: "tx",
            source,
        })?;
        self.irq_pending |= outcome.needs_interrupt;
        match outcome.stop {
            TxStop::Drained => {}
            TxStop::BackendFull => {
                self.tx_waiting = true;
                self.update_backend_interest().map_err(WorkerError::Epoll)?;
            }
            // Come back after the other pending events: the driver will not kick for these.
            TxStop::Budget => self.tx_more = true,
        }
        Ok(())
    }

    fn run_rx(&mut self) -> Result<(), WorkerError> {
        if self.rx_paused || self.backend_gone {
            return Ok(());
        }
        let outcome = process_rx(
            &mut self.w.rx,
            &self.w.mem,
            &mut self.w.backend,
            self.w.rx_mode,
            &mut self.rx_counters,
        )
        .map_err(|source| WorkerError::Ring {
            queue: "rx",
            source,
        })?;
        self.irq_pending |= outcome.needs_interrupt;
        match outcome.stop {
            // Level-triggered epoll reports the backend again if frames remain.
            RxStop::BackendEmpty | RxStop::Budget => {}
            RxStop::NoBuffers => self.rx_paused = true,
            RxStop::BackendFailed => {
                warn!("virtio-net: backend read failed; rx paused until the next rx kick");
                self.rx_paused = true;
            }
            RxStop::BackendClosed => {
                info!("virtio-net: backend closed; it is no longer polled");
                self.backend_gone = true;
            }
        }
        self.update_backend_interest().map_err(WorkerError::Epoll)
    }

    fn resume_rx(&mut self) -> Result<(), WorkerError> {
        self.rx_paused = false;
        self.run_rx()
    }

    fn backend_ready(&mut self, events: EventSet) -> Result<(), WorkerError> {
        let failed = events.intersects(EventSet::ERROR | EventSet::HANG_UP);
        if self.tx_waiting && (events.contains(EventSet::OUT) || failed) {
            self.tx_waiting = false;
            self.update_backend_interest().map_err(WorkerError::Epoll)?;
            self.run_tx()?;
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
        if !self.backend_gone {
            if !self.rx_paused {
                want |= EventSet::IN;
            }
            if self.tx_waiting {
                want |= EventSet::OUT;
            }
        }
        if want == self.registered {
            return Ok(());
        }
        let fd = self.w.backend.as_raw_fd();
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

    /// End of a round: one interrupt for everything completed, counters published once.
    fn flush(&mut self) -> Result<(), WorkerError> {
        if self.irq_pending {
            self.irq_pending = false;
            self.w
                .interrupt
                .signal_used_queue()
                .map_err(WorkerError::Interrupt)?;
            self.w.metrics.irqfd_signals.add(1);
        }
        self.publish();
        Ok(())
    }

    fn publish(&mut self) {
        self.rx_counters.publish(&self.w.metrics.rx);
        self.tx_counters.publish(&self.w.metrics.tx);
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

/// An error and its causes, joined for one log line.
fn error_chain(e: &dyn Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
