#!/usr/bin/env bash
# GPU training epochs with batches as wide as their longest row (data.loader.width_multiple=1)
# against widths rounded up to a multiple (8, 32), each in a fresh process, alternating;
# every training step timed (benchmarks/train_benchmark.py --step-times).
#   bash benchmarks/gpu_width_ab.sh [LOG_DIR] [EPOCHS] [MULTIPLES...]
# ACCELERATOR=cpu and DATA="<overrides>" change the accelerator and the data (default: the
# ML-1M-like synthetic log of benchmarks/gpu_check.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG_DIR=${1:-$(mktemp -d)}
EPOCHS=${2:-5}
shift 2 2>/dev/null || shift $#
MULTIPLES=${*:-1 8 1 8 32}
ACCELERATOR=${ACCELERATOR:-gpu}
DATA=${DATA:-data.source.num_users=6000 data.source.num_items=3400 +data.source.sessions_per_user=30 data.max_seq_len=200}
mkdir -p "$LOG_DIR"
i=0
for m in $MULTIPLES; do
    i=$((i + 1))
    start=$EPOCHREALTIME
    # shellcheck disable=SC2086  # DATA is a list of overrides
    timeout 150 python -m benchmarks.train_benchmark --accelerators "$ACCELERATOR" \
        --epochs "$EPOCHS" --step-times --json "$LOG_DIR/run$i-m$m.json" $DATA \
        "data.loader.width_multiple=$m" >"$LOG_DIR/run$i-m$m.log" 2>&1
    rc=$?
    awk -v m="$m" -v i="$i" -v rc="$rc" -v a="$start" -v b="$EPOCHREALTIME" \
        'BEGIN { printf "\n== run %s, width_multiple %s: rc %s, %.1f s\n", i, m, rc, b - a }'
    grep "^|" "$LOG_DIR/run$i-m$m.log" | grep -v "^|---"
done
