#!/usr/bin/env bash
# One prepared command for a lent GPU machine (nothing in Tandem has been measured on a GPU yet;
# this is the first check to run on one). From the repository root:
#
#     bash scripts/gpu_check.sh            # or: OUT=/some/dir bash scripts/gpu_check.sh
#
# 1. finds a Python whose torch sees CUDA ($PYTHON, .venv, python3, python), says which
# 2. makes sure triton is importable: already installed, a wheel in $TRITON_WHEEL or
#    ./shared/wheels/, or `pip install triton` (skipped cleanly offline: the triton parity
#    tests then skip and the bench shows the other backends)
# 3. runs the verify-kernel parity tests on CUDA and the placement tests      (~1 min)
# 4. benchmarks per-pass costs with the default pair's real shapes, random weights, bf16 and
#    fp32, and prints the projected speedup from the CPU-measured acceptance    (~2-4 min)
# 5. 4-bit weights (torch's int4 kernels): their parity tests on the device, then
#    engine.bench.int4_device_bench: parity vs the CPU reference and row-count invariance at
#    real layer shapes, 16-bit vs 4-bit passes at the default pair's and an 8B shape, the
#    bytes held vs the memory fit, greedy speculation == plain, host syncs per token  (~2-3 min)
#    On a Mac (no CUDA, MPS present) stage 5 runs on MPS.
#
# GPU_CHECK_STAGES=verify,bench,int4 (the default) picks stages: e.g. GPU_CHECK_STAGES=int4
# runs only the 4-bit checks (after stages 1-2, which only find Python and triton).
#
# Works without network when the machine's Python already has torch (CUDA build), transformers
# and pytest; pure-Python packages can also come from a carried folder: TANDEM_EXTRA_SITE=dir
# (appended to sys.path, so the machine's own torch keeps precedence). Every stage has its own
# time limit so the whole run stays under 8 minutes; results go to $OUT (default ./gpu_check_out).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
: > "$LOG"
say() { echo "== $*" | tee -a "$LOG"; }
STATUS=0
NO_CUDA=0  # set when no Python here sees a GPU: the later stages then pick CPU-sized work
STAGES=",${GPU_CHECK_STAGES:-verify,bench,int4},"
stage() { case "$STAGES" in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# -- 1. a Python with CUDA torch ---------------------------------------------------------------
if [ -n "${TANDEM_EXTRA_SITE:-}" ]; then
    # sitecustomize appends (not prepends, as PYTHONPATH would) the carried packages.
    SITE_SHIM="$OUT/site_shim"
    mkdir -p "$SITE_SHIM"
    printf 'import sys\nsys.path.append(%s)\n' "'$TANDEM_EXTRA_SITE'" > "$SITE_SHIM/sitecustomize.py"
    export PYTHONPATH="$SITE_SHIM${PYTHONPATH:+:$PYTHONPATH}"
fi
PY=""
for candidate in ${PYTHON:-} .venv/bin/python python3 python; do
    command -v "$candidate" >/dev/null 2>&1 || [ -x "$candidate" ] || continue
    if "$candidate" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
        PY="$candidate"; break
    fi
done
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee -a "$LOG"
if [ -z "$PY" ]; then
    say "NO CUDA: no Python here has a torch that sees a GPU (tried: ${PYTHON:-} .venv/bin/python python3 python)."
    for candidate in ${PYTHON:-} .venv/bin/python python3 python; do
        command -v "$candidate" >/dev/null 2>&1 || [ -x "$candidate" ] || continue
        "$candidate" -c 'import torch; print("  ", torch.__version__, "cuda build:", torch.version.cuda)' 2>&1 | sed "s|^|  $candidate: |" | tee -a "$LOG"
    done
    say "Install a CUDA build of torch (pip install torch) and rerun. Running the CPU checks only."
    PY="${PYTHON:-python3}"
    [ -x .venv/bin/python ] && PY=.venv/bin/python
    STATUS=2
    NO_CUDA=1
fi
say "python: $PY ($("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1))"
missing=$("$PY" -c '
import importlib.util
need = ["transformers", "safetensors", "pytest", "psutil", "platformdirs", "huggingface_hub", "tokenizers"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))')
if [ -n "$missing" ]; then
    say "missing: $missing; trying pip (needs a package index)"
    timeout 120 "$PY" -m pip install -q $missing "transformers>=5.0" 2>&1 | tail -3 | tee -a "$LOG" || true
