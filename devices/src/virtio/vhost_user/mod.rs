//! The device served to a vhost-user frontend (QEMU, Cloud Hypervisor, DPDK's virtio-user, our
//! own VMM): the protocol's messages, parsed by rust-vmm's `vhost` crate, become what the
//! in-process transports give a device, an [`ActivationContext`] at
//! activation, a [`pause`](super::VirtioDevice::pause) when the frontend stops a ring. The
//! datapath is the same worker, with the same rings: the kick eventfds the frontend hands over
//! are what the worker polls, and its call eventfds are what it signals.
//!
//! # How the frontend's messages drive the device
//!
//! [`VhostUserBackend`] keeps what the frontend set up for each ring (size, the three ring
//! addresses in the frontend's address space, the base, the kick, call and error eventfds,
//! whether it is enabled) and the memory table ([`MemoryTable`]). After every message it
//! reconciles the device with that state:
//!
//! - **Start.** Once the features are set, memory is mapped and the first queue pair's rings
//!   are complete (size, addresses, kick) and enabled, the device is activated with every
//!   complete ring, each resuming at its base. Rings start disabled when
//!   VHOST_USER_F_PROTOCOL_FEATURES is negotiated, enabled otherwise (the protocol's rule).
//! - **Enable.** SET_VRING_ENABLE on a running device changes the pairs that run
//!   ([`VhostUserDevice::enable_rings`]) without stopping it; disabling the first pair stops it.
//! - **Stop.** GET_VRING_BASE stops the device: every worker uses or hands back what it
//!   took (rx chains popped ahead of frames go back to the avail ring), each ring's position
//!   becomes its base, and the ring asked about stays stopped until its next SET_VRING_KICK.
//!   The answer is the split ring's next avail index, or for a packed ring the avail offset
//!   and wrap counter in bits 0–15 and the used ones in bits 16–31 (QEMU's form; DPDK reads
//!   the low half). SET_VRING_BASE takes both forms: a packed base with an empty high half
//!   (DPDK) resumes the used position at the avail one.
//! - **Change.** Any other change to a running device's rings, memory or features (a new call
//!   eventfd when QEMU masks a vector, memory added) stops it and starts it again at once
//!   from where it stood: no frame is lost or sent twice.
//!
//! # Hostile frontends
//!
//! Every message is hostile input. The `vhost` crate checks the framing (header, sizes, file
//! descriptors); here every value is checked before use: ring indexes against the device's
//! rings, sizes against the queue's maximum, ring addresses against the memory table when
//! the device starts (then the ring layer's own checks: alignment, inside one region, no
//! overlap), memory regions as [`MemoryTable`] says, features against what was offered, and order
//! (a ring address before the memory table, a kick before the ring's size and addresses; no
//! ring starts before the features). A refused message gets an
//! error reply (REPLY_ACK) and the daemon closes the connection; the process and its other
//! state live on. A failed activation is counted and refused the same way.

mod connection;
mod memory;

#[cfg(test)]
mod tests;

use std::fs::File;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::sync::Arc;

use log::{debug, info, warn};
use serde::Serialize;
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags, VhostUserInflight,
    VhostUserLog, VhostUserMemoryRegion, VhostUserProtocolFeatures, VhostUserShMemConfig,
    VhostUserSharedMsg, VhostUserSingleMemoryRegion, VhostUserVringAddrFlags, VhostUserVringState,
};
use vhost::vhost_user::{Error as VhostError, GpuBackend, VhostUserBackendReqHandlerMut};
use vhost::VhostUserMemoryRegionBase;
use virtio_bindings::virtio_config::VIRTIO_F_RING_PACKED;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

pub use connection::{lock, serve, Connection, ConnectionEnd, MESSAGE_TIMEOUT};
pub use memory::{MemoryError, MemoryTable, RegionInfo, MAX_REGIONS};

use super::packed::Position;
use super::ring::RingPosition;
use super::{ActivationContext, VirtioDevice, VirtioInterrupt};
use crate::counters::{Counter, Gauge};

/// VHOST_USER_F_PROTOCOL_FEATURES: the virtio feature bit (30) that says the protocol
/// features are negotiated.
pub const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;

/// The protocol features offered (the `vhost` crate adds REPLY_ACK): multiqueue, memory
/// slots (ADD_MEM_REG, REM_MEM_REG) and RESET_DEVICE. Not offered, because not handled:
/// LOG_SHMFD (dirty logging for live migration), INFLIGHT_SHMFD, CONFIG, BACKEND_REQ, RARP,
/// MTU, STATUS, DEVICE_STATE.
pub fn protocol_features() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
        | VhostUserProtocolFeatures::RESET_DEVICE
}

