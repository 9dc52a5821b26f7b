#!/usr/bin/env bash
# One-shot device check for a machine with a CUDA GPU and the project installed (no network needed).
#
#   bash scripts/device_check.sh               # on the GPU: under ten minutes
#   bash scripts/device_check.sh --cpu-smoke   # tiny sizes on the CPU (kernels in Triton's interpreter): plumbing only
#
# Run from the repository root. It prints, in order:
#   1. the kernel tests on the device (Triton kernels == torch reference exactly; chi-square losslessness) and the
#      device/dtype tests;
#   2. kernel against torch reference throughput, batch 1, 8, 64 x k = 4, 8 (verdicts compared as well);
#   3. `specdec bench` at batch 1 on the device, a small prompt count;
#   4. batched tokens/s of plain and speculative decoding at batch 1, 8, 32.
# Every step runs under a time limit; the script exits non-zero if any step fails. PYTHON overrides the interpreter.
set -uo pipefail

MODE=gpu
case "${1:-}" in
  "") ;;
  --cpu-smoke) MODE=cpu ;;
  *) echo "usage: $0 [--cpu-smoke]" >&2; exit 2 ;;
esac

PY="${PYTHON:-python}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
if [[ "$MODE" == cpu ]]; then
  export TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES=""
  SPECDEC=("$PY" -m specdec_lab.cli)
  TESTS=(tests/test_kernels.py -k "test_verify_batch_dispatches or (greedy_kernel_equals and 37-counts0)")
  KERNEL_ARGS=(--batches 1,2 --ks 2 --vocab 64 --device cpu --repeats 1)
  BENCH_ARGS=(--prompts 1 --max-new-tokens 4 --repeats 1 --warmup 0 --sets heldout --methods plain,draft)
  BATCH_ARGS=(--batches 1,2 --max-new-tokens 4 --repeats 1 --warmup 0)
  LIMITS=(600 600 600 600)  # a plumbing check on a CPU that may be shared: generous limits
else
  SPECDEC=("$PY" -m specdec_lab.cli)
  TESTS=(tests/test_kernels.py tests/test_device.py)
  KERNEL_ARGS=(--batches 1,8,64 --ks 4,8 --vocab 4096 --device cuda --repeats 50)
  BENCH_ARGS=(--prompts 3 --max-new-tokens 48 --repeats 2 --warmup 1 --sets heldout
              --methods hf-generate,plain,hf-assisted,draft,eagle)
  BATCH_ARGS=(--batches 1,8,32 --max-new-tokens 64 --repeats 3 --warmup 1)
  LIMITS=(150 90 200 150)  # seconds per step: 590 in all, so the whole check ends within ten minutes
fi

FAILED=()
step() {  # step NAME SECONDS COMMAND...
  local name="$1" limit="$2"; shift 2
  echo
  echo "=== ${name}"
  local started=$SECONDS
  if timeout "$limit" "$@"; then
    echo "--- ok: ${name} ($((SECONDS - started)) s)"
  else
    echo "--- FAILED: ${name} (exit $?, $((SECONDS - started)) s)"
    FAILED+=("$name")
  fi
}

echo "=== device check (${MODE}), $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if ! "$PY" - "$MODE" <<'PYEOF'
import sys
import torch
mode = sys.argv[1]
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda available: {torch.cuda.is_available()}")
try:
    import triton
    print(f"triton {triton.__version__}")
except ImportError:
    print("triton: not installed")
    sys.exit(1)
if mode == "gpu":
    if not torch.cuda.is_available():
        print("no CUDA device: run on a GPU machine, or use --cpu-smoke", file=sys.stderr)
        sys.exit(1)
    print(f"device: {torch.cuda.get_device_name()}, {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
PYEOF
then
  echo "--- FAILED: environment"
  exit 1
fi

step "1. kernel and device tests" "${LIMITS[0]}" "$PY" -m pytest -q -p no:cacheprovider "${TESTS[@]}"
step "2. kernel vs torch reference throughput" "${LIMITS[1]}" "$PY" -m specdec_lab.kernels.bench "${KERNEL_ARGS[@]}"
step "3. specdec bench, batch 1" "${LIMITS[2]}" "${SPECDEC[@]}" bench "${BENCH_ARGS[@]}"
step "4. batched tokens/s, plain vs speculative" "${LIMITS[3]}" "$PY" -m specdec_lab.batch_bench "${BATCH_ARGS[@]}"

echo
if ((${#FAILED[@]})); then
  echo "=== device check FAILED: ${FAILED[*]}"
  exit 1
fi
echo "=== device check passed (${MODE})"
