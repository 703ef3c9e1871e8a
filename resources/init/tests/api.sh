# API test: the network test (eth0 up, ping the host, optional UDP echo: see net.sh), then the
# guest stays up until the host ends the VM (the integration test sends SendCtrlAltDel).
# Sourced by /init: do not `exit`.
. /tests/net.sh
echo "vmm-guest: idle"
/bin/busybox sleep 100000
