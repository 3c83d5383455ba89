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
# Waits up to 120 s for abissd (process $pid) to answer on $socket.
await_abissd() {
    i=0
    while [ $i -lt 1200 ] && ! abissctl --socket $socket status >/dev/null 2>&1; do
        kill -0 $pid 2>/dev/null || break
        sleep 0.1
        i=$((i + 1))
    done
}
# Attaches file $2 at 1 MB/s as run $1 (`stack`, `md`, `striped`), reads it for 4 s with the
# paced reader (TCG decrypts slowly, and the main run took the long read) and lists the
# streams; leaves it attached, its id in $id.
read_attached() {
    id=$(abissctl --socket $socket attach "$2" --rate 1MB/s 2>/tmp/$1-attach.err)
    say $1-attach $? "$id"
    block $1-attach-stderr /tmp/$1-attach.err
    abiss-test-reader "$2" 1000000 65536 577536 4 >/tmp/$1-reader.json 2>/tmp/$1-reader.err
    say $1-reader-exit $?
    block $1-reader /tmp/$1-reader.json
    block $1-reader-stderr /tmp/$1-reader.err
    abissctl --socket $socket list --json >/tmp/$1-list.json
    block $1-list-json /tmp/$1-list.json
}
# A stream on file $2 as run $1, which must be refused: its exit code and sentence, and what
# doctor (as root) says of the file.
refused_attach() {
    abissctl --socket $socket attach "$2" --rate 1MB/s >/dev/null 2>/tmp/$1-attach.err
    say $1-attach $?
    block $1-attach-stderr /tmp/$1-attach.err
    abissctl --socket $socket doctor "$2" >/tmp/$1-doctor.txt 2>&1
    block $1-doctor /tmp/$1-doctor.txt
}
# A recording of file $2 as run $1, which must be refused: its exit code and sentence.
refused_recording() {
    abissctl --socket $socket attach "$2" --rate 1MB/s --write >/dev/null 2>/tmp/$1-write.err
    say $1-write-attach $?
    block $1-write-stderr /tmp/$1-write.err
}
say bpf-before "$(programs)"
# `cargo xtask kernels --stacks-under-load`: the stacks on slow disks, and nothing else.
if [ "${abiss_load:-0}" = 1 ]; then . /load.sh; finish; fi

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
# abissd's requests at the loop device, by priority (judged with the stack's: stacks.rs).
say main-disk "$(cat /sys/block/${dev#/dev/}/dev)"
say abissd-pid $pid
abissctl --socket $socket trace --events --json --device "${dev#/dev/}" >/tmp/events.json 2>/dev/null &
tracer=$!
sleep 1
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
kill $tracer
wait $tracer
block events /tmp/events.json
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

# Storage stacks (issue 35). LVM on LUKS as Debian's and Ubuntu's encrypted installs make it,
# over one loop device: dm-crypt (aes-xts-plain64, a fixed key), dm-linear on it, each with
# the uuid its tool gives (CRYPT-…, LVM-…), which is how abissd tells them apart; ext4 on
# top. And an md raid1 of two loop devices with ext4, served from both (a recording on it is
# refused), and LVM striped over two more (dm-striped, 64 KiB stripes, LVM's uuid). One abissd
# manages the disks under all, named at the top of each stack (`--device dm-N`, `--device md0`).
export DM_DISABLE_UDEV=1
truncate -s 64M /tmp/stack.img
truncate -s 32M /tmp/md-a.img
truncate -s 32M /tmp/md-b.img
stack_dev=$(losetup -f); losetup "$stack_dev" /tmp/stack.img
md_a=$(losetup -f); losetup "$md_a" /tmp/md-a.img
md_b=$(losetup -f); losetup "$md_b" /tmp/md-b.img
truncate -s 32M /tmp/striped-a.img
truncate -s 32M /tmp/striped-b.img
st_a=$(losetup -f); losetup "$st_a" /tmp/striped-a.img
st_b=$(losetup -f); losetup "$st_b" /tmp/striped-b.img
sectors=$(blockdev --getsz "$stack_dev")
key=000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
dmsetup create abiss-crypt --uuid CRYPT-PLAIN-abiss-crypt \
    --table "0 $sectors crypt aes-xts-plain64 $key 0 $stack_dev 0" 2>/tmp/dm.err \
    && dmsetup create abiss-vg-lv --uuid LVM-abissabissabissabissabissabissabissabissabissabissabissabissab \
        --table "0 $sectors linear /dev/mapper/abiss-crypt 0" 2>>/tmp/dm.err \
    && dmsetup create abiss-vg-striped --uuid LVM-abissabissabissabissabissabissabissabissabissabissabissabissst \
        --table "0 $(( $(blockdev --getsz "$st_a") * 2 )) striped 2 128 $st_a 0 $st_b 0" 2>>/tmp/dm.err \
    || { say stack-failed dmsetup; block stack-failed-stderr /tmp/dm.err; finish; }
