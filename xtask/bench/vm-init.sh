#!/bin/busybox sh
# /init of `cargo xtask bench --vm KERNEL`: one of Debian's kernels under
# QEMU, where BPF trampolines work. Rounds of every condition (rotated,
# so that drift spreads evenly), each running every workload of
# /work/workloads ("NAME REPS PROGRAM ARGS...") REPS times, pinned to CPU 1
# (the tracer's user space runs on CPU 0). Each run's JSON line goes to
# the second serial port as "run ROUND CONDITION NAME {...}"; xtask makes
# the table. Conditions:
#   base          nothing attached
#   floor         an empty program on sys_exit_acct, which nothing calls
#   empty         empty programs on every syscall exit shmtrace's
#                 tracepoints use (/work/exits)
#   tracepoints   shmtrace node-wide, --hooks tracepoints
#   trampolines   shmtrace node-wide, --hooks trampolines
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t bpf bpf /sys/fs/bpf
mount -t tracefs tracefs /sys/kernel/tracing
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mkdir -p /dev/shm /var/tmp
# The shm workload's /dev/shm; everything else lives on the initramfs
# (ramfs: not tmpfs, as a node's disk is not).
mount -t tmpfs -o size=512m tmpfs /dev/shm
out=/dev/ttyS1
rounds=3
for w in $(cat /proc/cmdline); do
    case $w in
    shmtrace.rounds=*) rounds=${w#shmtrace.rounds=} ;;
    esac
done
echo "=== kernel $(uname -r) ===" > $out

# What shmtrace attaches with each backend on this kernel.
for hooks in tracepoints trampolines; do
    shmtrace --hooks $hooks doctor > /tmp/doctor.txt 2>&1
    echo "exit $?" >> /tmp/doctor.txt
    echo "=== doctor $hooks ===" > $out
    cat /tmp/doctor.txt > $out
done
echo "=== runs x ===" > $out

tracer=
# Waits up to 120 s for LINE in FILE (TCG: loading takes a while).
wait_for() {
    i=0
    while ! grep -q "$2" "$1" 2> /dev/null && [ $i -lt 240 ]; do
        usleep 500000
        i=$((i + 1))
    done
    # A condition that cannot start makes every later number meaningless.
    grep -q "$2" "$1" || {
        echo "error $cond: no '$2' in $1: $(cat "$1")" > $out
        poweroff -f
    }
}
start() {
    rm -f /tmp/cond.log
    case $1 in
    base) tracer= ;;
    floor)
        taskset -c 0 /work/empty sys_exit_acct > /tmp/cond.log 2>&1 &
        tracer=$!
        wait_for /tmp/cond.log attached
        ;;
    empty)
        taskset -c 0 /work/empty $(cat /work/exits) > /tmp/cond.log 2>&1 &
        tracer=$!
        wait_for /tmp/cond.log attached
        ;;
    tracepoints | trampolines)
        taskset -c 0 shmtrace --quiet --hooks $1 > /dev/null 2> /tmp/cond.log &
        tracer=$!
        wait_for /tmp/cond.log "tracing every process"
        ;;
    esac
    # The tracer's first tick passes before anything is timed.
    sleep 1
}
stop() {
    [ -n "$tracer" ] || return
    kill -INT $tracer
    wait $tracer
    tracer=
}

conds="base floor empty tracepoints trampolines"
n=5
r=0
while [ $r -lt $rounds ]; do
    k=0
    while [ $k -lt $n ]; do
        idx=$(((r + k) % n + 1))
        cond=$(echo $conds | cut -d' ' -f$idx)
        start $cond
        while read -r name reps prog args; do
            i=0
            while [ $i -lt $reps ]; do
                line=$(taskset -c 1 /work/$prog $args 2> /tmp/err.txt)
                echo "run $r $cond $name $line" > $out
                [ -n "$line" ] || echo "error $cond $name: $(cat /tmp/err.txt)" > $out
                i=$((i + 1))
            done
        done < /work/workloads
        stop
        k=$((k + 1))
    done
    r=$((r + 1))
done
echo "=== done ===" > $out
poweroff -f
