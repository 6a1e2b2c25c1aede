#!/bin/busybox sh
# /init of the test VMs: one of Debian's kernels (5.10, 6.1, 6.12) with only
# cgroup v2 mounted and Kubernetes' systemd-driver cgroup shape, the way
# most GPU nodes run. Each scenario runs the real shmtrace and writes its
# results to the second serial port between markers; tests/tests/vm.rs
# reads and checks them. `shmtrace.hooks=BACKEND` on the kernel command
# line is passed to every run as --hooks.
/bin/busybox --install -s /bin
export PATH=/bin
# The pods: UIDs as the systemd driver writes them (dashes as underscores).
POD_UID_=1a2b3c4d_5e6f_4a8b_9c0d_00000000cafe
POD2_UID_=1a2b3c4d_5e6f_4a8b_9c0d_00000000beef
CTR_ID=c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00
CTR2_ID=deadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeef
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 -o nsdelegate,memory_recursiveprot cgroup2 /sys/fs/cgroup
mkdir -p /dev/shm /out
out=/dev/ttyS1

section() { # NAME FILE...
    name=$1
    shift
    for f in "$@"; do
        echo "=== $name $(basename "$f") ===" > $out
        cat "$f" > $out 2>/dev/null
        echo > $out
    done
    echo "=== $name end ===" > $out
}

echo "=== kernel $(uname -r) ===" > $out
hooks=auto
only=
for w in $(cat /proc/cmdline); do
    case $w in
    shmtrace.hooks=*) hooks=${w#shmtrace.hooks=} ;;
    shmtrace.only=*) only=${w#shmtrace.only=} ;;
    esac
done
# shmtrace.only=NAME runs one scenario (SHMTRACE_VM_ONLY in vm.rs).
want() { [ -z "$only" ] || [ "$only" = "$1" ]; }
echo "=== hooks $hooks ===" > $out
# Every run below: shmtrace with the backend under test.
st() { shmtrace --hooks "$hooks" "$@"; }

# 0: doctor loads and attaches every hook for real.
if want doctor; then
    st doctor > /out/doctor.txt 2> /out/stderr.txt
    echo "exit $?" >> /out/doctor.txt
    section doctor /out/doctor.txt /out/stderr.txt
fi
grep cgroup /proc/mounts > /out/fs.txt
cat /sys/fs/cgroup/cgroup.controllers >> /out/fs.txt
section layout /out/fs.txt

# Kubernetes' systemd driver: kubepods.slice/kubepods-burstable.slice/
# kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope, the
# pod's limit on its slice, none on the container's scope, oom.group set.
cd /sys/fs/cgroup
ctl() { echo "+memory +pids" > "$1/cgroup.subtree_control"; }
ctl .
mkdir -p kubepods.slice/kubepods-burstable.slice
ctl kubepods.slice
ctl kubepods.slice/kubepods-burstable.slice
pod=kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod$POD_UID_.slice
pod2=kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod$POD2_UID_.slice
mkdir $pod $pod2
ctl $pod
ctl $pod2
echo 48M > $pod/memory.max
scope=$pod/cri-containerd-$CTR_ID.scope
scope2=$pod2/cri-containerd-$CTR2_ID.scope
mkdir $scope $scope2
echo 1 > $scope/memory.oom.group
echo 1 > $scope2/memory.oom.group
cd /

# 1, 2: the first failing worker, SIGBUS, write and fallocate ENOSPC, in an
# 8 MiB /dev/shm: workers released in an order the workload controls.
if want order; then
    mount -t tmpfs -o size=8m tmpfs /dev/shm
    for mode in sigbus write fallocate; do
        rm -f /out/report.json
        st run --quiet --report /out/report.json -- \
            /work/order $mode /dev/shm 4 2 4194304 > /out/truth.json 2> /out/stderr.txt
        section order-$mode /out/report.json /out/truth.json /out/stderr.txt
        rm -f /dev/shm/*
    done
    umount /dev/shm
fi

# ENOSPC on open at the tmpfs inode limit, and mmap ENOMEM under RLIMIT_AS.
if want inodes; then
    mount -t tmpfs -o size=8m,nr_inodes=8 tmpfs /dev/shm
    rm -f /out/report.json
    st run --quiet --report /out/report.json -- /work/inodes > /out/truth.json 2> /out/stderr.txt
    section inodes /out/report.json /out/truth.json /out/stderr.txt
    umount /dev/shm
fi
if want mmap-error; then
    mount -t tmpfs -o size=8m tmpfs /dev/shm
    rm -f /out/report.json
    st run --quiet --report /out/report.json -- /work/mmap_error > /out/truth.json 2> /out/stderr.txt
    section mmap-error /out/report.json /out/truth.json /out/stderr.txt
    umount /dev/shm
fi

# 3: an OOM kill at the pod slice's 48 MiB limit: dd in the container's
# scope fills a named file in its own 64 MiB /dev/shm.
if want oom-pod; then
    rm -f /out/report.json
    st run --quiet --report /out/report.json -- unshare -m --propagation private \
        sh -c "mount -t tmpfs -o size=64m tmpfs /dev/shm && echo \$\$ > /sys/fs/cgroup/$scope/cgroup.procs && exec dd if=/dev/zero of=/dev/shm/big bs=1M count=60" \
        > /dev/null 2> /out/stderr.txt
    section oom-pod /out/report.json /out/stderr.txt
fi

# 4: node-wide, a pod's container in its own PID and mount namespaces runs
# its private 4 MiB /dev/shm out of space: one incident, named by the pod.
if want node-pod; then
    rm -f /out/report.json /out/stderr.txt
    st --quiet --report /out/report.json > /out/stdout.txt 2> /out/stderr.txt &
    tracer=$!
    i=0
    while ! grep -q "tracing every process" /out/stderr.txt 2> /dev/null && [ $i -lt 120 ]; do
        sleep 1
        i=$((i + 1))
    done
    sh -c "echo \$\$ > /sys/fs/cgroup/$scope2/cgroup.procs && exec unshare -p -f -m --propagation private sh -c 'mount -t tmpfs -o size=4m tmpfs /dev/shm && dd if=/dev/zero of=/dev/shm/batch bs=1M count=8; echo \$\$ > /dev/null'" 2> /dev/null
    sleep 3
    kill -INT $tracer
    i=0
    while kill -0 $tracer 2> /dev/null && [ $i -lt 60 ]; do
        sleep 1
        i=$((i + 1))
    done
    kill -0 $tracer 2> /dev/null && echo "still running 60 s after SIGINT" >> /out/stderr.txt && kill -9 $tracer
    wait $tracer
    section node-pod /out/report.json /out/stderr.txt
fi

echo "=== done ===" > $out
poweroff -f
