//! `vmm`: a small KVM virtual machine monitor built around a tunable virtio-net datapath.
//!
//! [`run`] boots a guest from a [`config::VmConfig`] and returns when it ends.

pub mod boot;
pub mod bus;
pub mod config;
pub mod host;
pub mod kvm;
pub mod memory;

use std::io::{self, IsTerminal, Read};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use devices::legacy::{CmosRtc, Serial, I8042};
use devices::virtio::net::{NetDevice, NetMetrics};
use devices::virtio::MmioTransport;
use vm_memory::GuestAddress;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};
use vmm_sys_util::terminal::Terminal;

use crate::boot::BootError;
use crate::bus::{Bus, BusError};
use crate::config::{ConfigError, VmConfig};
use crate::host::HostQuirks;
use crate::kvm::vcpu::{Vcpu, VcpuExit};
use crate::kvm::{KvmError, Vm};

/// COM1's ports and interrupt.
const COM1_PORT: u64 = 0x3f8;
const COM1_GSI: u32 = 4;
/// The CMOS RTC's index/data ports.
const RTC_PORT: u64 = 0x70;
/// The i8042's data port; its command/status port is 4 above.
const I8042_PORT: u64 = 0x60;
/// Each virtio-mmio device's register window.
const MMIO_DEVICE_SIZE: u64 = 0x1000;
/// How often the watchdog checks that the vCPUs make progress.
const WATCHDOG_PERIOD: Duration = Duration::from_secs(1);

