#!/usr/bin/env bash
# First contact with a GPU (issue 34): what one GPU can show of docs/gpu-checklist.md, in one
# launch of about six minutes, every figure under $OUT and a table at the end (item, figure,
# what the checklist expects, pass or fail).
#
#   OUT=/tmp/fc bash benchmarks/gpu_first_contact.sh            # every item
#   ONLY="4 6" OUT=/tmp/fc bash benchmarks/gpu_first_contact.sh # rerun items 4 and 6
#
# Items 10 and 11 came after the first H100: `watch` on the GPU, and gloo runs on a host that
# has a GPU (their workers were forked from a launcher that had initialized CUDA, and dp's and
# step's failed there; they are exec'd on a GPU host now). Item 9 runs the whole suite there,
# the multi-process tests included.
#
# Each item runs under its own timeout, capped by what is left of BUDGET_S, so a slow item costs
# its own row and never the table. One GPU means world size 1: NCCL refuses two ranks on one
# GPU, so pp (which needs two) is expected to be refused, and busbw at one rank is 0 by
# definition (nothing crosses a link); the figures that mean something here are time, the
# launch-bound flag, memory and compute.
set -u
OUT=${OUT:-results/gpu-first-contact}
ONLY=${ONLY:-"1 2 3 4 5 6 7 8 9 10 11"}
BUDGET_S=${BUDGET_S:-480}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# distbench from this checkout wherever a process starts (the tests start some elsewhere, and
# benchmarks/ is on a script's path, not the repository): the GPU machine has it uninstalled
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# 1b's shape at 8 samples a step: the preset's 512 at one micro-batch (pp = 1) does not fit one
# GPU by the planner's memory model (2.84 TiB, issue 31), so plan and step would measure nothing
SHAPE_1B="layers=24,hidden=2048,ffn=8192,heads=16,seq=2048,batch=8"
# A rehearsal on a machine without a GPU (REHEARSE=1) checks the script and its table; item 4
# never runs there: without a device to refuse them, its 1-64 GiB buffers would be host memory.
if ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    if [[ ${REHEARSE:-0} != 1 ]]; then
        echo "gpu_first_contact: no CUDA device visible (REHEARSE=1 runs it anyway)" >&2
        exit 2
    fi
    ONLY=${ONLY// 4/}
fi

mkdir -p "$OUT"
W=$(mktemp -d)
LOG="$OUT/log.txt"
: > "$LOG"
: > "$W/items.tsv"
T0=$(date +%s)

wanted() { case " $ONLY " in *" $1 "*) return 0 ;; esac; return 1; }

# step NAME ITEM TIMEOUT CMD...: run CMD, its output in the log, rc and seconds in items.tsv
step() {
    local name=$1 item=$2 limit=$3; shift 3
    local left=$(( BUDGET_S - ($(date +%s) - T0) - 20 ))
    if (( left < 15 )); then
        printf '%s\t%s\t%s\t%s\n' "$item" "$name" "budget" 0 >> "$W/items.tsv"
        echo "=== $name: skipped, the budget is spent" | tee -a "$LOG"
        return
    fi
    (( limit > left )) && limit=$left
    echo "=== $name (item $item, at most ${limit}s): $*" | tee -a "$LOG"
    local s rc
    s=$(date +%s)
    timeout -k 10 "$limit" "$@" >> "$LOG" 2>&1
    rc=$?
    printf '%s\t%s\t%s\t%s\n' "$item" "$name" "$rc" "$(( $(date +%s) - s ))" >> "$W/items.tsv"
    echo "=== $name: exit $rc after $(( $(date +%s) - s ))s" | tee -a "$LOG"
}


nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv,noheader -lms 500 \
    > "$W/gpu_memory.csv" 2>/dev/null &
SMI=$!

if wanted 1; then
    step versions 1 30 "$PY" -c "import torch, sys; print('torch', torch.__version__, 'cuda', \
torch.version.cuda, 'nccl', '.'.join(map(str, torch.cuda.nccl.version())), 'gpus', \
torch.cuda.device_count(), torch.cuda.get_device_name(0), 'python', sys.version.split()[0])"
    step nvidia-smi 1 20 nvidia-smi
    step topo 1 60 "$PY" -m distbench topo --out "$W/runs/topo"
