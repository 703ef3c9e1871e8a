# Device statistics test (VIRTIO_NET_F_DEVICE_STATS): eth0 up with a permanent ARP entry for the
# host (so that no ARP probe crosses the link later), ping the host, then, with the link quiet,
# `ethtool -S eth0` (the driver reads the device's counters over the control queue) and the
# kernel log. Needs the `ethtool` initramfs variant (resources/build-guest.sh
# --initrd-variant=ethtool). Parameters from the kernel command line (defaults in brackets):
#   vmm.ip=ADDR/PREFIX [10.200.0.2/24]  vmm.peer=ADDR [10.200.0.1]
#   vmm.peermac=MAC (the host tap's, for the ARP entry)  vmm.pings=N [5]
# Console lines for the host:
#   "vmm-guest: stats: link quiet"       traffic done; ethtool runs 2 s later
#   "vmm-guest: ethtool -S eth0 begin" / "vmm-guest: ethtool -S eth0 end status=N"
#   "vmm-guest: dmesg begin" / "vmm-guest: dmesg end"
# Sourced by /init: do not `exit`.
vmm_ip=10.200.0.2/24 vmm_peer=10.200.0.1 vmm_peermac= vmm_pings=5
set -f
for vmm_arg in $vmm_cmdline; do
	case $vmm_arg in
	vmm.ip=*) vmm_ip=${vmm_arg#vmm.ip=} ;;
	vmm.peer=*) vmm_peer=${vmm_arg#vmm.peer=} ;;
	vmm.peermac=*) vmm_peermac=${vmm_arg#vmm.peermac=} ;;
	vmm.pings=*) vmm_pings=${vmm_arg#vmm.pings=} ;;
	esac
done
set +f
/bin/busybox ip link set eth0 up &&
	/bin/busybox ip addr add "$vmm_ip" dev eth0 &&
	echo "vmm-guest: eth0 up $vmm_ip"
if [ -n "$vmm_peermac" ]; then
	/bin/busybox arp -i eth0 -s "$vmm_peer" "$vmm_peermac" &&
		echo "vmm-guest: arp entry $vmm_peer $vmm_peermac"
fi
/bin/busybox ping -c "$vmm_pings" -i 0.2 -W 10 "$vmm_peer"
echo "vmm-guest: stats: link quiet"
# The host reads the device's metrics now, before the driver's GET.
/bin/busybox sleep 2
echo "vmm-guest: ethtool -S eth0 begin"
/sbin/ethtool -S eth0
echo "vmm-guest: ethtool -S eth0 end status=$?"
echo "vmm-guest: dmesg begin"
/bin/busybox dmesg
echo "vmm-guest: dmesg end"