/// What a device needs beyond [`VirtioDevice`] to be served over vhost-user.
pub trait VhostUserDevice: VirtioDevice {
    /// The virtio features offered to the frontend (without
    /// [`VHOST_USER_F_PROTOCOL_FEATURES`]): the device's own, without those of the
    /// configuration space the frontend keeps.
    fn vhost_user_features(&self) -> u64;

    /// GET_QUEUE_NUM's answer (virtio-net: queue pairs).
    fn queue_num(&self) -> u64;

    /// Whether ring `index` must be set up and enabled before the device can run with the
    /// features `acked` (virtio-net: the first queue pair's two rings).
    fn ring_required(&self, index: usize, acked: u64) -> bool;

    /// Which rings the frontend enabled (queue-index order), on the running device.
    fn enable_rings(&mut self, enabled: &[bool]);
}

/// The vhost-user side's counters (`vhost_user` in the metrics).
#[derive(Debug, Default, Serialize)]
pub struct VhostUserMetrics {
    /// Frontends that connected.
    pub connections: Counter,
    /// Connections that ended (the frontend went away, or was dropped after an error).
    pub disconnects: Counter,
    /// Messages refused (malformed, out of order, out of range, unsupported); each one ends
    /// its connection.
    pub protocol_errors: Counter,
    /// Times the device started running for the frontend.
    pub device_starts: Counter,
    /// Activations the device refused (rings outside memory, misaligned, overlapping).
    pub device_start_errors: Counter,
    /// Times the running device was stopped (GET_VRING_BASE, a change to its rings).
    pub device_stops: Counter,
    /// Whether a frontend is connected now.
    pub connected: Gauge,
    /// The virtio features the frontend negotiated (0: none yet), without the protocol bit.
    pub negotiated_features: Gauge,
    /// Memory regions mapped now.
    pub memory_regions: Gauge,
    /// Of those, regions the backend could not seal against shrinking (see the docs).
    pub unsealed_regions: Gauge,
}

/// What the frontend set up for one ring.
#[derive(Debug, Default)]
struct Vring {
    /// SET_VRING_NUM (0: not set).
    size: u16,
    /// SET_VRING_ADDR: descriptor table, avail (driver) area, used (device) area, in the
    /// frontend's address space.
    addrs: Option<[u64; 3]>,
    /// SET_VRING_BASE, or where the ring stood when the device last stopped.
    base: u32,
    kick: Option<EventFd>,
    call: Option<EventFd>,
    err: Option<EventFd>,
    enabled: bool,
    /// A kick eventfd came since the ring was last stopped (GET_VRING_BASE).
    started: bool,
}

impl Vring {
    fn is_complete(&self) -> bool {
        self.size != 0 && self.addrs.is_some() && self.kick.is_some() && self.started
    }
}

/// The vhost-user backend state of one device (the `vhost` crate's request handler).
pub struct VhostUserBackend<D> {
    device: D,
    /// For log lines (the socket).
    label: String,
    metrics: Arc<VhostUserMetrics>,
    /// The virtio features offered, [`VHOST_USER_F_PROTOCOL_FEATURES`] included.
    offered: u64,
    /// SET_FEATURES (None: not yet).
    acked: Option<u64>,
    /// SET_PROTOCOL_FEATURES.
    protocol: u64,
    memory: MemoryTable,
    rings: Vec<Vring>,
    running: bool,
}

impl<D> std::fmt::Debug for VhostUserBackend<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VhostUserBackend")
            .field("label", &self.label)
            .field("acked", &self.acked)
            .field("running", &self.running)
            .finish_non_exhaustive()
    }
}

/// A refused request, logged at debug level (the daemon counts it and logs the connection's
/// end).
fn refuse(why: &'static str) -> VhostError {
    debug!("vhost-user: refused: {why}");
    VhostError::InvalidOperation(why)
}

fn memory_refused(e: MemoryError) -> VhostError {
    warn!("vhost-user: memory region refused: {e}");
    VhostError::InvalidParam
}

