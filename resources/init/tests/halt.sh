# Powers off without ACPI: the kernel halts the CPU with interrupts disabled and the VM can
# never make progress again. The VMM must notice and say so instead of hanging.
# Sourced by /init: do not `exit`.
echo "vmm-guest: halting"
/bin/busybox poweroff -f