fi
if wanted 10; then
    mkdir -p "$W/prom"
    step watch 10 60 "$PY" -m distbench watch --workers 1 --op all_reduce,all_gather \
        --sizes 1M,64M --count 8 --interval 0.5 --warm 4 --textfile "$W/prom/node.prom" \
        --out "$W/runs/watch"
    base=$(dirname "$(ls "$W"/runs/watch/*/run.json 2>/dev/null | tail -1)")
    step watch-once 10 60 "$PY" -m distbench watch --workers 1 --op all_reduce,all_gather \
        --sizes 1M,64M --once --baseline "$base" --out "$W/runs/watch-once"
fi
if wanted 11; then
    step gloo-collective 11 60 "$PY" -m distbench collective --workers 4 --backend gloo \
        --op all_reduce,all_gather --sizes 4K,1M --out "$W/runs/gloo-collective"
    step gloo-dp 11 90 "$PY" -m distbench dp --workers 2 --backend gloo --out "$W/runs/gloo-dp"
    step gloo-step 11 90 "$PY" -m distbench step --workers 2 --backend gloo \
        --out "$W/runs/gloo-step"
    step gloo-watch 11 60 "$PY" -m distbench watch --workers 2 --backend gloo --count 4 \
        --interval 0.5 --warm 2 --out "$W/runs/gloo-watch"
fi
if wanted 2; then
    step gpu-tests 2 120 "$PY" -m pytest -q -p no:cacheprovider tests/unit/platform/test_gpu.py \
        --junitxml "$W/gpu-tests.xml"
fi
if wanted 3; then
    step collective 3 120 "$PY" -m distbench collective --workers 1 --op all_reduce --sizes 8:1G:x2 \
        --min-time 0.05 --out "$W/runs/collective"
    step collective-graph 3 120 "$PY" -m distbench collective --workers 1 --op all_reduce --sizes 8:1G:x2 \
        --min-time 0.05 --cuda-graph --out "$W/runs/collective-graph"
fi
if wanted 4; then
    step collective-large 4 150 "$PY" -m distbench collective --workers 1 --op all_reduce,all_to_all --sizes 1G:128G:x2 \
        --iters 5 --reps 2 --warmup 1 --out "$W/runs/collective-large"
fi
if wanted 5; then
    step tp 5 120 "$PY" -m distbench tp --workers 1 --dtype bfloat16 --out "$W/runs/tp"
    step pp 5 60 "$PY" -m distbench pp --workers 1 --dtype bfloat16 --out "$W/runs/pp"
    step dp 5 120 "$PY" -m distbench dp --workers 1 --dtype bfloat16 --out "$W/runs/dp"
    step step 5 90 "$PY" -m distbench step --workers 1 --dtype bfloat16 --out "$W/runs/step"
    step step-1b 5 150 "$PY" -m distbench step --workers 1 --model "$SHAPE_1B" --dtype bfloat16 \
        --out "$W/runs/step-1b"
fi
if wanted 6; then
    step plan 6 200 "$PY" -m distbench plan --workers 1 --model "$SHAPE_1B" --dtype bfloat16 --validate 1 \
        --out "$W/runs/plan"
fi
if wanted 8; then
    step accept 8 150 "$PY" -m distbench accept --workers 1 --out "$W/runs/accept"
fi
if wanted 7; then
    step overhead 7 120 "$PY" benchmarks/overhead.py --workers 1 --rounds 10 \
        --sizes 64K,1M,16M,256M
fi
if wanted 9; then
    # the suite on a GPU machine (checklist item 1): tests that pass only where no GPU is. The
    # multi-process tests take what is left of the budget, and an interrupt, not a kill, ends
    # them at its limit: pytest still writes its report of what ran
    step cpu-suite 9 120 "$PY" -m pytest -q -p no:cacheprovider -m "not multiproc" -n 8 \
        -rfE --junitxml "$W/cpu-suite.xml" tests
    left=$(( BUDGET_S - ($(date +%s) - T0) - 45 ))
    (( left > 30 )) && step multiproc-suite 9 $(( left + 40 )) timeout -s INT -k 30 "$left" \
        "$PY" -m pytest -q -p no:cacheprovider -m multiproc -n 8 -rfE \
        --junitxml "$W/multiproc-suite.xml" tests
fi
kill "$SMI" 2>/dev/null
wait "$SMI" 2>/dev/null
"$PY" benchmarks/gpu_first_contact_table.py "$W" "$LOG" > "$OUT/table.md" 2>> "$LOG"
cat "$OUT/table.md"
tar -czf "$OUT/runs.tar.gz" -C "$W" . 2>> "$LOG"
echo "total $(( $(date +%s) - T0 ))s" | tee -a "$LOG"
