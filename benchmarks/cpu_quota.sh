#!/usr/bin/env bash
# A job under a container's CPU limit, with torch's threads cut to the quota (what the
# pipelines do, recsys.cpus) and with torch's default of one thread per visible core, side by
# side. Needs root and a writable cgroup filesystem (v1's cpu controller or v2), as a
# container runtime has; Linux only.
#
#   bash benchmarks/cpu_quota.sh CPUS ROUNDS -- COMMAND [ARGS...]
#   e.g. bash benchmarks/cpu_quota.sh 1 3 -- python -m pipelines.train logger=none trainer.max_epochs=2
#
# Each round runs COMMAND twice in a cgroup whose quota is CPUS CPUs (per 100 ms period):
# once as it is ("fitted": the pipeline cuts torch's threads to the quota) and once with
# OMP_NUM_THREADS set to the visible cores ("default": torch's threads as without recsys.cpus,
# which keeps a thread count OMP_NUM_THREADS sets), alternating which goes first. It prints
# each wall time, then the medians and their ratio. COMMAND's output goes to a temporary folder.
set -euo pipefail
if [[ $# -lt 4 || $3 != "--" ]]; then
    echo "usage: bash benchmarks/cpu_quota.sh CPUS ROUNDS -- COMMAND [ARGS...]" >&2
    exit 2
fi
CPUS=$1 ROUNDS=$2
shift 3
cd "$(dirname "$0")/.."
PERIOD=100000
QUOTA=$(python3 -c "print(int(float('$CPUS') * $PERIOD))")
CORES=$(python3 -c "import os; print(len(os.sched_getaffinity(0)))")
NAME="recsys-quota-$$"
if [[ -d /sys/fs/cgroup/cpu && -w /sys/fs/cgroup/cpu ]]; then  # v1
    GROUP=/sys/fs/cgroup/cpu/$NAME
    mkdir "$GROUP"
    echo $PERIOD > "$GROUP/cpu.cfs_period_us"
    echo "$QUOTA" > "$GROUP/cpu.cfs_quota_us"
elif [[ -f /sys/fs/cgroup/cgroup.controllers ]] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then  # v2
    echo +cpu > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    GROUP=/sys/fs/cgroup/$NAME
    mkdir "$GROUP"
    echo "$QUOTA $PERIOD" > "$GROUP/cpu.max"
else
    echo "no writable cgroup CPU controller here (v1 /sys/fs/cgroup/cpu or v2 with cpu)" >&2
    exit 1
fi
LOGS=$(mktemp -d)
trap 'rmdir "$GROUP" 2>/dev/null || true' EXIT
echo "cgroup $GROUP: quota $CPUS CPUs of $CORES visible cores; outputs in $LOGS"
run() {  # run LABEL ROUND: COMMAND in the cgroup, its wall seconds on stdout
    local label=$1 round=$2 start end
    start=$(date +%s.%N)
    if [[ $label == default ]]; then
        bash -c "echo \$\$ > $GROUP/cgroup.procs; exec env OMP_NUM_THREADS=$CORES \"\$@\"" _ "${CMD[@]}" \
            > "$LOGS/$label-$round.log" 2>&1
    else
        bash -c "echo \$\$ > $GROUP/cgroup.procs; exec \"\$@\"" _ "${CMD[@]}" \
            > "$LOGS/$label-$round.log" 2>&1
    fi
    end=$(date +%s.%N)
    python3 -c "print(round($end - $start, 2))"
}
CMD=("$@")
FITTED=() DEFAULT=()
for ((r = 1; r <= ROUNDS; r++)); do
    if ((r % 2)); then order="fitted default"; else order="default fitted"; fi
    for label in $order; do
        seconds=$(run "$label" "$r")
        echo "round $r $label: $seconds s"
        if [[ $label == fitted ]]; then FITTED+=("$seconds"); else DEFAULT+=("$seconds"); fi
    done
done
python3 - "${FITTED[*]}" "${DEFAULT[*]}" <<'EOF'
import statistics, sys
fitted, default = ([float(v) for v in arg.split()] for arg in sys.argv[1:3])
f, d = statistics.median(fitted), statistics.median(default)
print(f"median: fitted {f:.2f} s, default {d:.2f} s, default / fitted {d / f:.2f}x")
EOF
