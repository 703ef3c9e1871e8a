//! [`TestTransport`]: a virtio-mmio register file with the status/feature rules a device
//! enforces, shared (`Arc`) between the driver under test and the test.

use std::boxed::Box;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;
use std::vec::Vec;

use crate::features::{
    F_RING_RESET, F_VERSION_1, NET_F_CSUM, NET_F_MAC, NET_F_MRG_RXBUF, NET_F_STATUS,
    RING_F_EVENT_IDX,
};
use crate::transport::{regs, status, MmioRegisters, MAGIC, VERSION_MODERN};

/// Registers of one queue.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct QueueRegs {
    pub(crate) num_max: u32,
    pub(crate) num: u32,
    pub(crate) desc: u64,
    pub(crate) avail: u64,
    pub(crate) used: u64,
    pub(crate) ready: u32,
}

/// The register file. Tests edit it directly (e.g. to offer other features).
#[derive(Debug)]
pub(crate) struct Regs {
    pub(crate) magic: u32,
    pub(crate) version: u32,
    pub(crate) device_id: u32,
    pub(crate) device_features: u64,
    pub(crate) driver_features: u64,
    pub(crate) device_features_sel: u32,
    pub(crate) driver_features_sel: u32,
    pub(crate) status: u32,
    /// Refuse FEATURES_OK whatever the features.
    pub(crate) refuse_features: bool,
    /// Set DEVICE_NEEDS_RESET on DRIVER_OK.
    pub(crate) fail_activation: bool,
    pub(crate) queue_sel: u32,
    /// Rx, tx and control queue (the control queue has `num_max` 0, "absent", by default);
    /// [`Regs::multiqueue`] makes it rx0 tx0 rx1 tx1 … ctrl.
    pub(crate) queues: Vec<QueueRegs>,
    /// MAC (0..6), status (6..8), `max_virtqueue_pairs` (8..10).
    pub(crate) config: [u8; 10],
    pub(crate) config_generation: u32,
    pub(crate) interrupt_status: u32,
    /// Every QueueNotify, in order.
    pub(crate) notifies: Vec<u16>,
    /// Every per-queue reset accepted (QueueReset), by queue index.
    pub(crate) queue_resets: Vec<u16>,
    /// Reads of QueueReset that still return 1 after each accepted reset (an ongoing reset).
    pub(crate) reset_busy_reads: u32,
    /// What is left of `reset_busy_reads` for the current reset.
    pub(crate) reset_reads_left: u32,
    /// Register writes with an unknown offset (should stay empty).
    pub(crate) bad_writes: Vec<(u32, u32)>,
}

impl Default for Regs {
    fn default() -> Regs {
        let mut config = [0u8; 10];
        config[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
        config[6] = 1; // link up
        config[8] = 1; // one queue pair
        Regs {
            magic: MAGIC,
            version: VERSION_MODERN,
            device_id: 1,
            device_features: F_VERSION_1
                | NET_F_MAC
                | NET_F_STATUS
                | RING_F_EVENT_IDX
                | NET_F_MRG_RXBUF
                | NET_F_CSUM,
            driver_features: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            status: 0,
            refuse_features: false,
            fail_activation: false,
            queue_sel: 0,
            queues: std::vec![
                QueueRegs {
                    num_max: 256,
                    ..QueueRegs::default()
                },
                QueueRegs {
                    num_max: 256,
                    ..QueueRegs::default()
                },
                QueueRegs::default(),
            ],
            config,
            config_generation: 0,
            interrupt_status: 0,
            notifies: Vec::new(),
            queue_resets: Vec::new(),
            reset_busy_reads: 0,
            reset_reads_left: 0,
            bad_writes: Vec::new(),
        }
    }
}

impl Regs {
    /// A device with `pairs` queue pairs of `num_max` 256 (`max_virtqueue_pairs` = `pairs`),
    /// offering MQ, the control queue (`num_max` 8 at `2 * pairs`) and NOTF_COAL.
    pub(crate) fn multiqueue(&mut self, pairs: u16) {
        use crate::features::{NET_F_CTRL_VQ, NET_F_MQ, NET_F_NOTF_COAL};
        self.device_features |= NET_F_MQ | NET_F_CTRL_VQ | NET_F_NOTF_COAL;
        self.config[8..10].copy_from_slice(&pairs.to_le_bytes());
        self.queues = (0..2 * pairs)
            .map(|_| QueueRegs {
                num_max: 256,
                ..QueueRegs::default()
            })
            .collect();
        self.queues.push(QueueRegs {
            num_max: 8,
            ..QueueRegs::default()
        });
    }

