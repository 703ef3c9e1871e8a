//! The VMM thread's answers to API requests: configuration before boot, run-time tuning of
//! the network interfaces, and actions.

use event_manager::EventOps;

use devices::virtio::net::{
    CoalescingInForce, CoalescingSource, DirectionCoalescing, TuningControl,
};

use super::{
    ActionType, InstanceInfo, NetworkInterfaceInfo, VmmActionError, VmmRequest, VmmResponse,
    VmmResult,
};
use crate::config::{BootSource, NetworkInterface, NetworkInterfaceUpdate};
use crate::{files, VmEnd, Vmm};

impl Vmm {
    /// Answers one request (on the VMM thread; `ops` registers a VM's event sources when
    /// InstanceStart boots it).
    pub(crate) fn handle(&mut self, request: VmmRequest, ops: &mut EventOps) -> VmmResult {
        match request {
            VmmRequest::GetInstanceInfo => json(&InstanceInfo {
                id: self.instance_id.clone(),
                state: self.state().into(),
                vmm_version: env!("CARGO_PKG_VERSION").into(),
                app_name: "vmm".into(),
            }),
            VmmRequest::GetVmConfig => json(&self.config),
            VmmRequest::GetMachineConfig => json(&self.config.machine_config),
            VmmRequest::GetMetrics => Ok(VmmResponse::Metrics(self.metrics())),
            VmmRequest::PatchNetworkInterface(update) => self.patch_network_interface(update),
            VmmRequest::GetNetworkInterface(id) => self.get_network_interface(&id),
            VmmRequest::Action(action) => self.action(action, ops),
            configure => self.configure(configure),
        }
    }

    /// The pre-boot configuration requests.
    fn configure(&mut self, request: VmmRequest) -> VmmResult {
        if self.vm.is_some() {
            return Err(VmmActionError::NotAfterBoot);
        }
        match request {
            VmmRequest::PutBootSource(boot_source) => {
                check_boot_files(&boot_source)?;
                self.config.set_boot_source(boot_source)?;
            }
            VmmRequest::PutMachineConfig(machine) => self.config.set_machine_config(machine)?,
            VmmRequest::PatchMachineConfig(update) => {
                if update.is_empty() {
                    return Err(VmmActionError::EmptyUpdate { hint: "" });
                }
                let machine = self.config.machine_config.updated(&update);
                self.config.set_machine_config(machine)?;
            }
            VmmRequest::PutNetworkInterface(iface) => self.config.put_network_interface(iface)?,
            other => {
                return Err(VmmActionError::Other(format!(
                    "not a configuration: {other:?}"
                )))
            }
        }
        Ok(VmmResponse::NoContent)
    }

    /// `PATCH /network-interfaces/{id}`: new rate limiters and/or knobs, before boot or on
    /// the running device (between two batches).
    fn patch_network_interface(&mut self, update: NetworkInterfaceUpdate) -> VmmResult {
        let live = self
            .vm
            .as_ref()
            .and_then(|vm| vm.tuning_control(&update.iface_id));
        let iface = self
            .config
            .network_interface_mut(&update.iface_id)
            .ok_or_else(|| VmmActionError::UnknownInterface(update.iface_id.clone()))?;
        if let Some(socket) = &iface.vhost_user_socket {
            return Err(VmmActionError::Other(format!(
                "network interface {:?} is served by the vhost-user backend on {socket:?}: \
                 tune it and its rate limiters through the backend's own API \
                 (vhost-user-net --api-sock)",
                update.iface_id
            )));
        }
        patch_interface(iface, live, update)
    }

    /// `GET /network-interfaces/{id}`: the configuration and the coalescing in force (before
    /// boot, the configured one).
    fn get_network_interface(&self, id: &str) -> VmmResult {
        let iface = self
            .config
            .network_interfaces
            .iter()
            .find(|n| n.iface_id == id)
            .ok_or_else(|| VmmActionError::UnknownInterface(id.to_owned()))?;
        interface_info(iface, self.vm.as_ref().and_then(|vm| vm.tuning_control(id)))
    }

