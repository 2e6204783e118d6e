#!/usr/bin/env bash
# The planner's memory and time model against one GPU (issue 31): `step` on one rank for each
# recomputation mode and micro-batch count, its measured peak (the CUDA allocator's) beside the
# model's figure, then `plan --workers 1 --validate` on the same shape. One launch, every run
# under $OUT, a table at the end (benchmarks/gpu_memory_table.py).
#
#   OUT=/tmp/gm bash benchmarks/gpu_memory.sh
#   SHAPE=layers=2,hidden=64,ffn=256,heads=4,seq=32,batch=8 REHEARSE=1 OUT=/tmp/gm \
#       bash benchmarks/gpu_memory.sh     # the script and its table on a CPU
set -u
OUT=${OUT:-results/gpu-memory}
BUDGET_S=${BUDGET_S:-420}
PY=${PYTHON:-python3}
DTYPE=${DTYPE:-bfloat16}
# 1b's layer (hidden 2048, 16 heads) at 12 layers and 8 samples: fits any 40 GB GPU unrecomputed
SHAPE=${SHAPE:-layers=12,hidden=2048,ffn=8192,heads=16,seq=2048,batch=8}
export PYTHONUNBUFFERED=1
if ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" \
        && [[ ${REHEARSE:-0} != 1 ]]; then
    echo "gpu_memory: no CUDA device visible (REHEARSE=1 runs it anyway)" >&2
    exit 2
fi
mkdir -p "$OUT/runs"
LOG="$OUT/log.txt"
: > "$LOG"
T0=$(date +%s)

run() {  # run LIMIT CMD...: CMD under what is left of the budget, its output in the log
    local limit=$1; shift
    local left=$(( BUDGET_S - ($(date +%s) - T0) - 10 ))
    if (( left < 15 )); then echo "=== skipped (budget spent): $*" | tee -a "$LOG"; return; fi
    (( limit > left )) && limit=$left
    echo "=== at most ${limit}s: $*" | tee -a "$LOG"
    local s=$(date +%s)
    timeout -k 10 "$limit" "$@" >> "$LOG" 2>&1
    echo "=== exit $? after $(( $(date +%s) - s ))s" | tee -a "$LOG"
}

for rc in none selective full; do
    for m in 1 4; do
        run 90 "$PY" -m distbench step --workers 1 --model "$SHAPE" --dtype "$DTYPE" \
            --recompute "$rc" --micro-batches "$m" --no-check --iters 5 --warmup 1 \
            --out "$OUT/runs"
    done
done
run 240 "$PY" -m distbench plan --workers 1 --model "$SHAPE" --dtype "$DTYPE" \
    --recompute none,selective,full --validate 4 --out "$OUT/runs"
"$PY" benchmarks/gpu_memory_table.py "$OUT/runs" | tee "$OUT/table.md"