    /// Notifications of queue `q` so far.
    pub(crate) fn kicks(&self, q: u16) -> usize {
        self.notifies.iter().filter(|&&n| n == q).count()
    }

    fn selected(&mut self) -> Option<&mut QueueRegs> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    fn set_half(addr: &mut u64, high: bool, value: u32) {
        *addr = if high {
            (*addr & 0xffff_ffff) | (u64::from(value) << 32)
        } else {
            (*addr & !0xffff_ffff) | u64::from(value)
        };
    }

    /// QueueReset: accepted (the selected queue's registers back to their defaults) for a
    /// data queue in use, with RING_RESET negotiated and DRIVER_OK set; anything else is a
    /// bad write.
    fn write_queue_reset(&mut self, value: u32) {
        let sel = self.queue_sel;
        let allowed = value == 1
            && self.status & status::DRIVER_OK != 0
            && self.driver_features & F_RING_RESET != 0
            // Data queues only (2 per pair of `max_virtqueue_pairs`), as virtio-net.
            && sel < 2 * u32::from(u16::from_le_bytes([self.config[8], self.config[9]]))
            && self.queues[sel as usize].ready == 1;
        if !allowed {
            self.bad_writes.push((regs::QUEUE_RESET, value));
            return;
        }
        let q = &mut self.queues[sel as usize];
        *q = QueueRegs {
            num_max: q.num_max,
            ..QueueRegs::default()
        };
        self.queue_resets.push(sel as u16);
        self.reset_reads_left = self.reset_busy_reads;
    }

    fn write_status(&mut self, value: u32) {
        if value == 0 {
            self.status = 0;
            self.driver_features = 0;
            for q in &mut self.queues {
                *q = QueueRegs {
                    num_max: q.num_max,
                    ..QueueRegs::default()
                };
            }
            return;
        }
        let mut value = value;
        if value & status::FEATURES_OK != 0 && self.status & status::FEATURES_OK == 0 {
            let ok = !self.refuse_features
                && self.driver_features & !self.device_features == 0
                && self.driver_features & F_VERSION_1 != 0;
            if !ok {
                value &= !status::FEATURES_OK;
            }
        }
        if value & status::DRIVER_OK != 0 && self.fail_activation {
            value |= status::DEVICE_NEEDS_RESET;
        }
        self.status = value;
    }
}

/// Called (outside the register lock) on every QueueNotify with the queue index: a device
/// that answers synchronously, inside the driver's kick.
pub(crate) type NotifyHook = Box<dyn FnMut(u16) + Send>;

struct Shared {
    regs: Mutex<Regs>,
    hook: Mutex<Option<NotifyHook>>,
    /// Signalled on every QueueNotify.
    kicked: Condvar,
    /// Signalled when the device raises an interrupt.
    irq: Condvar,
}

/// The register file as a [`Transport`]. Clones share it.
#[derive(Clone)]
pub(crate) struct TestTransport {
    shared: Arc<Shared>,
}

impl TestTransport {
    pub(crate) fn new(regs: Regs) -> TestTransport {
        TestTransport {
            shared: Arc::new(Shared {
                regs: Mutex::new(regs),
                hook: Mutex::new(None),
                kicked: Condvar::new(),
                irq: Condvar::new(),
            }),
        }
    }

    pub(crate) fn regs(&self) -> MutexGuard<'_, Regs> {
        self.shared.regs.lock().expect("regs lock")
    }

    /// Installs (or with `None` removes) the notification hook.
    pub(crate) fn set_notify_hook(&self, hook: Option<NotifyHook>) {
        *self.shared.hook.lock().expect("hook lock") = hook;
    }

    /// The device side: raises InterruptStatus `bits` and wakes an interrupt waiter.
    pub(crate) fn raise(&self, bits: u32) {
        self.regs().interrupt_status |= bits;
        self.shared.irq.notify_all();
    }

