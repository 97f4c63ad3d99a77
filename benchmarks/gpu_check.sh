#!/usr/bin/env bash
# The GPU checks in one go, on a machine with a CUDA device and recsys' packages importable
# (mlflow is not needed: every job here runs with logger=none).
#
#   bash benchmarks/gpu_check.sh [LOG_DIR]
#
# 1. the tests marked gpu (the main job on CUDA, its scoring against the CPU's, a resumed
#    training on the GPU repeating an uninterrupted one, dropout);
# 2. training speed on an ML-1M-like synthetic log (6,000 users of ~150 events, windows of 200),
#    GPU (bf16-mixed) against the machine's CPU cores (float32), side by side
#    (benchmarks/train_benchmark.py; every step timed, by batch shapes new to the run or not);
# 3. the main job's wall time with trainer=gpu and with the CPU only, side by side;
# 4. the unit tests, where trainer.accelerator=auto now means the GPU (test files that import
#    mlflow fail to collect where it is absent; the others run).
# Each step's output goes to LOG_DIR (default: a temporary folder) and a summary to stdout;
# the exit status is 1 when any step failed (they are named on the last line), else 0.
# GPU_CHECK_STEPS picks steps by name (default: all five, in the order above), e.g.
#   GPU_CHECK_STEPS="gpu_tests main_job_gpu unit_tests" bash benchmarks/gpu_check.sh
set -uo pipefail
ALL_STEPS="gpu_tests train_speed main_job_gpu main_job_cpu unit_tests"
STEPS=" ${GPU_CHECK_STEPS:-$ALL_STEPS} "
for s in $STEPS; do
    [[ " $ALL_STEPS " == *" $s "* ]] || { echo "GPU_CHECK_STEPS: unknown step '$s' (steps: $ALL_STEPS)" >&2; exit 2; }
done
cd "$(dirname "$0")/.."
LOG_DIR=${1:-$(mktemp -d)}
mkdir -p "$LOG_DIR"
WORK=$(mktemp -d)
FAILED=""
export PYTHONUNBUFFERED=1

python - <<'EOF' | tee "$LOG_DIR/versions.txt"
import platform, torch, pytorch_lightning, polars, pandas, hydra
print("python", platform.python_version(), "| torch", torch.__version__, "| lightning",
      pytorch_lightning.__version__, "| polars", polars.__version__, "| pandas",
      pandas.__version__, "| hydra", hydra.__version__)
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF

step() {  # step NAME TIMEOUT COMMAND...: run, keep the log, print the last lines and the time
    local name=$1 limit=$2
    shift 2
    [[ $STEPS == *" $name "* ]] || return 0
    local start=$EPOCHREALTIME
    timeout "$limit" "$@" >"$LOG_DIR/$name.log" 2>&1
    local rc=$?
    [[ $rc -eq 0 ]] || FAILED+=" $name"
    awk -v n="$name" -v rc="$rc" -v a="$start" -v b="$EPOCHREALTIME" \
        'BEGIN { printf "\n== %s: rc %s, %.1f s\n", n, rc, b - a }'
    grep -iE "trained|train_seconds|epochs? in" "$LOG_DIR/$name.log" | tail -n 3
    tail -n 24 "$LOG_DIR/$name.log"
}

step gpu_tests 200 python -m pytest -q -p no:cacheprovider -m gpu -rs \
    tests/unit/model/test_layers.py tests/integration/test_pipelines.py
step train_speed 300 python -m benchmarks.train_benchmark --accelerators gpu,cpu --epochs 3 \
    --step-times --json "$LOG_DIR/train_speed.json" data.source.num_users=6000 data.source.num_items=3400 \
    +data.source.sessions_per_user=30 data.max_seq_len=200
step main_job_gpu 120 python -m pipelines.run trainer=gpu logger=none \
    "paths.output_dir=$WORK/gpu"
step main_job_cpu 120 python -m pipelines.run trainer.accelerator=cpu retrieval.accelerator=cpu \
    logger=none "paths.output_dir=$WORK/cpu"
step unit_tests 240 python -m pytest -q -p no:cacheprovider -rf --continue-on-collection-errors \
    tests/unit
rm -rf "$WORK"
if [[ -n $FAILED ]]; then
    echo "failed steps:$FAILED (logs in $LOG_DIR)"
    exit 1
fi