impl<D: VhostUserDevice> VhostUserBackend<D> {
    /// The backend of `device`; `label` names it in log lines.
    pub fn new(device: D, label: &str) -> Self {
        let rings = device
            .queue_max_sizes()
            .iter()
            .map(|_| Vring::default())
            .collect();
        VhostUserBackend {
            offered: device.vhost_user_features() | VHOST_USER_F_PROTOCOL_FEATURES,
            device,
            label: label.to_owned(),
            metrics: Arc::new(VhostUserMetrics::default()),
            acked: None,
            protocol: 0,
            memory: MemoryTable::default(),
            rings,
            running: false,
        }
    }

    /// The counters (the daemon keeps this `Arc` for its metrics).
    pub fn metrics(&self) -> Arc<VhostUserMetrics> {
        self.metrics.clone()
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// Whether the device runs for the frontend.
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// A frontend connected.
    pub fn connected(&mut self) {
        self.metrics.connections.add(1);
        self.metrics.connected.set(1);
    }

    /// The frontend went away (or was dropped): the device stops, and everything the frontend
    /// set up is forgotten (its memory unmapped, its eventfds closed), ready for the next one.
    pub fn disconnected(&mut self) {
        self.reset_state();
        self.memory = MemoryTable::default();
        self.publish_memory();
        self.metrics.disconnects.add(1);
        self.metrics.connected.set(0);
    }

    /// The device stopped; rings and features back to the start (memory kept).
    fn reset_state(&mut self) {
        if self.running {
            self.device.reset();
            self.running = false;
            self.metrics.device_stops.add(1);
        }
        self.rings.iter_mut().for_each(|r| *r = Vring::default());
        self.acked = None;
        self.protocol = 0;
        self.metrics.negotiated_features.set(0);
    }

    fn publish_memory(&self) {
        self.metrics.memory_regions.set(self.memory.len() as u64);
        self.metrics
            .unsealed_regions
            .set(self.memory.unsealed() as u64);
    }

    fn ring(&mut self, index: u32) -> Result<&mut Vring, VhostError> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.rings.get_mut(i))
            .ok_or_else(|| refuse("ring index out of range"))
    }

    /// The negotiated virtio features, without the protocol bit.
    fn features(&self) -> Option<u64> {
        self.acked.map(|f| f & !VHOST_USER_F_PROTOCOL_FEATURES)
    }

    /// Stops the running device; each ring's position becomes its base.
    fn stop(&mut self) {
        if !self.running {
            return;
        }
        let packed = self
            .features()
            .is_some_and(|f| f & (1 << VIRTIO_F_RING_PACKED) != 0);
        for (ring, position) in self.rings.iter_mut().zip(self.device.pause()) {
            if let Some(position) = position {
                ring.base = encode_base(position);
            }
        }
        debug!(
            "vhost-user {}: device stopped ({} rings)",
            self.label,
            if packed { "packed" } else { "split" }
        );
        self.running = false;
        self.metrics.device_stops.add(1);
    }

    /// Whether the device can run: features and memory set, the required rings complete and
    /// enabled.
    fn startable(&self) -> bool {
        let Some(acked) = self.features() else {
            return false;
        };
        !self.memory.is_empty()
            && (0..self.device.queues_in_use(acked))
                .filter(|&i| self.device.ring_required(i, acked))
                .all(|i| {
                    self.rings
                        .get(i)
                        .is_some_and(|r| r.is_complete() && r.enabled)
                })
    }

    /// Brings the device in line with what the frontend set up: `changed` says the rings,
    /// memory or features of a running device changed (it then restarts where it stood).
    fn reconcile(&mut self, changed: bool) -> Result<(), VhostError> {
        if self.running && (changed || !self.startable()) {
            self.stop();
        }
        if self.running {
            let enabled: Vec<bool> = self.rings.iter().map(|r| r.enabled).collect();
            self.device.enable_rings(&enabled);
            return Ok(());
        }
        if self.startable() {
            self.start()?;
        } else {
            debug!(
                "vhost-user {}: not startable: features {:?}, {} regions, rings {:?}",
                self.label,
                self.acked,
                self.memory.len(),
                self.rings
                    .iter()
                    .map(|r| (
                        r.size,
                        r.addrs.is_some(),
                        r.kick.is_some(),
                        r.started,
                        r.enabled
                    ))
                    .collect::<Vec<_>>()
            );
        }
        Ok(())
    }

    /// Activates the device with every complete ring.
    fn start(&mut self) -> Result<(), VhostError> {
        let acked = self.features().ok_or_else(|| refuse("no features"))?;
        let mem = self
            .memory
            .guest_memory()
            .ok_or_else(|| refuse("no memory table"))?;
        let n = self.device.queues_in_use(acked);
        let max_sizes = self.device.queue_max_sizes().to_vec();
        let (mut queues, mut kicks, mut calls, mut errors, mut positions) =
            (vec![], vec![], vec![], vec![], vec![]);
        for (index, ring) in self.rings.iter().enumerate().take(n) {
            let max = max_sizes.get(index).copied().unwrap_or(0);
            let mut queue = Queue::new(max).map_err(|_| refuse("queue size"))?;
            let mut position = None;
            // Every complete ring runs, enabled or not: enabling one later needs no restart
            // (a disabled pair's worker is idle).
            if ring.is_complete() {
                let addrs = ring.addrs.unwrap_or_default();
                let mut gpa = [0u64; 3];
                for (g, a) in gpa.iter_mut().zip(addrs) {
                    *g = self.memory.translate(a).map_err(memory_refused)?;
                }
                queue
                    .try_set_size(ring.size)
                    .and_then(|()| queue.try_set_desc_table_address(GuestAddress(gpa[0])))
                    .and_then(|()| queue.try_set_avail_ring_address(GuestAddress(gpa[1])))
                    .and_then(|()| queue.try_set_used_ring_address(GuestAddress(gpa[2])))
                    .map_err(|_| refuse("ring size or alignment"))?;
                queue.set_ready(true);
                queue.set_event_idx(acked & (1 << VIRTIO_RING_F_EVENT_IDX) != 0);
                let packed = acked & (1 << VIRTIO_F_RING_PACKED) != 0;
                position = Some(decode_base(ring.base, packed, || {
                    // A split ring's used index lives in the ring (offset 2 of the used area).
                    mem.read_obj::<u16>(GuestAddress(gpa[2].wrapping_add(2)))
                        .map(u16::from_le)
                        .unwrap_or(0)
                }));
            }
            queues.push(queue);
            positions.push(position);
            let clone = |fd: &Option<EventFd>| fd.as_ref().and_then(|fd| fd.try_clone().ok());
            kicks.push(match clone(&ring.kick) {
                Some(kick) => kick,
                None => EventFd::new(EFD_NONBLOCK).map_err(VhostError::ReqHandlerError)?,
            });
            calls.push(clone(&ring.call));
            errors.push(clone(&ring.err));
        }
        let ctx = ActivationContext {
            mem,
            queues,
            kicks,
            interrupt: Arc::new(VirtioInterrupt::vrings(calls, errors)),
            acked_features: acked,
            positions,
        };
        if let Err(e) = self.device.activate(ctx) {
            self.metrics.device_start_errors.add(1);
            warn!(
                "vhost-user {}: the device cannot start: {}",
                self.label,
                crate::error_chain(&e)
            );
            return Err(VhostError::InvalidOperation("the device refused its rings"));
        }
        self.running = true;
        self.metrics.device_starts.add(1);
        let enabled: Vec<bool> = self.rings.iter().map(|r| r.enabled).collect();
        self.device.enable_rings(&enabled);
        Ok(())
    }

    /// Sets one of a ring's eventfds; a running device restarts with it.
    fn set_fd(
        &mut self,
        index: u8,
        fd: Option<File>,
        which: fn(&mut Vring) -> &mut Option<EventFd>,
    ) -> Result<(), VhostError> {
        // SAFETY: the descriptor came with the message and is ours alone; an EventFd only
        // reads and writes 8 bytes through it, whatever kind of file it is.
        let fd = fd.map(|f| unsafe { EventFd::from_raw_fd(f.into_raw_fd()) });
        *which(self.ring(u32::from(index))?) = fd;
        self.reconcile(true)
    }
}