    /// Waits until InterruptStatus is non-zero (true) or `timeout` passes (false).
    pub(crate) fn wait_irq(&self, timeout: Duration) -> bool {
        let regs = self.regs();
        let (regs, _) = self
            .shared
            .irq
            .wait_timeout_while(regs, timeout, |r| r.interrupt_status == 0)
            .expect("irq wait");
        regs.interrupt_status != 0
    }

    /// Waits until queue `q` has been notified more than `seen` times; returns the count.
    pub(crate) fn wait_kick(&self, q: u16, seen: usize, timeout: Duration) -> usize {
        let regs = self.regs();
        let (regs, _) = self
            .shared
            .kicked
            .wait_timeout_while(regs, timeout, |r| r.kicks(q) <= seen)
            .expect("kick wait");
        regs.kicks(q)
    }
}

impl MmioRegisters for TestTransport {
    fn read32(&mut self, offset: u32) -> u32 {
        let mut r = self.regs();
        match offset {
            regs::MAGIC_VALUE => r.magic,
            regs::VERSION => r.version,
            regs::DEVICE_ID => r.device_id,
            regs::VENDOR_ID => 0,
            regs::DEVICE_FEATURES => match r.device_features_sel {
                0 => r.device_features as u32,
                1 => (r.device_features >> 32) as u32,
                _ => 0,
            },
            regs::QUEUE_NUM_MAX => r.selected().map_or(0, |q| q.num_max),
            regs::QUEUE_READY => r.selected().map_or(0, |q| q.ready),
            regs::INTERRUPT_STATUS => r.interrupt_status,
            regs::QUEUE_RESET if r.reset_reads_left > 0 => {
                r.reset_reads_left -= 1;
                1
            }
            regs::STATUS => r.status,
            regs::CONFIG_GENERATION => r.config_generation,
            _ => 0,
        }
    }

    fn write32(&mut self, offset: u32, value: u32) {
        let mut r = self.regs();
        match offset {
            regs::DEVICE_FEATURES_SEL => r.device_features_sel = value,
            regs::DRIVER_FEATURES_SEL => r.driver_features_sel = value,
            regs::DRIVER_FEATURES => match r.driver_features_sel {
                0 => r.driver_features = (r.driver_features & !0xffff_ffff) | u64::from(value),
                1 => {
                    r.driver_features = (r.driver_features & 0xffff_ffff) | (u64::from(value) << 32)
                }
                _ => {}
            },
            regs::QUEUE_SEL => r.queue_sel = value,
            regs::QUEUE_NUM => {
                if let Some(q) = r.selected() {
                    q.num = value;
                }
            }
            regs::QUEUE_READY => {
                if let Some(q) = r.selected() {
                    q.ready = value;
                }
            }
            regs::QUEUE_DESC_LOW | regs::QUEUE_DESC_HIGH => {
                if let Some(q) = r.selected() {
                    Regs::set_half(&mut q.desc, offset == regs::QUEUE_DESC_HIGH, value);
                }
            }
            regs::QUEUE_AVAIL_LOW | regs::QUEUE_AVAIL_HIGH => {
                if let Some(q) = r.selected() {
                    Regs::set_half(&mut q.avail, offset == regs::QUEUE_AVAIL_HIGH, value);
                }
            }
            regs::QUEUE_USED_LOW | regs::QUEUE_USED_HIGH => {
                if let Some(q) = r.selected() {
                    Regs::set_half(&mut q.used, offset == regs::QUEUE_USED_HIGH, value);
                }
            }
            regs::INTERRUPT_ACK => r.interrupt_status &= !value,
            regs::STATUS => r.write_status(value),
            regs::QUEUE_RESET => r.write_queue_reset(value),
            _ => r.bad_writes.push((offset, value)),
        }
    }

    fn read_config_u8(&mut self, offset: u32) -> u8 {
        self.regs()
            .config
            .get(offset as usize)
            .copied()
            .unwrap_or(0)
    }

    fn notify(&mut self, queue: u16) {
        self.regs().notifies.push(queue);
        self.shared.kicked.notify_all();
        if let Some(hook) = self.shared.hook.lock().expect("hook lock").as_mut() {
            hook(queue);
        }
    }
}
