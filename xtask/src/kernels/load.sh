# Sourced by /init when the kernel command line says abiss_load=1 (`cargo xtask kernels
# --stacks-under-load`, xtask/src/kernels/under_load.rs). The storage stacks on two slow
# virtual disks, vda and vdb (qemu throttles each, standing in for an hdd), under a
# best-effort copy loop. For each stack in turn: ext4 on it, a stream file and a 64 MB copy
# source written and dropped from the cache; with the copy loop running, the paced reader
# (1 MB/s in 64 KiB reads, as stream_guarantee.rs) reads the stream file for READ_SECS with
# the stock mq-deadline and no abissd (`bare`), then with abissd managing the disks and the
# file attached at 1 MB/s (`abiss`), while `abissctl trace --events --json` records every
# request at the disks. Reports as /init does: `@@` lines and blocks, named by stack and run.
secs=${abiss_read_secs:-10}
dir=/run/abiss
socket=$dir/abiss.sock
mkdir -p $dir /mnt/s
export DM_DISABLE_UDEV=1
key=000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
sectors=$(blockdev --getsz /dev/vda)
say load-disks "$(cat /sys/block/vda/dev)" "$(cat /sys/block/vdb/dev)" "$secs"
dm_name() { for d in /sys/block/dm-*; do [ "$(cat "$d/dm/name")" = "$1" ] && echo "${d##*/}"; done; }

# Builds stack $1 over vda (and vdb); sets top (the device ext4 goes on) and managed (what
# abissd is told to manage: the top of the stack, which means the disks beneath).
stack_up() {
    case $1 in
    luks)
        dmsetup create abiss-crypt --uuid CRYPT-PLAIN-abiss-crypt \
            --table "0 $sectors crypt aes-xts-plain64 $key 0 /dev/vda 0" || return 1
        top=/dev/mapper/abiss-crypt; managed=$(dm_name abiss-crypt) ;;
    luks-inline)
        # cryptsetup's --perf-no_read_workqueue --perf-no_write_workqueue: decrypted where a
        # read completes, encrypted in the writer, not in dm-crypt's kcryptd workers.
        dmsetup create abiss-crypt --uuid CRYPT-PLAIN-abiss-crypt \
            --table "0 $sectors crypt aes-xts-plain64 $key 0 /dev/vda 0 2 no_read_workqueue no_write_workqueue" || return 1
        top=/dev/mapper/abiss-crypt; managed=$(dm_name abiss-crypt) ;;
    lvm-on-luks)
        dmsetup create abiss-crypt --uuid CRYPT-PLAIN-abiss-crypt \
            --table "0 $sectors crypt aes-xts-plain64 $key 0 /dev/vda 0" || return 1
        dmsetup create abiss-vg-lv --uuid LVM-abissabissabissabissabissabissabissabissabissabissabissabissab \
            --table "0 $sectors linear /dev/mapper/abiss-crypt 0" || return 1
        top=/dev/mapper/abiss-vg-lv; managed=$(dm_name abiss-vg-lv) ;;
    md-raid1)
        mdadm --create /dev/md0 --run --quiet --level=1 --raid-devices=2 --metadata=1.2 \
            --assume-clean /dev/vda /dev/vdb || return 1
        top=/dev/md0; managed=md0 ;;
    lvm-striped)
        dmsetup create abiss-vg-striped --uuid LVM-abissabissabissabissabissabissabissabissabissabissabissabissst \
            --table "0 $((sectors * 2)) striped 2 128 /dev/vda 0 /dev/vdb 0" || return 1
        top=/dev/mapper/abiss-vg-striped; managed=$(dm_name abiss-vg-striped) ;;
    esac
}

stack_down() {
    killall dd 2>/dev/null
    sleep 1
    sync
    umount /mnt/s 2>/dev/null
    for name in abiss-vg-lv abiss-vg-striped abiss-crypt; do
        [ -e /dev/mapper/$name ] && dmsetup remove --retry $name 2>>/tmp/stack-down.err
    done
    mdadm --stop /dev/md0 >/dev/null 2>&1
    mdadm --zero-superblock /dev/vda /dev/vdb >/dev/null 2>&1
    # No stack finds the one before it on the disks.
    for disk in vda vdb; do dd if=/dev/zero of=/dev/$disk bs=1M count=1 oflag=direct 2>/dev/null; done
    for disk in vda vdb; do echo none >/sys/block/$disk/queue/scheduler; done
}

# The paced reader of the stream file for READ_SECS, under the copy loop, as run $1.
read_under_load() {
    (while :; do dd if=/mnt/s/copy-src of=/mnt/s/copy-dst bs=1M iflag=direct conv=fsync 2>/dev/null; done) &
    copier=$!
    sleep 2
    abiss-test-reader /mnt/s/stream.bin 1000000 65536 577536 "$secs" >/tmp/$1-reader.json 2>/tmp/$1-reader.err
    say $1-reader-exit $?
    kill $copier
    wait $copier 2>/dev/null
    killall dd 2>/dev/null
    block $1-reader /tmp/$1-reader.json
    block $1-reader-stderr /tmp/$1-reader.err
}

for stack in luks luks-inline lvm-on-luks md-raid1 lvm-striped; do
    stack_down
    if ! stack_up $stack >/tmp/$stack-up.err 2>&1; then
        say $stack-failed stack
        block $stack-failed-stderr /tmp/$stack-up.err
        continue
    fi
    /usr/sbin/mke2fs -q -F -t ext4 $top && mount -t ext4 $top /mnt/s \
        || { say $stack-failed mount; continue; }
    dd if=/dev/urandom of=/mnt/s/stream.bin bs=1M count=$((secs + 4)) 2>/dev/null
    dd if=/dev/urandom of=/mnt/s/copy-src bs=1M count=64 2>/dev/null
    # Stock: mq-deadline on the disks, no abissd.
    for disk in vda vdb; do echo mq-deadline >/sys/block/$disk/queue/scheduler; done
    sync
    echo 3 >/proc/sys/vm/drop_caches
    read_under_load $stack-bare
    RUST_LOG=warn abissd --socket $socket --state-dir $dir/state --model-dir $dir/models \
        --device "$managed" --capacity 10MB/s >/tmp/$stack-abissd.log 2>&1 &
    pid=$!
    await_abissd
    say $stack-abissd-pid $pid
    abissctl --socket $socket trace --events --json >/tmp/$stack-events.json 2>/dev/null &
    tracer=$!
    sync
    echo 3 >/proc/sys/vm/drop_caches
    id=$(abissctl --socket $socket attach /mnt/s/stream.bin --rate 1MB/s 2>/tmp/$stack-attach.err)
    say $stack-attach $? "$id"
    block $stack-attach-stderr /tmp/$stack-attach.err
    read_under_load $stack-abiss
    abissctl --socket $socket list --json >/tmp/$stack-list.json
    block $stack-list-json /tmp/$stack-list.json
    kill $tracer
    wait $tracer
    # The requests of the stream's file (tagged with a stream), and how many others there were.
    say $stack-events-all "$(wc -l </tmp/$stack-events.json)"
    grep '"stream":' /tmp/$stack-events.json >/tmp/$stack-tagged.json
    block $stack-events /tmp/$stack-tagged.json
    kill -TERM $pid
    wait $pid
    say $stack-abissd-exit $?
    block $stack-abissd-log /tmp/$stack-abissd.log
done
stack_down
say load-done
