# Network test: configure eth0, ping the host, then echo UDP datagrams back to the host with
# every byte checked (/bin/nettest, a static program that runs in guest user mode).
# Parameters from the kernel command line (defaults in brackets):
#   vmm.ip=ADDR/PREFIX [10.200.0.2/24]  vmm.peer=ADDR [10.200.0.1]  vmm.mtu=N [1500]
#   vmm.echo=COUNT [0: no echo]         vmm.port=PORT [7777]
#   vmm.tcp=BYTES [0: no TCP]: accept one TCP connection on PORT, check BYTES, send BYTES back
#   vmm.irqs=1 [0]: at the end, print /proc/interrupts and /proc/bus/pci/devices (the
#     per-queue MSI-X vectors of a virtio-pci device), and, on a kernel with sysfs (the
#     `sysfs` variant; the usual test kernel has none), /sys/class/net/eth0/queues
#   vmm.barmove=1 [0]: after the ping, move 00:01.0's BAR0 (a 64-bit BAR at 0xe0000000) to
#     0xe0008000, to 0xc0000000 (outside the PCI window), and back, through /proc/bus/pci, then ping again
# Sourced by /init: do not `exit`.
vmm_ip=10.200.0.2/24 vmm_peer=10.200.0.1 vmm_mtu=1500 vmm_echo=0 vmm_port=7777 vmm_tcp=0 vmm_irqs=0 vmm_barmove=0
set -f
for vmm_arg in $vmm_cmdline; do
	case $vmm_arg in
	vmm.ip=*) vmm_ip=${vmm_arg#vmm.ip=} ;;
	vmm.peer=*) vmm_peer=${vmm_arg#vmm.peer=} ;;
	vmm.mtu=*) vmm_mtu=${vmm_arg#vmm.mtu=} ;;
	vmm.echo=*) vmm_echo=${vmm_arg#vmm.echo=} ;;
	vmm.port=*) vmm_port=${vmm_arg#vmm.port=} ;;
	vmm.tcp=*) vmm_tcp=${vmm_arg#vmm.tcp=} ;;
	vmm.irqs=*) vmm_irqs=${vmm_arg#vmm.irqs=} ;;
	vmm.barmove=*) vmm_barmove=${vmm_arg#vmm.barmove=} ;;
	esac
done
set +f
/bin/busybox ip link set eth0 mtu "$vmm_mtu" up &&
	/bin/busybox ip addr add "$vmm_ip" dev eth0 &&
	echo "vmm-guest: eth0 up $vmm_ip mtu $vmm_mtu"
/bin/busybox ping -c 3 -W 10 "$vmm_peer"
if [ "$vmm_barmove" = 1 ]; then
	# BAR0's low dword (config offset 0x10), little endian: 0xe0008000, 0xc0000000, 0xe0000000.
	# (Tries again: a short-lived dd dies of SIGSEGV now and then on the emulating host, for
	# minutes at a time three tries in a row; the write is idempotent.)
	for vmm_bar in '\000\200\000\340' '\000\000\000\300' '\000\000\000\340'; do
		for vmm_try in 1 2 3 4 5 6 7 8 9 10; do
			/bin/busybox printf "$vmm_bar" |
				/bin/busybox dd of=/proc/bus/pci/00/01.0 bs=4 seek=4 count=1 conv=notrunc \
					2>/dev/null && echo "vmm-guest: BAR0 written" && break
		done
	done
	/bin/busybox ping -c 3 -W 10 "$vmm_peer"
fi
if [ "$vmm_echo" != 0 ]; then
	# The host waits for this line before it starts sending.
	/bin/nettest echo "$vmm_port" "$vmm_echo" 60
fi
if [ "$vmm_tcp" != 0 ]; then
	/bin/nettest tcp "$vmm_port" "$vmm_tcp"
fi
if [ "$vmm_irqs" = 1 ]; then
	echo "vmm-guest: /proc/interrupts"
	/bin/busybox cat /proc/interrupts
	echo "vmm-guest: /proc/bus/pci/devices"
	/bin/busybox cat /proc/bus/pci/devices
	if /bin/busybox mount -t sysfs sysfs /sys 2>/dev/null; then
		echo "vmm-guest: /sys/class/net/eth0/queues"
		/bin/busybox ls /sys/class/net/eth0/queues
	fi
	echo "vmm-guest: end of lists"
fi
echo "vmm-guest: net test finished"
