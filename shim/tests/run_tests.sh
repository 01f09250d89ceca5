#!/bin/sh
# Runs the shim's C tests: each mode in a fresh process under LD_PRELOAD, in a private ring directory.
# Fails loudly (non-zero exit, the failing mode named) on the first error.
set -u
B=$(cd "$1" && pwd)
SHIM="$B/libfailslow_shim.so"
D=$(mktemp -d "${TMPDIR:-/tmp}/failslow-shimtest-$$-XXXXXX")
trap 'umount "$D/small" 2>/dev/null; rm -rf "$D"' EXIT
fail() { echo "shim tests: FAILED: $*" >&2; exit 1; }
run() {
    mode=$1; shift
    env "$@" FAILSLOW_SHM_DIR="$D" LD_PRELOAD="$SHIM" "$B/test_shim" "$mode" || fail "$mode"
}
[ -z "$(env LD_PRELOAD= "$B/test_shim" basic 2>&1 | grep 'not preloaded')" ] && fail "bare run did not notice the missing shim"
run basic RANK=5 WORLD_SIZE=8 FAILSLOW_TP=2 FAILSLOW_PP=4 FAILSLOW_DP=1 FAILSLOW_JOB=shimtest FAKE_NCCL_FAIL_PEER=2
[ -z "$(ls -A "$D")" ] || fail "ring left behind after a clean exit: $(ls -A "$D")"
run basic RANK=5 WORLD_SIZE=8 FAILSLOW_TP=2 FAILSLOW_PP=4 FAILSLOW_DP=1 FAILSLOW_JOB=shimtest FAKE_NCCL_FAIL_PEER=2 \
    FAILSLOW_CLOCK=monotonic
# the record clock: whatever auto picks here, then each source forced (tsc only where the CPU has a counter)
run clock
run clock FAILSLOW_CLOCK=monotonic EXPECT_CLOCK=monotonic
case "$(uname -m)" in x86_64|aarch64)
    run clock FAILSLOW_CLOCK=tsc EXPECT_CLOCK=tsc
    # a rate 0.2 % off (2 us per 1 ms piece, under the fault threshold) must not add up piece after piece
    run clock FAILSLOW_CLOCK=tsc EXPECT_CLOCK=tsc FAILSLOW_CLOCK_TEST_SKEW_PPM=2000
    run clock FAILSLOW_CLOCK=tsc EXPECT_CLOCK=tsc FAILSLOW_CLOCK_TEST_SKEW_PPM=-2000
    run clockfault FAILSLOW_CLOCK=tsc FAILSLOW_CLOCK_TEST_SKEW_PPM=50000 ;;
esac
run threads FAILSLOW_RING_CAPACITY=4096
run threads FAILSLOW_RING_CAPACITY=4096 FAILSLOW_SINGLE_WRITER=0
run handover
run handover FAILSLOW_SINGLE_WRITER=0 EXPECT_SINGLE_WRITER=0
run overflow FAILSLOW_RING_CAPACITY=64
run fork
run killed
run suspend
run profile FAILSLOW_CUDART_LIB="$B/libfakecudart.so" FAKE_CUDA_LAG_NS=400000000 FAKE_NCCL_DELAY_NS=2000000
env FAILSLOW_SHM_DIR=/nonexistent/failslow LD_PRELOAD="$SHIM" "$B/test_shim" nodir || fail nodir
# a 1 MiB tmpfs cannot hold an 8 MiB ring: recording must turn off, never SIGBUS the job. Mounting the small
# tmpfs needs CAP_SYS_ADMIN (root outside a container); where that is missing the mode says so and is not run.
M="$D/small"; mkdir -p "$M"
if mount -t tmpfs -o size=1m "failslow-shimtest-$$" "$M" 2>/dev/null; then
    env FAILSLOW_SHM_DIR="$M" LD_PRELOAD="$SHIM" "$B/test_shim" full; rc=$?
    umount "$M"
    [ $rc = 0 ] || fail "full (exit $rc)"
else
    echo "full: NOT RUN (cannot mount a 1 MiB tmpfs here: needs CAP_SYS_ADMIN)"
fi
env FAILSLOW_SHM_DIR="$D" FAILSLOW_KEEP_RINGS=1 LD_PRELOAD="$SHIM" "$B/test_dlopen" "$B/libapp.so" || fail dlopen
[ "$(ls "$D" | grep -c '^failslow-.*\.ring$')" = 1 ] || fail "FAILSLOW_KEEP_RINGS=1 should keep the ring"
echo "shim tests: all passed"