    /// `PUT /actions`.
    fn action(&mut self, action: ActionType, ops: &mut EventOps) -> VmmResult {
        match action {
            ActionType::InstanceStart => {
                if self.vm.is_some() {
                    return Err(VmmActionError::AlreadyRunning);
                }
                self.config.validate()?;
                self.start_vm(ops)
                    .map_err(|e| VmmActionError::Start(Box::new(e)))?;
            }
            ActionType::SendCtrlAltDel => {
                let vm = self.vm.as_ref().ok_or(VmmActionError::NotRunning)?;
                if vm.send_ctrl_alt_del() {
                    log::info!("Ctrl+Alt+Del sent to the guest's keyboard");
                } else {
                    // See docs/api/README.md ("SendCtrlAltDel"): no driver can receive the keys.
                    log::info!(
                        "Ctrl+Alt+Del: the guest has no i8042 keyboard driver (it never enabled \
                         the keyboard interrupt), so it cannot see the keys; stopping the VM"
                    );
                    self.exit.get_or_insert(Ok(VmEnd::GuestReset));
                }
            }
            ActionType::FlushMetrics => self.print_metrics(),
        }
        Ok(VmmResponse::NoContent)
    }
}

/// `PATCH /network-interfaces/{id}` on `iface`: new rate limiters and/or knobs, on its running
/// device too when there is one (`live`: its tuning handle), which takes them between two
/// batches. Shared by `vmm` and `vhost-user-net`.
pub fn patch_interface(
    iface: &mut NetworkInterface,
    live: Option<&TuningControl>,
    update: NetworkInterfaceUpdate,
) -> VmmResult {
    let id = update.iface_id;
    let tuning = update.tuning.filter(|t| !t.is_empty());
    let limits = (update.rx_rate_limiter, update.tx_rate_limiter);
    if tuning.is_none() && limits == (None, None) {
        return Err(VmmActionError::EmptyUpdate {
            hint: " (give `rx_rate_limiter`, `tx_rate_limiter` or `tuning`)",
        });
    }
    if limits != (None, None) {
        let rx = iface
            .rx_rate_limiter
            .unwrap_or_default()
            .updated(&limits.0.unwrap_or_default());
        let tx = iface
            .tx_rate_limiter
            .unwrap_or_default()
            .updated(&limits.1.unwrap_or_default());
        let refused = |source| VmmActionError::RateLimiter {
            iface_id: id.clone(),
            source,
        };
        for limiter in [&rx, &tx] {
            limiter.validate().map_err(refused)?;
        }
        if let Some(live) = live {
            live.set_rate_limiters(rx, tx).map_err(refused)?;
        }
        iface.rx_rate_limiter = (rx != Default::default()).then_some(rx);
        iface.tx_rate_limiter = (tx != Default::default()).then_some(tx);
        log::info!("network interface {id:?}: rate limiters now rx {rx:?}, tx {tx:?}");
    }
    let Some(tuning) = tuning else {
        return Ok(VmmResponse::NoContent);
    };
    let refused = |source| VmmActionError::Tuning {
        iface_id: id.clone(),
        source,
    };
    let new = match live {
        // `update` (not `set`): naming the coalescing takes it back from the guest.
        Some(live) => live.update(&tuning).map_err(refused)?,
        None => {
            let new = iface.tuning.updated(&tuning);
            new.validate().map_err(refused)?;
            new
        }
    };
    iface.tuning = new;
    log::info!("network interface {id:?}: tuning now {new:?}");
    Ok(VmmResponse::NoContent)
}

/// `GET /network-interfaces/{id}` of `iface`: its configuration and the coalescing in force
/// on its running device (`live`), or the configured one.
pub fn interface_info(iface: &NetworkInterface, live: Option<&TuningControl>) -> VmmResult {
    let coalescing_in_force = match live {
        Some(live) => live.coalescing_in_force(),
        None => {
            let c = iface.tuning.interrupt_coalescing;
            let direction = DirectionCoalescing {
                source: CoalescingSource::Operator,
                max_packets: c.max_packets,
                max_usecs: c.max_usecs,
            };
            CoalescingInForce {
                rx: direction,
                tx: direction,
            }
        }
    };
    json(&NetworkInterfaceInfo {
        config: iface.clone(),
        coalescing_in_force,
    })
}

/// The kernel and initrd must be regular files we can open (not a FIFO that would block).
fn check_boot_files(boot_source: &BootSource) -> Result<(), VmmActionError> {
    boot_source.validate()?;
    let files = [
        Some(("kernel image", &boot_source.kernel_image_path)),
        boot_source.initrd_path.as_ref().map(|p| ("initrd", p)),
    ];
    for (what, path) in files.into_iter().flatten() {
        files::open_regular(path).map_err(|source| VmmActionError::Open {
            what,
            path: path.clone(),
            source,
        })?;
    }
    Ok(())
}

fn json<T: serde::Serialize>(value: &T) -> VmmResult {
    serde_json::to_value(value)
        .map(VmmResponse::Json)
        .map_err(VmmActionError::Serialise)
}