# Without udev, libdevmapper makes /dev/mapper/NAME a node of its own, not a link to dm-N.
for d in /sys/block/dm-*; do [ "$(cat "$d/dm/name")" = abiss-vg-lv ] && lv=${d##*/}; done
for d in /sys/block/dm-*; do [ "$(cat "$d/dm/name")" = abiss-vg-striped ] && striped=${d##*/}; done
/usr/sbin/mke2fs -q -t ext4 /dev/mapper/abiss-vg-lv || { say stack-failed mke2fs; finish; }
mkdir -p /mnt/stack /mnt/md /mnt/striped
mount -t ext4 /dev/mapper/abiss-vg-lv /mnt/stack || { say stack-failed mount; finish; }
dd if=/dev/urandom of=/mnt/stack/stream.bin bs=1M count=8 2>/dev/null
mdadm --create /dev/md0 --run --quiet --level=1 --raid-devices=2 --metadata=1.2 --assume-clean \
    "$md_a" "$md_b" >/tmp/md.err 2>&1 || { say stack-failed mdadm; block stack-failed-stderr /tmp/md.err; finish; }
/usr/sbin/mke2fs -q -t ext4 /dev/md0 && mount -t ext4 /dev/md0 /mnt/md || { say stack-failed md-mount; finish; }
dd if=/dev/urandom of=/mnt/md/stream.bin bs=1M count=8 2>/dev/null
/usr/sbin/mke2fs -q -t ext4 /dev/mapper/abiss-vg-striped && mount -t ext4 /dev/mapper/abiss-vg-striped /mnt/striped \
    || { say stack-failed striped-mount; finish; }
dd if=/dev/urandom of=/mnt/striped/stream.bin bs=1M count=8 2>/dev/null
sync
echo 3 >/proc/sys/vm/drop_caches
say stack "${stack_dev#/dev/}" "$(cat /sys/block/${stack_dev#/dev/}/dev)" "$lv" "$(cat /sys/block/$lv/dev)" "${md_a#/dev/}" "${md_b#/dev/}"
say md-members "$(cat /sys/block/${md_a#/dev/}/dev)" "$(cat /sys/block/${md_b#/dev/}/dev)"
say striped-members "$(cat /sys/block/${st_a#/dev/}/dev)" "$(cat /sys/block/${st_b#/dev/}/dev)"
say stack-elevators-before "$(cat /sys/block/${stack_dev#/dev/}/queue/scheduler)" "|" "$(cat /sys/block/${md_a#/dev/}/queue/scheduler)" "|" "$(cat /sys/block/${md_b#/dev/}/queue/scheduler)" "|" "$(cat /sys/block/${st_a#/dev/}/queue/scheduler)" "|" "$(cat /sys/block/${st_b#/dev/}/queue/scheduler)"
say stack-bpf-before "$(programs)"
RUST_LOG="${abiss_log:-info}" abissd --socket $socket --state-dir $dir/state --model-dir $dir/models \
    --device "$lv" --device md0 --device "$striped" --capacity 30MB/s >/tmp/stack-abissd.log 2>&1 &
pid=$!
await_abissd
abissctl --socket $socket doctor /mnt/stack/stream.bin >/tmp/stack-doctor.txt 2>&1
block stack-doctor /tmp/stack-doctor.txt
abissctl --socket $socket doctor /mnt/md/stream.bin >/tmp/md-doctor.txt 2>&1
block md-doctor /tmp/md-doctor.txt
abissctl --socket $socket doctor /mnt/striped/stream.bin >/tmp/striped-doctor.txt 2>&1
block striped-doctor /tmp/striped-doctor.txt
abissctl --socket $socket trace --events --json >/tmp/stack-events.json 2>/dev/null &
tracer=$!
sleep 1
refused_recording stack /mnt/stack/stream.bin
read_attached stack /mnt/stack/stream.bin
abissctl --socket $socket detach "$id" >/dev/null 2>&1
say stack-detach $?
refused_recording md /mnt/md/stream.bin
read_attached md /mnt/md/stream.bin
abissctl --socket $socket status --json >/tmp/md-status.json 2>&1
block md-status /tmp/md-status.json
# A plan for md0 answers for its members, each charged the stream attached now.
abissctl --socket $socket admit --device md0 --rate 1MB/s --json >/tmp/md-admit.json 2>&1
block md-admit /tmp/md-admit.json
abissctl --socket $socket detach "$id" >/dev/null 2>&1
say md-detach $?
read_attached striped /mnt/striped/stream.bin
abissctl --socket $socket detach "$id" >/dev/null 2>&1
say striped-detach $?
# Stacks abissd does not serve: md raid5 over three loop devices, and LVM's raid5 (dm-raid,
# md's raid5 personality under the device mapper, LVM's uuid) over three more. md's own thread
# builds their requests from its stripe cache, so an attach of a file on either is refused
# with one sentence naming the layer, and doctor (as root) says so too.
for n in 1 2 3 4 5 6; do truncate -s 16M /tmp/r5-$n.img; done
r5_1=$(losetup -f); losetup "$r5_1" /tmp/r5-1.img; r5_2=$(losetup -f); losetup "$r5_2" /tmp/r5-2.img
r5_3=$(losetup -f); losetup "$r5_3" /tmp/r5-3.img; r5_4=$(losetup -f); losetup "$r5_4" /tmp/r5-4.img
r5_5=$(losetup -f); losetup "$r5_5" /tmp/r5-5.img; r5_6=$(losetup -f); losetup "$r5_6" /tmp/r5-6.img
mkdir -p /mnt/md5 /mnt/lvm5
if mdadm --create /dev/md1 --run --quiet --level=5 --raid-devices=3 --metadata=1.2 --assume-clean \
    "$r5_1" "$r5_2" "$r5_3" >/tmp/md5.err 2>&1 \
    && /usr/sbin/mke2fs -q -t ext4 /dev/md1 2>>/tmp/md5.err && mount -t ext4 /dev/md1 /mnt/md5 2>>/tmp/md5.err; then
    dd if=/dev/urandom of=/mnt/md5/stream.bin bs=1M count=2 2>/dev/null
    refused_attach md5 /mnt/md5/stream.bin
else
    say md5-failed; block md5-failed-stderr /tmp/md5.err
fi
# 2 parameters (a chunk of 128 sectors, no initial sync), three devices without metadata.
if dmsetup create abiss-vg-raid5 --uuid LVM-abissabissabissabissabissabissabissabissabissabissabissabissr5 \
    --table "0 65536 raid raid5_ls 2 128 nosync 3 - $r5_4 - $r5_5 - $r5_6" 2>/tmp/lvm5.err \
    && /usr/sbin/mke2fs -q -t ext4 /dev/mapper/abiss-vg-raid5 2>>/tmp/lvm5.err \
    && mount -t ext4 /dev/mapper/abiss-vg-raid5 /mnt/lvm5 2>>/tmp/lvm5.err; then
    dd if=/dev/urandom of=/mnt/lvm5/stream.bin bs=1M count=2 2>/dev/null
    refused_attach lvm5 /mnt/lvm5/stream.bin
else
    say lvm5-failed; block lvm5-failed-stderr /tmp/lvm5.err
fi
sleep 1
kill $tracer
wait $tracer
block stack-events /tmp/stack-events.json
kill -TERM $pid
wait $pid
say stack-abissd-exit $?
say stack-abissd-pid $pid
block stack-abissd-log /tmp/stack-abissd.log
say stack-elevators-after "$(cat /sys/block/${stack_dev#/dev/}/queue/scheduler)" "|" "$(cat /sys/block/${md_a#/dev/}/queue/scheduler)" "|" "$(cat /sys/block/${md_b#/dev/}/queue/scheduler)" "|" "$(cat /sys/block/${st_a#/dev/}/queue/scheduler)" "|" "$(cat /sys/block/${st_b#/dev/}/queue/scheduler)"
say stack-bpf-after "$(programs)"
say stack-leftovers "$(leftovers)"
umount /mnt/stack /mnt/md /mnt/striped
# Mounted only where they were built.
umount /mnt/md5 /mnt/lvm5 2>/dev/null
finish