/// A ring's position as GET_VRING_BASE reports it (see the module docs).
fn encode_base(position: RingPosition) -> u32 {
    match position {
        RingPosition::Split { next_avail, .. } => u32::from(next_avail),
        RingPosition::Packed {
            next_avail,
            next_used,
        } => u32::from(next_avail.off_wrap()) | u32::from(next_used.off_wrap()) << 16,
    }
}

/// A ring's position from SET_VRING_BASE's `base` (see the module docs); `used_idx` reads a
/// split ring's used index.
fn decode_base(base: u32, packed: bool, used_idx: impl FnOnce() -> u16) -> RingPosition {
    let position = |half: u32| Position {
        offset: (half & 0x7fff) as u16,
        wrap: half & 0x8000 != 0,
    };
    if packed {
        let next_avail = position(base);
        let next_used = if base >> 16 == 0 {
            next_avail
        } else {
            position(base >> 16)
        };
        RingPosition::Packed {
            next_avail,
            next_used,
        }
    } else {
        RingPosition::Split {
            next_avail: base as u16,
            next_used: used_idx(),
        }
    }
}

impl<D: VhostUserDevice> VhostUserBackendReqHandlerMut for VhostUserBackend<D> {
    fn set_owner(&mut self) -> Result<(), VhostError> {
        Ok(())
    }

