# Default test (no vmm.run= on the command line). Sourced by /init: do not
# `exit`. Each external command costs ~0.5 s here; this one forks once.
echo "vmm-guest: demo"
uname -a
# Interface names from /proc/net/dev with builtins only ("  eth0: 123 ...").
vmm_ifaces=
while read -r vmm_line; do
	case $vmm_line in
	*:*) vmm_ifaces="$vmm_ifaces ${vmm_line%%:*}" ;;
	esac
done < /proc/net/dev
echo "vmm-guest: interfaces:${vmm_ifaces:- none}"
unset vmm_line vmm_ifaces
