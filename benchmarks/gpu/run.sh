#!/usr/bin/env bash
# The GPU validation of issue 30 in one go (at most 8 minutes on one H100): benchmarks/gpu/README.md.
#   benchmarks/gpu/run.sh OUT            on the GPU machine (installs .whl/ first when packages are missing)
#   benchmarks/gpu/run.sh OUT --dry-run  the same steps on the CPU with tiny sizes (tests/e2e/test_gpu_validation.py)
# Each step runs under `timeout` and writes OUT/STEP.json; all output goes to OUT/run.log (7 files in all).
# A step fails when one of its checks fails (validate.py exits 1), when it crashes or when it runs out of
# time; a failed step is recorded and the next one runs; the exit status is the number of failed steps.
# STEPS="a b" runs only those steps; INJECT="a b" plants in them the fault they must catch (--inject).
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${1:?usage: benchmarks/gpu/run.sh OUT [--dry-run]}
DRY=${2:-}
cd "$(dirname "$0")/../.."
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/{exactness,bench,pipeline,montecarlo,distributed,defaults}.json "$OUT"/run.log
STEPS=${STEPS:-exactness bench pipeline montecarlo distributed defaults}
INJECT=${INJECT:-}
WORK=$(mktemp -d /tmp/dpledger-gpu.XXXXXX)
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import pydantic, dp_accounting, opacus" 2>/dev/null; then
    SITE="$WORK/site"
    ls .whl/*.whl >/dev/null 2>&1 || { echo "missing packages and no .whl/ (run make gpu-wheels)" | tee -a "$OUT/run.log"; exit 1; }
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl 2>&1 | tee -a "$OUT/run.log"
    export PYTHONPATH="$SITE:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD/lib:$PWD:${PYTHONPATH:-}"
failed=0
SCALE=1
[ -z "$DRY" ] || SCALE=4  # the dry run's limits: a shared CI CPU, not an H100
wanted() { [[ " $STEPS " == *" $1 "* ]]; }
step() {  # step SECONDS NAME ARGS...: one step under timeout, its output appended to run.log
    local limit=$(($1 * SCALE)); shift
    wanted "$1" || return 0
    local inject=""
    [[ " $INJECT " != *" $1 "* ]] || inject=--inject
    echo "=== $* $inject (limit ${limit}s) $(date -u +%T)" | tee -a "$OUT/run.log"
    timeout -k 10 "$limit" "$PYTHON" benchmarks/gpu/validate.py "$@" --out "$OUT" --work "$WORK" $DRY \
        $inject >>"$OUT/run.log" 2>&1
    local status=$?
    echo "=== status $status $(date -u +%T)" | tee -a "$OUT/run.log"
    [ "$status" -eq 0 ] || failed=$((failed + 1))
}
[ -n "$DRY" ] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>"$OUT/run.log" 2>&1
step 100 exactness
for precision in fp32 bf16; do
    for method in nonprivate bk opacus; do  # a fresh process per method: its own peak memory
        step 75 bench --method "$method" --precision "$precision"
    done
done
step 180 pipeline
step 45 montecarlo
step 90 distributed
step 150 defaults
rm -rf "$WORK"
echo "=== $failed failed step(s); results in $OUT" | tee -a "$OUT/run.log"
exit "$failed"
