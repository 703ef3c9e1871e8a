//! A running VM: memory, KVM, devices and vCPU threads, built from a validated [`VmConfig`].
//!
//! [`RunningVm::start`] builds everything and starts the vCPUs (each installs its seccomp
//! filter before `KVM_RUN`); the VMM thread then watches [`RunningVm::reset_evt`] and
//! [`RunningVm::vcpu_exit_evt`], and calls [`RunningVm::stop`] when the VM must end.

use std::io::{self, IsTerminal, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use devices::backend::NetBackend;
use devices::legacy::{CmosRtc, Serial, I8042};
use devices::virtio::net::vhost_user::{VhostUserNet, VhostUserNetConfig, VhostUserNetMetrics};
use devices::virtio::net::{BackendKind, NetDevice, NetError, NetMetrics, TuningControl};
use devices::virtio::pci::VirtioPciTransport;
use devices::virtio::{MmioTransport, VirtioDevice};
use serde_json::{Map, Value};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::{Killable, SIGRTMIN};
use vmm_sys_util::terminal::Terminal;

use crate::boot;
use crate::bus::Bus;
use crate::config::{self, Transport, VmConfig};
use crate::host::HostQuirks;
use crate::kvm::vcpu::{Vcpu, VcpuExit};
use crate::kvm::Vm;
use crate::memory;
use crate::pci::PciSetup;
use crate::seccomp::{Filters, ThreadKind};
use crate::{error_chain, VmmError};

/// COM1's ports and interrupt.
const COM1_PORT: u64 = 0x3f8;
const COM1_GSI: u32 = 4;
/// The CMOS RTC's index/data ports.
const RTC_PORT: u64 = 0x70;
/// The i8042's data port; its command/status port is 4 above.
const I8042_PORT: u64 = 0x60;
/// The keyboard's interrupt.
const KEYBOARD_GSI: u32 = 1;
/// How long [`RunningVm::stop`] waits for the vCPU threads.
const VCPU_STOP_DEADLINE: Duration = Duration::from_secs(2);

/// A device's transport, as the VMM keeps it.
enum AttachedTransport {
    Mmio(Arc<Mutex<MmioTransport>>),
    Pci(Arc<Mutex<VirtioPciTransport>>),
}

impl AttachedTransport {
    fn shutdown(&self) {
        match self {
            AttachedTransport::Mmio(t) => lock(t).shutdown(),
            AttachedTransport::Pci(t) => lock(t).shutdown(),
        }
    }
}

/// A virtio-net device as the VMM keeps it.
struct AttachedNet {
    iface_id: String,
    transport: AttachedTransport,
    kind: NetKind,
}

/// Where a device's datapath runs.
enum NetKind {
    /// In this process, in front of a tap or a measurement backend.
    InProcess {
        tap: String,
        backend: BackendKind,
        metrics: Arc<NetMetrics>,
        tuning: TuningControl,
    },
    /// In a vhost-user backend.
    VhostUser {
        socket: std::path::PathBuf,
        metrics: Arc<VhostUserNetMetrics>,
    },
}

/// The VM while it runs.
pub struct RunningVm {
    /// Keeps the KVM VM (and its memory slots) alive.
    _vm: Vm,
    vcpu_threads: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    nets: Vec<AttachedNet>,
    i8042: Arc<Mutex<I8042>>,
    reset_evt: EventFd,
    vcpu_exit_evt: EventFd,
    first_exit: Arc<Mutex<Option<VcpuExit>>>,
    _console: ConsoleInput,
    started: Instant,
    vcpu_count: u8,
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every guarded value here stays consistent across a panic elsewhere.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Says so when a device's backend is a measurement instrument.
fn warn_measurement(iface_id: &str, backend: BackendKind) {
    if backend.is_measurement() {
        log::warn!(
            "virtio-net {iface_id:?}: backend={backend} is a measurement instrument (no tap, no \
             real traffic)"
        );
    }
}

/// The VM's memory: a shared file when a vhost-user backend maps it too, else anonymous.
fn guest_memory(config: &VmConfig, size: u64) -> Result<memory::GuestMemory, VmmError> {
    let shared = config
        .network_interfaces
        .iter()
        .any(|n| n.vhost_user_socket.is_some());
    if shared {
        return memory::create_shared_guest_memory(size).map_err(VmmError::SharedMemory);
    }
    memory::create_guest_memory(size).map_err(|source| VmmError::Memory {
        mib: config.machine_config.mem_size_mib,
        source,
    })
}

/// The line that says what boots.
fn log_boot(config: &VmConfig, kernel: &std::path::Path, cmdline: &linux_loader::cmdline::Cmdline) {
    log::info!(
        "booting {kernel:?} ({} MiB, {} vCPU), command line: {}",
        config.machine_config.mem_size_mib,
        config.machine_config.vcpu_count,
        cmdline
            .as_cstring()
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default()
    );
}

impl RunningVm {
    /// Builds the VM described by `config` (which must be valid) and starts its vCPUs. With
    /// `filters`, every thread it starts installs its seccomp filter first.
    pub fn start(config: &VmConfig, filters: Option<&Filters>) -> Result<RunningVm, VmmError> {
        config.validate()?;
        let boot_source = config
            .boot_source
            .as_ref()
            .ok_or(config::ConfigError::MissingBootSource)?;
        let mem_size = config.machine_config.mem_size_mib << 20;
        let mem = guest_memory(config, mem_size)?;
        let vm = Vm::new(&mem)?;
        let kernel = boot::load_kernel(&mem, &boot_source.kernel_image_path)?;
        let initrd = match &boot_source.initrd_path {
            Some(path) => Some(boot::load_initrd(&mem, path, &kernel)?),
            None => None,
        };
        let legacy = LegacyDevices::attach(&vm)?;
        let mmio = Bus::new();
        // (MMIO base, GSI) of each virtio device, for the kernel command line.
        let mut cmdline_devices: Vec<(u64, u32)> = Vec::new();
        let nets = attach_net_devices(
            config,
            &vm,
            &mem,
            &Buses {
                pio: &legacy.pio,
                mmio: &mmio,
            },
            &mut cmdline_devices,
            filters,
        )?;
        let quirks = HostQuirks::detect();
        let vcpus = (0..config.machine_config.vcpu_count)
            .map(|id| {
                Vcpu::new(
                    &vm,
                    id,
                    kernel.entry,
                    mem.clone(),
                    legacy.pio.clone(),
                    mmio.clone(),
                    quirks.pvm,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let cmdline = guest_cmdline(config, &vcpus, &quirks, &cmdline_devices)?;
        boot::configure_system(
            &mem,
            &kernel,
            &cmdline,
            initrd,
            mem_size,
            config.machine_config.vcpu_count,
        )?;
        log_boot(config, &boot_source.kernel_image_path, &cmdline);

        // Nothing may fail once the vCPUs run: everything else is set up first.
        let console = ConsoleInput::start(legacy.serial, filters.cloned())?;
        let mut vm = RunningVm {
            _vm: vm,
            vcpu_threads: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
            nets,
            i8042: legacy.i8042,
            reset_evt: legacy.reset_evt,
            vcpu_exit_evt: EventFd::new(libc::EFD_NONBLOCK).map_err(VmmError::EventFd)?,
            first_exit: Arc::new(Mutex::new(None)),
            _console: console,
            started: Instant::now(),
            vcpu_count: config.machine_config.vcpu_count,
        };
        vm.spawn_vcpus(vcpus, filters)?;
        Ok(vm)
    }

    /// Starts one thread per vCPU; on failure the ones already running are stopped.
    fn spawn_vcpus(&mut self, vcpus: Vec<Vcpu>, filters: Option<&Filters>) -> Result<(), VmmError> {
        let exit_evts = vcpus
            .iter()
            .map(|_| self.vcpu_exit_evt.try_clone())
            .collect::<Result<Vec<_>, _>>()
            .map_err(VmmError::EventFd)?;
        for (vcpu, exit_evt) in vcpus.into_iter().zip(exit_evts) {
            let id = vcpu.id();
            let slot = self.first_exit.clone();
            let stop = self.stop.clone();
            let filters = filters.cloned();
            let spawned = thread::Builder::new()
                .name(format!("vcpu{id}"))
                .spawn(move || {
                    let exit = match filters.map(|f| f.apply(ThreadKind::Vcpu)) {
                        Some(Err(e)) => VcpuExit::Fault(format!("vCPU {id}: {}", error_chain(&e))),
                        _ => vcpu.run(&stop),
                    };
                    if exit == VcpuExit::Stopped {
                        return;
                    }
                    lock(&slot).get_or_insert(exit);
                    // If the eventfd cannot be written the VMM still sees the slot on its
                    // next watchdog tick.
                    let _ = exit_evt.write(1);
                });
            match spawned {
                Ok(handle) => self.vcpu_threads.push(handle),
                Err(e) => {
                    // Stop the vCPUs already running before reporting.
                    self.stop();
                    return Err(VmmError::Thread(e));
                }
            }
        }
        Ok(())
    }

    /// Written when the guest resets the machine through the i8042.
    pub fn reset_evt(&self) -> &EventFd {
        &self.reset_evt
    }

    /// Written when a vCPU stops on its own (see [`RunningVm::take_exit`]).
    pub fn vcpu_exit_evt(&self) -> &EventFd {
        &self.vcpu_exit_evt
    }

    /// Why the first vCPU that stopped on its own stopped.
    pub fn take_exit(&self) -> Option<VcpuExit> {
        let _ = self.vcpu_exit_evt.read();
        lock(&self.first_exit).take()
    }

    /// Interrupts each vCPU's `KVM_RUN` so that it checks it still makes progress.
    pub fn kick_vcpus(&self) {
        for t in &self.vcpu_threads {
            // A vCPU thread that has already ended cannot be signalled; that is fine.
            let _ = t.kill(SIGRTMIN());
        }
    }

    /// The vCPU count.
    pub fn vcpu_count(&self) -> u8 {
        self.vcpu_count
    }

    /// How long the VM has run.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Presses Ctrl+Alt+Del on the i8042 keyboard. Returns whether a guest driver listens to
    /// the keyboard (if not, the keys cannot reach the guest).
    pub fn send_ctrl_alt_del(&self) -> bool {
        let mut i8042 = lock(&self.i8042);
        let ready = i8042.keyboard_driver_ready();
        if let Err(e) = i8042.trigger_ctrl_alt_del() {
            log::warn!("Ctrl+Alt+Del: {e}");
        }
        ready
    }

    /// The tuning handle of interface `iface_id`'s running device.
    pub fn tuning_control(&self, iface_id: &str) -> Option<&TuningControl> {
        match &self.nets.iter().find(|n| n.iface_id == iface_id)?.kind {
            NetKind::InProcess { tuning, .. } => Some(tuning),
            NetKind::VhostUser { .. } => None,
        }
    }

    /// The devices' metrics: `{IFACE_ID: {..counters.., "backend": KIND, "host_dev_name": TAP}}`
    /// (a measurement backend has `"measurement_backend": true` instead of a tap).
    pub fn net_metrics(&self) -> Map<String, Value> {
        let mut by_iface = Map::new();
        for net in &self.nets {
            let value = match &net.kind {
                NetKind::InProcess {
                    tap,
                    backend,
                    metrics,
                    ..
                } => crate::metrics::net_device(metrics, *backend, tap),
                NetKind::VhostUser { socket, metrics } => serde_json::json!({
                    "backend": "vhost-user",
                    "vhost_user_socket": socket,
                    "vhost_user": &**metrics,
                }),
            };
            by_iface.insert(net.iface_id.clone(), value);
        }
        by_iface
    }

    /// Stops the vCPUs and the device workers (their last counts are published). The VM's
    /// memory and file descriptors go when it is dropped.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let deadline = Instant::now() + VCPU_STOP_DEADLINE;
        // A kick can land just before KVM_RUN is entered; kick until every thread is out.
        while self.vcpu_threads.iter().any(|t| !t.is_finished()) && Instant::now() < deadline {
            self.kick_vcpus();
            thread::sleep(Duration::from_millis(5));
        }
        for t in std::mem::take(&mut self.vcpu_threads) {
            if t.is_finished() {
                let _ = t.join();
            } else {
                log::warn!("a vCPU thread did not stop within {VCPU_STOP_DEADLINE:?}");
            }
        }
        for net in &self.nets {
            net.transport.shutdown();
        }
    }
}

/// The legacy platform devices on the port bus: COM1, the CMOS RTC and the i8042.
struct LegacyDevices {
    pio: Bus,
    serial: Arc<Mutex<Serial<io::Stdout>>>,
    i8042: Arc<Mutex<I8042>>,
    /// Written by the i8042 when the guest resets the machine.
    reset_evt: EventFd,
}

impl LegacyDevices {
    fn attach(vm: &Vm) -> Result<LegacyDevices, VmmError> {
        let pio = Bus::new();
        let serial_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(VmmError::EventFd)?;
        vm.register_irqfd(&serial_irq, COM1_GSI)?;
        let serial = Arc::new(Mutex::new(Serial::new(serial_irq, io::stdout())));
        pio.insert(serial.clone(), COM1_PORT, 8)?;
        pio.insert(Arc::new(Mutex::new(CmosRtc::new())), RTC_PORT, 2)?;
        let reset_evt = EventFd::new(libc::EFD_NONBLOCK).map_err(VmmError::EventFd)?;
        let keyboard_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(VmmError::EventFd)?;
        vm.register_irqfd(&keyboard_irq, KEYBOARD_GSI)?;
        let i8042 = Arc::new(Mutex::new(
            I8042::new(reset_evt.try_clone().map_err(VmmError::EventFd)?)
                .with_keyboard_interrupt(keyboard_irq),
        ));
        pio.insert(i8042.clone(), I8042_PORT, 5)?;
        Ok(LegacyDevices {
            pio,
            serial,
            i8042,
            reset_evt,
        })
    }
}

/// The guest's command line: the user's, then what the devices and the host need.
fn guest_cmdline(
    config: &VmConfig,
    vcpus: &[Vcpu],
    quirks: &HostQuirks,
    devices: &[(u64, u32)],
) -> Result<linux_loader::cmdline::Cmdline, VmmError> {
    // Linux reads the TSC frequency from CPUID leaf 0x15 only on Intel; elsewhere, without
    // kvmclock, it calibrates against the PIT (slow, and it may mark the TSC unstable).
    let tsc_khz = vcpus
        .first()
        .and_then(Vcpu::tsc_khz)
        .filter(|_| !config.base_cmdline().contains("tsc_early_khz="));
    let extra = quirks.extra_cmdline();
    if let Some(extra) = extra {
        log::info!("host KVM is the PVM module: appending `{extra}` to the guest command line");
    }
    Ok(boot::vm_cmdline(
        config.base_cmdline(),
        &boot::CmdlineAdditions {
            devices,
            tsc_khz,
            extra,
        },
    )?)
}

/// The buses devices are placed on.
struct Buses<'a> {
    pio: &'a Bus,
    mmio: &'a Bus,
}

/// Creates each virtio-net device and attaches it with its transport: virtio-mmio (a
/// register page and an IOAPIC pin, declared on the command line) or virtio-pci (a function
/// on bus 0, BAR0 in the PCI window, a GSI per MSI-X vector; see [`crate::pci`]). Queue
/// notifications become ioeventfds and interrupts irqfds either way.
fn attach_net_devices(
    config: &VmConfig,
    vm: &Vm,
    mem: &memory::GuestMemory,
    buses: &Buses,
    cmdline_devices: &mut Vec<(u64, u32)>,
    filters: Option<&Filters>,
) -> Result<Vec<AttachedNet>, VmmError> {
    let mut attached = Vec::new();
    let mut pci = PciSetup::default();
    for (i, iface) in config.network_interfaces.iter().enumerate() {
        if let Some(vhost_user) = iface.vhost_user_config() {
            let place = Placement {
                vm,
                mem,
                buses,
                index: i,
            };
            let filter = filters.map(|f| f.get(ThreadKind::VhostUser).clone());
            let net = place.vhost_user(iface, vhost_user?, filter, cmdline_devices, &mut pci)?;
            attached.push(net);
            continue;
        }
        let net_config = iface.net_config()?;
        let net_err = |source| VmmError::Net {
            tap: net_config.tap.clone(),
            source,
        };
        let filter = filters.map(|f| f.get(ThreadKind::NetWorker).clone());
        let OpenedNet {
            device,
            tuning,
            metrics,
        } = match net_config.backend {
            BackendKind::Tap => OpenedNet::new(NetDevice::new(&net_config), filter),
            BackendKind::Sink => OpenedNet::new(NetDevice::sink(&net_config), filter),
            BackendKind::Source => OpenedNet::new(NetDevice::source(&net_config), filter),
            BackendKind::Loop => OpenedNet::new(NetDevice::looped(&net_config), filter),
        }
        .map_err(net_err)?;
        warn_measurement(&iface.iface_id, net_config.backend);
        tuning.set(iface.tuning).map_err(|error| {
            VmmError::Config(config::ConfigError::Tuning {
                iface_id: iface.iface_id.clone(),
                error,
            })
        })?;
        let on = if net_config.backend.is_measurement() {
            format!("backend={}", net_config.backend)
        } else {
            format!("tap {:?}", net_config.tap)
        };
        let transport = match iface.transport() {
            Transport::Mmio => {
                let slot = boot::virtio_slot(i);
                cmdline_devices.push(slot);
                attach_mmio(vm, mem, buses, iface, slot, device, &on, net_config.mac)?
            }
            Transport::Pci => {
                attach_pci(vm, mem, buses, &mut pci, iface, device, &on, net_config.mac)?
            }
        };
        attached.push(AttachedNet {
            iface_id: iface.iface_id.clone(),
            transport,
            kind: NetKind::InProcess {
                tap: net_config.tap.clone(),
                backend: net_config.backend,
                metrics,
                tuning,
            },
        });
    }
    pci.finish(vm, buses.pio, buses.mmio)?;
    Ok(attached)
}

/// Where a device goes: the VM, its memory and buses, and the device's index (its mmio slot).
struct Placement<'a> {
    vm: &'a Vm,
    mem: &'a memory::GuestMemory,
    buses: &'a Buses<'a>,
    index: usize,
}

impl Placement<'_> {
    /// A vhost-user device: connected to its backend, then behind its transport.
    fn vhost_user(
        &self,
        iface: &config::NetworkInterface,
        vhost_user: VhostUserNetConfig,
        filter: Option<Arc<seccompiler::BpfProgram>>,
        cmdline_devices: &mut Vec<(u64, u32)>,
        pci: &mut PciSetup,
    ) -> Result<AttachedNet, VmmError> {
        let device = VhostUserNet::new(&vhost_user, &iface.iface_id, filter).map_err(|source| {
            VmmError::VhostUser {
                iface_id: iface.iface_id.clone(),
                source,
            }
        })?;
        let metrics = device.metrics();
        let on = format!("vhost-user {:?}", vhost_user.socket);
        let device: Box<dyn VirtioDevice> = Box::new(device);
        let (vm, mem, buses, mac) = (self.vm, self.mem, self.buses, vhost_user.mac);
        let transport = match iface.transport() {
            Transport::Mmio => {
                let slot = boot::virtio_slot(self.index);
                cmdline_devices.push(slot);
                attach_mmio(vm, mem, buses, iface, slot, device, &on, mac)?
            }
            Transport::Pci => attach_pci(vm, mem, buses, pci, iface, device, &on, mac)?,
        };
        Ok(AttachedNet {
            iface_id: iface.iface_id.clone(),
            transport,
            kind: NetKind::VhostUser {
                socket: vhost_user.socket,
                metrics,
            },
        })
    }
}

/// Attaches `device` behind virtio-mmio at `(base, gsi)`: its register page on the MMIO bus,
/// its queue notifications as ioeventfds, its line as an irqfd.
#[allow(clippy::too_many_arguments)] // one call site; the pieces of one attachment
fn attach_mmio(
    vm: &Vm,
    mem: &memory::GuestMemory,
    buses: &Buses,
    iface: &config::NetworkInterface,
    (base, gsi): (u64, u32),
    device: Box<dyn VirtioDevice>,
    on: &str,
    mac: devices::virtio::net::MacAddr,
) -> Result<AttachedTransport, VmmError> {
    let transport =
        MmioTransport::new(mem.clone(), device).map_err(|source| VmmError::Transport {
            iface_id: iface.iface_id.clone(),
            source,
        })?;
    vm.register_irqfd(transport.irqfd(), gsi)?;
    for (evt, addr, datamatch) in transport.ioeventfds(base) {
        vm.register_mmio_ioevent(evt, addr, datamatch)?;
    }
    let transport = Arc::new(Mutex::new(transport));
    buses
        .mmio
        .insert(transport.clone(), base, boot::MMIO_DEVICE_SIZE)?;
    log::info!(
        "virtio-net {:?} on {on} (MAC {mac}): virtio-mmio at {base:#x}, GSI {gsi}",
        iface.iface_id
    );
    Ok(AttachedTransport::Mmio(transport))
}

/// Attaches `device` behind virtio-pci: a function on bus 0 placed by `pci` (BAR0, a GSI per
/// MSI-X vector).
#[allow(clippy::too_many_arguments)] // one call site; the pieces of one attachment
fn attach_pci(
    vm: &Vm,
    mem: &memory::GuestMemory,
    buses: &Buses,
    pci: &mut PciSetup,
    iface: &config::NetworkInterface,
    device: Box<dyn VirtioDevice>,
    on: &str,
    mac: devices::virtio::net::MacAddr,
) -> Result<AttachedTransport, VmmError> {
    let iface_id = || iface.iface_id.clone();
    let transport =
        VirtioPciTransport::new(mem.clone(), device).map_err(|source| VmmError::PciTransport {
            iface_id: iface_id(),
            source,
        })?;
    let (transport, at) =
        pci.attach(vm, buses.mmio, transport)
            .map_err(|source| VmmError::Pci {
                iface_id: iface_id(),
                source,
            })?;
    log::info!(
        "virtio-net {:?} on {on} (MAC {mac}): virtio-pci 00:{:02x}.0, BAR0 at {:#x}, MSI-X \
         vectors on GSI {}..={}",
        iface.iface_id,
        at.slot,
        at.bar0,
        at.first_gsi,
        at.first_gsi + u32::from(at.vectors) - 1
    );
    Ok(AttachedTransport::Pci(transport))
}

/// A virtio-net device ready for its transport, with the handles the VMM keeps.
struct OpenedNet {
    device: Box<dyn VirtioDevice>,
    tuning: TuningControl,
    metrics: Arc<NetMetrics>,
}

impl OpenedNet {
    /// Installs the worker's seccomp filter (when given) and erases the backend's type: the
    /// transports dispatch on the slow path only, and each device's datapath stays
    /// monomorphic.
    fn new<B: NetBackend>(
        device: Result<NetDevice<B>, NetError>,
        filter: Option<Arc<seccompiler::BpfProgram>>,
    ) -> Result<OpenedNet, NetError> {
        let mut device = device?;
        if let Some(filter) = filter {
            device.set_worker_seccomp_filter(filter)?;
        }
        Ok(OpenedNet {
            tuning: device.tuning_control(),
            metrics: device.metrics(),
            device: Box::new(device),
        })
    }
}

/// Copies the host's stdin into the UART, in raw mode when stdin is a terminal (restored when
/// dropped). The thread installs the VMM's seccomp filter before it touches the UART.
struct ConsoleInput {
    raw_tty: bool,
}

impl ConsoleInput {
    fn start<W: io::Write + Send + 'static>(
        serial: Arc<Mutex<Serial<W>>>,
        filters: Option<Filters>,
    ) -> Result<Self, VmmError> {
        let stdin = io::stdin();
        let raw_tty = stdin.is_terminal() && stdin.lock().set_raw_mode().is_ok();
        thread::Builder::new()
            .name("console-in".into())
            .spawn(move || {
                if let Some(filters) = filters {
                    if let Err(e) = filters.apply(ThreadKind::Vmm) {
                        log::error!("console input disabled: {}", error_chain(&e));
                        return;
                    }
                }
                let mut buf = [0u8; 64];
                let mut input = io::stdin().lock();
                loop {
                    let n = match input.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    let mut pending = &buf[..n];
                    while !pending.is_empty() {
                        let taken = lock(&serial).enqueue_input(pending).unwrap_or(0);
                        pending = &pending[taken..];
                        if !pending.is_empty() {
                            // The guest has not drained the FIFO yet.
                            thread::sleep(Duration::from_millis(5));
                        }
                    }
                }
            })
            .map_err(VmmError::Thread)?;
        Ok(ConsoleInput { raw_tty })
    }
}

impl Drop for ConsoleInput {
    fn drop(&mut self) {
        if self.raw_tty {
            let _ = io::stdin().lock().set_canon_mode();
        }
    }
}
