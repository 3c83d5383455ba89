#!/bin/busybox sh
# /init of the initramfs `cargo xtask kernels` boots each kernel with (see xtask/src/kernels.rs).
# It runs abissd and abissctl from the host's build on a loop device and reports on the serial
# console: `@@ KEY VALUE…` lines and `@@begin NAME` … `@@end NAME` blocks. It never mounts
# debugfs. READ_SECS comes from the kernel command line (abiss_read_secs=N), and abissd's log
# filter too (abiss_log=FILTER).
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
say() { echo "@@ $*"; }
block() { echo "@@begin $1"; cat "$2" 2>/dev/null; echo; echo "@@end $1"; }
finish() { sync; poweroff -f; }
say booted "$(cut -d' ' -f1 /proc/uptime)" "$(uname -r)"
for module in $(cat /lib/modules/load-order 2>/dev/null); do
    insmod "/lib/modules/$module" || say module-failed "$module"
done
programs() { /usr/sbin/bpftool prog show 2>/dev/null | grep -c '^[0-9]*:'; }
# BPF pins, device state records and the socket abissd left: nothing, once it has stopped.
# (The per-disk lock files stay by design: see scheduler-user/src/device/state.rs.)
leftovers() {
    for f in /sys/fs/bpf/* $(find $dir/state -type f -name '*.json' 2>/dev/null) $socket; do
        [ -e "$f" ] && printf '%s ' "$f"
    done
}
say bpf-before "$(programs)"

# A 96 MiB ext4 loop device, and a cold 24 MB file on it.
truncate -s 96M /tmp/disk.img
dev=$(losetup -f)
losetup "$dev" /tmp/disk.img || { say setup-failed losetup; finish; }
/usr/sbin/mke2fs -q -t ext4 "$dev" || { say setup-failed mke2fs; finish; }
mkdir -p /mnt/disk
mount -t ext4 "$dev" /mnt/disk || { say setup-failed mount; finish; }
dd if=/dev/urandom of=/mnt/disk/stream.bin bs=1M count=24 2>/dev/null
sync
echo 3 >/proc/sys/vm/drop_caches

dir=/run/abiss
socket=$dir/abiss.sock
mkdir -p $dir
set -- --socket $socket --state-dir $dir/state --model-dir $dir/models --device "${dev#/dev/}" --capacity 30MB/s
started=$(cut -d' ' -f1 /proc/uptime)
RUST_LOG="${abiss_log:-info}" abissd "$@" >/tmp/abissd.log 2>&1 &
pid=$!
answered=no
i=0
while [ $i -lt 1200 ]; do
    kill -0 $pid 2>/dev/null || break
    if abissctl --socket $socket status >/dev/null 2>&1; then answered=yes; break; fi
    sleep 0.1
    i=$((i + 1))
done
if [ $answered = no ]; then
    wait $pid
    say abissd-exit $?
    block abissd-log /tmp/abissd.log
    # Again with abissd's default logging: what a user sees on the terminal.
    abissd "$@" >/tmp/plain.out 2>/tmp/plain.err
    say plain-exit $?
    block plain-stderr /tmp/plain.err
    block plain-stdout /tmp/plain.out
    say bpf-after "$(programs)"
    say leftovers "$(leftovers)"
    dmesg | tail -n 30 >/tmp/dmesg.txt
    block dmesg /tmp/dmesg.txt
    finish
fi
say answered-after "$started" "$(cut -d' ' -f1 /proc/uptime)"
abissctl --socket $socket status --json >/tmp/status.json
block status-json /tmp/status.json
id=$(abissctl --socket $socket attach /mnt/disk/stream.bin --rate 1MB/s 2>/tmp/attach.err)
say attach $? "$id"
block attach-stderr /tmp/attach.err
# 1 MB/s in 64 KiB reads with the default 564 KiB buffer, as stream_guarantee.rs does.
abiss-test-reader /mnt/disk/stream.bin 1000000 65536 577536 "${abiss_read_secs:-8}" >/tmp/reader.json 2>/tmp/reader.err
say reader-exit $?
block reader /tmp/reader.json
block reader-stderr /tmp/reader.err
abissctl --socket $socket list --json >/tmp/list.json
block list-json /tmp/list.json
abissctl --socket $socket detach "$id" >/tmp/detach.out 2>&1
say detach $?
kill -TERM $pid
wait $pid
say abissd-exit $?
block abissd-log /tmp/abissd.log
say bpf-after "$(programs)"
say leftovers "$(leftovers)"
say elevator "$(cat /sys/block/${dev#/dev/}/queue/scheduler)"
dmesg | grep -i -E 'bpf|abiss|warn|bug' | tail -n 20 >/tmp/dmesg.txt
block dmesg /tmp/dmesg.txt
umount /mnt/disk
losetup -d "$dev"
finish