/// Why the VM could not run, or how it ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    #[error("invalid configuration")]
    Config(#[from] ConfigError),
    #[error("cannot allocate {mib} MiB of guest memory")]
    Memory {
        mib: u64,
        #[source]
        source: vm_memory::mmap::FromRangesError,
    },
    #[error(transparent)]
    Boot(#[from] BootError),
    #[error(transparent)]
    Kvm(#[from] KvmError),
    #[error("cannot place a device on the bus")]
    Bus(#[from] BusError),
    #[error("cannot create an eventfd")]
    EventFd(#[source] io::Error),
    #[error("cannot set up the VMM's event loop")]
    Epoll(#[source] io::Error),
    #[error("cannot start a thread")]
    Thread(#[source] io::Error),
    #[error("the VM stopped: {0}")]
    Guest(String),
    #[error("cannot create the network device on tap {tap:?}")]
    Net {
        tap: String,
        #[source]
        source: devices::virtio::net::NetError,
    },
    #[error("cannot create a virtio transport: {0}")]
    Transport(String),
}

/// Boots the VM described by `config` and runs it until the guest resets or powers off
/// (`Ok`) or something ends it abnormally (`Err`).
pub fn run(config: &VmConfig) -> Result<(), VmmError> {
    config.validate()?;
    let mem_size = config.machine_config.mem_size_mib << 20;
    let mem = memory::create_guest_memory(mem_size).map_err(|source| VmmError::Memory {
        mib: config.machine_config.mem_size_mib,
        source,
    })?;
    let vm = Vm::new(&mem)?;

    let kernel = boot::load_kernel(&mem, &config.boot_source.kernel_image_path)?;
    let initrd = match &config.boot_source.initrd_path {
        Some(path) => Some(boot::load_initrd(&mem, path, &kernel)?),
        None => None,
    };

    // (MMIO base, GSI) of each virtio device, for the kernel command line.
    let mut cmdline_devices: Vec<(u64, u32)> = Vec::new();

    // Legacy devices on the port bus.
    let mut pio = Bus::new();
    let serial_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(VmmError::EventFd)?;
    vm.register_irqfd(&serial_irq, COM1_GSI)?;
    let serial = Arc::new(Mutex::new(Serial::new(serial_irq, io::stdout())));
    pio.insert(serial.clone(), COM1_PORT, 8)?;
    pio.insert(Arc::new(Mutex::new(CmosRtc::new())), RTC_PORT, 2)?;
    let reset_evt = EventFd::new(libc::EFD_NONBLOCK).map_err(VmmError::EventFd)?;
    let i8042 = I8042::new(reset_evt.try_clone().map_err(VmmError::EventFd)?);
    pio.insert(Arc::new(Mutex::new(i8042)), I8042_PORT, 5)?;
    let mut mmio = Bus::new();
    let nets = attach_net_devices(config, &vm, &mem, &mut mmio, &mut cmdline_devices)?;

    let vcpus = (0..config.machine_config.vcpu_count)
        .map(|id| {
            Vcpu::new(
                &vm,
                id,
                kernel.entry,
                mem.clone(),
                pio.clone(),
                mmio.clone(),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;

    let mut cmdline = boot::new_cmdline(config.base_cmdline())?;
    for &(base, gsi) in &cmdline_devices {
        cmdline
            .add_virtio_mmio_device(MMIO_DEVICE_SIZE, GuestAddress(base), gsi, None)
            .map_err(BootError::Cmdline)?;
    }
    // Linux reads the TSC frequency from CPUID leaf 0x15 only on Intel; elsewhere, without
    // kvmclock, it calibrates against the PIT (slow, and it may mark the TSC unstable).
    if let Some(khz) = vcpus[0].tsc_khz() {
        if !config.base_cmdline().contains("tsc_early_khz=") {
            cmdline
                .insert("tsc_early_khz", &khz.to_string())
                .map_err(BootError::Cmdline)?;
        }
    }
    let quirks = HostQuirks::detect();
    if let Some(extra) = quirks.extra_cmdline() {
        log::info!("host KVM is the PVM module: appending `{extra}` to the guest command line");
        cmdline.insert_str(extra).map_err(BootError::Cmdline)?;
    }

    boot::configure_system(
        &mem,
        &kernel,
        &cmdline,
        initrd,
        mem_size,
        config.machine_config.vcpu_count,
    )?;
    log::info!(
        "booting {:?} ({} MiB, {} vCPU), command line: {}",
        config.boot_source.kernel_image_path,
        config.machine_config.mem_size_mib,
        config.machine_config.vcpu_count,
        cmdline
            .as_cstring()
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default()
    );

    // SAFETY-free: the handler does nothing; its only purpose is to make KVM_RUN return EINTR.
    extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}
    register_signal_handler(SIGRTMIN(), kick_handler)
        .map_err(|e| VmmError::Thread(io::Error::from_raw_os_error(e.errno())))?;

    let vcpu_exit_evt = EventFd::new(libc::EFD_NONBLOCK).map_err(VmmError::EventFd)?;
    let first_exit: Arc<Mutex<Option<VcpuExit>>> = Arc::new(Mutex::new(None));
    let mut vcpu_threads: Vec<JoinHandle<()>> = Vec::new();
    for vcpu in vcpus {
        let id = vcpu.id();
        let exit_evt = vcpu_exit_evt.try_clone().map_err(VmmError::EventFd)?;
        let slot = first_exit.clone();
        let handle = thread::Builder::new()
            .name(format!("vcpu{id}"))
            .spawn(move || {
                let exit = vcpu.run();
                let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
                slot.get_or_insert(exit);
                // If the eventfd cannot be written the main loop still sees the slot on its
                // next watchdog tick.
                let _ = exit_evt.write(1);
            })
            .map_err(VmmError::Thread)?;
        vcpu_threads.push(handle);
    }

    let _console = ConsoleInput::start(serial)?;

    // The VMM thread: wait for the guest to reset or a vCPU to stop; kick the vCPUs
    // periodically so they can check they still make progress.
    const TOKEN_RESET: u64 = 0;
    const TOKEN_VCPU_EXIT: u64 = 1;
    let epoll = Epoll::new().map_err(VmmError::Epoll)?;
    for (fd, token) in [
        (reset_evt.as_raw_fd(), TOKEN_RESET),
        (vcpu_exit_evt.as_raw_fd(), TOKEN_VCPU_EXIT),
    ] {
        epoll
            .ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, token),
            )
            .map_err(VmmError::Epoll)?;
    }
    let mut events = [EpollEvent::default(); 4];
    let metrics_every = config.metrics_interval_secs.map(Duration::from_secs);
    let mut last_metrics = Instant::now();
    let result = 'wait: loop {
        let n = match epoll.wait(WATCHDOG_PERIOD.as_millis() as i32, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => break 'wait Err(VmmError::Epoll(e)),
        };
        for ev in &events[..n] {
            match ev.data() {
                TOKEN_RESET => {
                    log::info!("the guest reset the machine (i8042); stopping");
                    break 'wait Ok(());
                }
                _ => {
                    let exit = first_exit.lock().unwrap_or_else(|p| p.into_inner()).take();
                    match exit {
                        Some(VcpuExit::Reset) => break 'wait Ok(()),
                        Some(VcpuExit::Fault(msg)) => break 'wait Err(VmmError::Guest(msg)),
                        None => {}
                    }
                }
            }
        }
        if n == 0 {
            for t in &vcpu_threads {
                // A vCPU thread that has already ended cannot be signalled; that is fine.
                let _ = t.kill(SIGRTMIN());
            }
        }
        if metrics_every.is_some_and(|every| last_metrics.elapsed() >= every) {
            last_metrics = Instant::now();
            print_metrics(&nets);
        }
    };
    // Stop the device workers so that their last counts are published, then report.
    for net in &nets {
        net.transport
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .shutdown();
    }
    print_metrics(&nets);
    result
}

/// A virtio-net device as the VMM keeps it: its transport (for shutdown) and metrics.
struct AttachedNet {
    tap: String,
    transport: Arc<Mutex<MmioTransport>>,
    metrics: Arc<NetMetrics>,
}

/// Creates each virtio-net device, places it in MMIO space with its GSI, and registers its
/// queue notifications as ioeventfds and its interrupt as an irqfd.
fn attach_net_devices(
    config: &VmConfig,
    vm: &Vm,
    mem: &memory::GuestMemory,
    mmio: &mut Bus,
    cmdline_devices: &mut Vec<(u64, u32)>,
) -> Result<Vec<AttachedNet>, VmmError> {
    let mut attached = Vec::new();
    for (i, net_config) in config.net.iter().enumerate() {
        let base = memory::MMIO_START + i as u64 * MMIO_DEVICE_SIZE;
        let gsi = config::FIRST_VIRTIO_GSI + i as u32;
        let device = NetDevice::new(net_config).map_err(|source| VmmError::Net {
            tap: net_config.tap.clone(),
            source,
        })?;
        let metrics = device.metrics();
        let transport = MmioTransport::new(mem.clone(), Box::new(device))
            .map_err(|e| VmmError::Transport(e.to_string()))?;
        vm.register_irqfd(transport.irqfd(), gsi)?;
        for (evt, addr, datamatch) in transport.ioeventfds(base) {
            vm.register_mmio_ioevent(evt, addr, datamatch)?;
        }
        let transport = Arc::new(Mutex::new(transport));
        mmio.insert(transport.clone(), base, MMIO_DEVICE_SIZE)?;
        cmdline_devices.push((base, gsi));
        log::info!(
            "virtio-net on tap {:?} (MAC {}) at {base:#x}, GSI {gsi}",
            net_config.tap,
            net_config.mac
        );
        attached.push(AttachedNet {
            tap: net_config.tap.clone(),
            transport,
            metrics,
        });
    }
    Ok(attached)
}

/// Prints the device metrics as one JSON line on stderr: `{"net":{"TAP":{...},...}}`.
fn print_metrics(nets: &[AttachedNet]) {
    if nets.is_empty() {
        return;
    }
    let mut by_tap = serde_json::Map::new();
    for net in nets {
        let value = serde_json::to_value(&*net.metrics).unwrap_or(serde_json::Value::Null);
        by_tap.insert(net.tap.clone(), value);
    }
    let line = serde_json::json!({ "net": by_tap });
    eprintln!("{line}");
}

/// Copies the host's stdin into the UART, in raw mode when stdin is a terminal (restored when
/// dropped).
struct ConsoleInput {
    raw_tty: bool,
}

impl ConsoleInput {
    fn start<W: io::Write + Send + 'static>(
        serial: Arc<Mutex<Serial<W>>>,
    ) -> Result<Self, VmmError> {
        let stdin = io::stdin();
        let raw_tty = stdin.is_terminal() && stdin.lock().set_raw_mode().is_ok();
        thread::Builder::new()
            .name("console-in".into())
            .spawn(move || {
                let mut buf = [0u8; 64];
                let mut input = io::stdin().lock();
                loop {
                    let n = match input.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    let mut pending = &buf[..n];
                    while !pending.is_empty() {
                        let taken = serial
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .enqueue_input(pending)
                            .unwrap_or(0);
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