    fn reset_owner(&mut self) -> Result<(), VhostError> {
        self.reset_state();
        Ok(())
    }

    fn reset_device(&mut self) -> Result<(), VhostError> {
        self.reset_state();
        Ok(())
    }

    fn get_features(&mut self) -> Result<u64, VhostError> {
        Ok(self.offered)
    }

    fn set_features(&mut self, features: u64) -> Result<(), VhostError> {
        if features & !self.offered != 0 {
            return Err(refuse("features not offered"));
        }
        let changed = self.acked != Some(features);
        self.acked = Some(features);
        if features & VHOST_USER_F_PROTOCOL_FEATURES == 0 {
            // Without the protocol features a ring is enabled as soon as it is set up.
            self.rings.iter_mut().for_each(|r| r.enabled = true);
        }
        self.metrics
            .negotiated_features
            .set(features & !VHOST_USER_F_PROTOCOL_FEATURES);
        if changed {
            info!(
                "vhost-user {}: the frontend negotiated features {:#x}",
                self.label,
                features & !VHOST_USER_F_PROTOCOL_FEATURES
            );
        }
        self.reconcile(changed)
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        _postcopy_listening: Option<bool>,
    ) -> Result<Option<Vec<VhostUserMemoryRegionBase>>, VhostError> {
        let regions = ctx.iter().zip(files).map(|(r, file)| {
            (
                RegionInfo {
                    gpa: r.guest_phys_addr,
                    size: r.memory_size,
                    user_addr: r.user_addr,
                    mmap_offset: r.mmap_offset,
                },
                file,
            )
        });
        let table = MemoryTable::from_regions(regions).map_err(memory_refused)?;
        // The device must not run on the old mappings once they go.
        self.stop();
        self.memory = table;
        self.publish_memory();
        self.reconcile(true)?;
        Ok(None)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> Result<(), VhostError> {
        let max = usize::try_from(index)
            .ok()
            .and_then(|i| self.device.queue_max_sizes().get(i).copied())
            .ok_or_else(|| refuse("ring index out of range"))?;
        let size = u16::try_from(num)
            .ok()
            .filter(|&s| s != 0 && s <= max && s.is_power_of_two())
            .ok_or_else(|| refuse("ring size not a power of two up to the queue's maximum"))?;
        self.ring(index)?.size = size;
        self.reconcile(true)
    }

    fn set_vring_addr(
        &mut self,
        index: u32,
        _flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        _log: u64,
    ) -> Result<(), VhostError> {
        // Ring addresses are the frontend's: they mean nothing before its memory table.
        if self.memory.is_empty() {
            return Err(refuse("a ring address before any memory table"));
        }
        // The log address matters only with VHOST_F_LOG_ALL, which is not offered.
        self.ring(index)?.addrs = Some([descriptor, available, used]);
        self.reconcile(true)
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> Result<(), VhostError> {
        self.ring(index)?.base = base;
        self.reconcile(true)
    }

    fn get_vring_base(&mut self, index: u32) -> Result<VhostUserVringState, VhostError> {
        self.ring(index)?;
        self.stop();
        let ring = self.ring(index)?;
        ring.started = false;
        ring.kick = None;
        let base = ring.base;
        // The other rings may run on without this one.
        self.reconcile(false)?;
        Ok(VhostUserVringState::new(index, base))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> Result<(), VhostError> {
        if fd.is_none() {
            return Err(refuse(
                "a ring without a kick eventfd (polled) is not supported",
            ));
        }
        let ring = self.ring(u32::from(index))?;
        // The kick starts the ring: it comes last (QEMU and DPDK send it after the rest).
        if ring.size == 0 || ring.addrs.is_none() {
            return Err(refuse("a kick before the ring's size and addresses"));
        }
        ring.started = true;
        self.set_fd(index, fd, |r| &mut r.kick)
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> Result<(), VhostError> {
        self.set_fd(index, fd, |r| &mut r.call)
    }

    fn set_vring_err(&mut self, index: u8, fd: Option<File>) -> Result<(), VhostError> {
        self.set_fd(index, fd, |r| &mut r.err)
    }

    fn get_protocol_features(&mut self) -> Result<VhostUserProtocolFeatures, VhostError> {
        Ok(protocol_features())
    }

    fn set_protocol_features(&mut self, features: u64) -> Result<(), VhostError> {
        let offered = (protocol_features() | VhostUserProtocolFeatures::REPLY_ACK).bits();
        if features & !offered != 0 {
            return Err(refuse("protocol features not offered"));
        }
        self.protocol = features;
        Ok(())
    }

    fn get_queue_num(&mut self) -> Result<u64, VhostError> {
        Ok(self.device.queue_num())
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> Result<(), VhostError> {
        self.ring(index)?.enabled = enable;
        self.reconcile(false)
    }

    fn get_config(
        &mut self,
        _offset: u32,
        _size: u32,
        _flags: VhostUserConfigFlags,
    ) -> Result<Vec<u8>, VhostError> {
        Err(refuse(
            "GET_CONFIG (the frontend keeps the configuration space)",
        ))
    }

    fn set_config(
        &mut self,
        _offset: u32,
        _buf: &[u8],
        _flags: VhostUserConfigFlags,
    ) -> Result<(), VhostError> {
        Err(refuse(
            "SET_CONFIG (the frontend keeps the configuration space)",
        ))
    }

    fn set_gpu_socket(&mut self, _gpu_backend: GpuBackend) -> Result<(), VhostError> {
        Err(refuse("GPU_SET_SOCKET"))
    }

    fn get_shared_object(&mut self, _uuid: VhostUserSharedMsg) -> Result<File, VhostError> {
        Err(refuse("GET_SHARED_OBJECT"))
    }

    fn get_inflight_fd(
        &mut self,
        _inflight: &VhostUserInflight,
    ) -> Result<(VhostUserInflight, File), VhostError> {
        Err(refuse("GET_INFLIGHT_FD"))
    }

    fn set_inflight_fd(
        &mut self,
        _inflight: &VhostUserInflight,
        _file: File,
    ) -> Result<(), VhostError> {
        Err(refuse("SET_INFLIGHT_FD"))
    }

    fn get_max_mem_slots(&mut self) -> Result<u64, VhostError> {
        Ok(MAX_REGIONS as u64)
    }

    fn add_mem_region(
        &mut self,
        region: &VhostUserSingleMemoryRegion,
        fd: File,
        _postcopy_listening: Option<bool>,
    ) -> Result<Option<VhostUserMemoryRegionBase>, VhostError> {
        let info = RegionInfo {
            gpa: region.guest_phys_addr,
            size: region.memory_size,
            user_addr: region.user_addr,
            mmap_offset: region.mmap_offset,
        };
        let before = self.memory.len();
        self.memory.add(info, fd).map_err(memory_refused)?;
        self.publish_memory();
        self.reconcile(self.memory.len() != before)?;
        Ok(None)
    }

    fn remove_mem_region(
        &mut self,
        region: &VhostUserSingleMemoryRegion,
    ) -> Result<(), VhostError> {
        // The device must not run on the mapping once it goes.
        let was_running = self.running;
        self.stop();
        let removed = self
            .memory
            .remove(region.guest_phys_addr, region.memory_size)
            .map_err(memory_refused);
        self.publish_memory();
        if was_running || removed.is_ok() {
            self.reconcile(true)?;
        }
        removed
    }

    fn set_device_state_fd(
        &mut self,
        _direction: VhostTransferStateDirection,
        _phase: VhostTransferStatePhase,
        _fd: File,
    ) -> Result<Option<File>, VhostError> {
        Err(refuse("SET_DEVICE_STATE_FD"))
    }

    fn check_device_state(&mut self) -> Result<(), VhostError> {
        Err(refuse("CHECK_DEVICE_STATE"))
    }

    fn get_shmem_config(&mut self) -> Result<VhostUserShMemConfig, VhostError> {
        Err(refuse("GET_SHMEM_CONFIG"))
    }

    fn set_log_base(&mut self, _log: &VhostUserLog, _file: File) -> Result<(), VhostError> {
        Err(refuse("SET_LOG_BASE (dirty logging is not supported)"))
    }
}