fi

# -- 2. triton -----------------------------------------------------------------------------------
if ! "$PY" -c 'import triton' >/dev/null 2>&1; then
    wheel="${TRITON_WHEEL:-$(ls shared/wheels/triton-*.whl 2>/dev/null | head -1)}"
    if [ -n "$wheel" ]; then
        say "installing triton from $wheel"
        timeout 120 "$PY" -m pip install -q "$wheel" 2>&1 | tail -3 | tee -a "$LOG"
    else
        say "triton not installed; trying pip install triton (skipped if offline)"
        timeout 180 "$PY" -m pip install -q triton 2>&1 | tail -3 | tee -a "$LOG"
    fi
fi
if "$PY" -c 'import triton; print(triton.__version__)' >/dev/null 2>&1; then
    say "triton $("$PY" -c 'import triton; print(triton.__version__)')"
else
    say "TRITON UNAVAILABLE: its parity tests will skip and the bench omits it"
    [ "$STATUS" -eq 0 ] && STATUS=3
fi
say "verify backends: $("$PY" -c 'import kernels.verify as v; print(v.available_backends(), "active:", v.active_backend())' 2>&1 | tail -1)"

# -- 3. parity tests on the device ---------------------------------------------------------------
if stage verify; then
say "parity tests (every verify backend vs the reference, CUDA tensors) and placement tests"
timeout 240 "$PY" -m pytest -q -p no:cacheprovider tests/kernels/test_verify_backends.py tests/kernels/test_verify.py \
    tests/engine/models/loading/test_device_placement.py --junitxml="$OUT/parity.xml" 2>&1 | tail -25 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { say "PARITY TESTS FAILED (rc $rc)"; STATUS=1; }
fi

# -- 4. per-pass costs and projected speedup -----------------------------------------------------
if stage bench; then
BENCH_ARGS=()
if [ "$NO_CUDA" -eq 1 ]; then
    BENCH_ARGS=(--tiny)  # 1.5B random weights on a CPU would take far too long: tiny shapes only
    say "benchmark: TINY shapes on the CPU (no CUDA: these numbers say nothing about a GPU)"
else
    say "benchmark: default pair's shapes, random weights"
fi
timeout 300 "$PY" -m engine.bench.gpu_bench "${BENCH_ARGS[@]}" --json "$OUT/gpu_bench.json" 2>>"$LOG" | tee -a "$LOG"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { say "BENCHMARK FAILED OR TIMED OUT (rc $rc; see $LOG)"; STATUS=1; }
fi

# -- 5. 4-bit weights: torch's int4 kernels on the device ----------------------------------------
if stage int4; then
INT4_ARGS=()
INT4_DEVICE=cpu
if [ "$NO_CUDA" -eq 1 ]; then
    if "$PY" -c 'import sys, torch; sys.exit(0 if torch.backends.mps.is_available() else 1)' >/dev/null 2>&1; then
        INT4_DEVICE=mps; INT4_ARGS=(--device mps)
        say "4-bit: on MPS (no CUDA here)"
    else
        INT4_ARGS=(--tiny --device cpu)
        say "4-bit: no GPU, so TINY shapes on the CPU (these numbers say nothing about a GPU)"
    fi
else
    INT4_DEVICE=cuda
fi
say "4-bit parity tests (kernels on $INT4_DEVICE vs the reference; the converter and memory fit on the CPU)"
timeout 240 "$PY" -m pytest -q -p no:cacheprovider tests/kernels/test_int4pack.py tests/engine/models/runners/test_gpu_weights.py \
    tests/engine/models/planning/test_int4_device_fit.py --junitxml="$OUT/int4_parity.xml" 2>&1 | tail -15 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { say "4-BIT PARITY TESTS FAILED (rc $rc)"; STATUS=1; }
say "4-bit bench: parity at real shapes, 16-bit vs 4-bit passes (default pair, 8B), lossless, host syncs"
timeout 300 "$PY" -m engine.bench.int4_device_bench "${INT4_ARGS[@]}" --json "$OUT/int4_device_bench.json" 2>>"$LOG" | tee -a "$LOG"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { say "4-BIT BENCHMARK FAILED OR TIMED OUT (rc $rc; see $LOG)"; STATUS=1; }
fi

say "done, status $STATUS (0 ok, 1 a check failed, 2 no CUDA, 3 no triton); log and JSON in $OUT"
exit $STATUS
