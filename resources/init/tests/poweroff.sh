# Checks that the guest runs a test and then ends the VM: /init prints
# "vmm-guest: done" after this and reboots (reboot=k), which must stop the VMM.
# Sourced by /init: do not `exit`.
echo "vmm-guest: marker-ok"
