#!/bin/sh
# socialweb guest init: PID 1 of every vm guest. Mounts the kernel file
# systems, loads the virtio net modules, configures eth0 for qemu user-mode
# networking, runs the guest's userData (/userdata/init, from the second
# initramfs archive appended at boot), prints marker lines on the serial
# console and powers the machine off when userData exits.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /tmp /run /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /tmp
read -r cmdline </proc/cmdline
case " $cmdline " in
*" socialweb.probe "*)
	echo "socialweb-guest: probe ok"
	poweroff -f
	;;
esac
# Module parameters on the kernel command line reach built-in drivers only;
# hand virtio_mmio.device=... (when qemu passes them) to insmod ourselves.
mmio=
for w in $cmdline; do
	case "$w" in virtio_mmio.device=*) mmio="$mmio ${w#virtio_mmio.}" ;; esac
done
for m in virtio_ring virtio virtio_mmio failover net_failover virtio_net; do
	if [ "$m" = virtio_mmio ]; then
		# shellcheck disable=SC2086
		insmod /lib/modules/$m.ko $mmio 2>/dev/null || insmod /lib/modules/$m.ko
	else
		insmod /lib/modules/$m.ko
	fi || echo "socialweb-guest: insmod $m failed"
done
hostname "${SOCIALWEB_HOSTNAME:-guest}"
ip link set lo up
if ip link set eth0 up 2>/dev/null; then
	ip addr add 10.0.2.15/24 dev eth0
	ip route add default via 10.0.2.2
else
	echo "socialweb-guest: no eth0"
fi
if [ -f /userdata/env ]; then . /userdata/env; fi
echo "socialweb-guest: started"
if [ -f /userdata/init ]; then
	cd /
	/bin/sh /userdata/init </dev/null
	code=$?
else
	code=0
fi
echo "socialweb-guest: exited $code"
sync
poweroff -f
