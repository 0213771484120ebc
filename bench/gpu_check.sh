#!/usr/bin/env bash
# The whole GPU check, for a machine with an NVIDIA GPU and CUDA's compiler but no
# network, in under 9.5 minutes: install what the machine lacks from the wheels in
# .whl/ (bench/gpu_wheels.sh fetches them), build gsplat's kernels for this GPU
# alone, run our render against gsplat's rasterization() (bench/gpu_render.py),
# training speed and memory (bench/gpu_train.py: local, offloaded, 2 ranks on the
# one GPU), then the gpu tests (gsplat's kernels against the CPU's: absgrad,
# anti-aliased splats, fisheye cameras, masks and colour transforms among them). It
# writes four files to $OUT (./gpu_out when unset): summary.json (every figure,
# each stage's seconds and outcome), gpu_check.log (every stage's output),
# gpu_render.json and gpu_train.json. It stops at the first stage that fails,
# saying which in one line.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p "${OUT:-./gpu_out}"
OUT="$(cd "${OUT:-./gpu_out}" && pwd)"
SITE="${SITE:-/tmp/splatscale-site}"  # the wheels, installed apart from the image's own
LOG="$OUT/gpu_check.log"
: > "$LOG"
STAGES="$OUT/.stages"  # name seconds exit-status, a line each; folded into summary.json
: > "$STAGES"

summarise() {
    python3 - "$OUT" "$STAGES" <<'PY'
import json, pathlib, sys
out, stages = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
summary = {"stages": {}}
for line in stages.read_text().splitlines():
    name, seconds, status = line.split()
    summary["stages"][name] = {"seconds": float(seconds), "ok": status == "0"}
summary["ok"] = all(stage["ok"] for stage in summary["stages"].values())
for name in ("gpu_render", "gpu_train"):
    path = out / f"{name}.json"
    if path.is_file() and path.stat().st_size:
        summary[name] = json.loads(path.read_text().splitlines()[-1])
tests = [line for line in (out / "gpu_check.log").read_text().splitlines()
         if " passed" in line or " failed" in line]
if tests:
    summary["gpu_tests"] = tests[-1].strip("= ")
(out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
stages.unlink()
print(json.dumps(summary))
PY
}

stage() {  # stage NAME LIMIT COMMAND...: run it within LIMIT seconds, logged and timed
    local name="$1" limit="$2"
    shift 2
    echo "gpu_check: $name" >&2
    echo "=== $name: $*" >> "$LOG"
    local start=$SECONDS
    timeout "$limit" "$@" >> "$LOG" 2>&1
    local status=$?
    echo "$name $((SECONDS - start)) $status" >> "$STAGES"
    if [ "$status" -ne 0 ]; then
        echo "gpu_check: $name failed (exit $status$([ "$status" -eq 124 ] && echo ", over ${limit} s")); see $LOG" >&2
        summarise > /dev/null
        exit 1
    fi
}

# Each stage's limit keeps the whole under 9.5 minutes, so one 10-minute command holds it.
# The wheels and the project go into $SITE, not the image's own environment.
stage install 40 sh -c "python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target '$SITE' .whl/*.whl \
    && python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
    --upgrade --target '$SITE' ."
export PYTHONPATH="$SITE"
stage imports 20 sh -c "nvcc --version | tail -n 2; python3 -c \"import numba, gsplat, torch
print('torch', torch.__version__, 'gsplat', gsplat.__version__, 'numba', numba.__version__)
assert torch.cuda.is_available(), 'torch sees no CUDA device'\""
# gsplat compiles all its sources on first use: for this GPU's architecture alone,
# on every core.
TORCH_CUDA_ARCH_LIST="$(python3 -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')"
export TORCH_CUDA_ARCH_LIST MAX_JOBS="${MAX_JOBS:-$(nproc)}"
stage build 240 python3 -c "from gsplat.cuda._backend import _C; assert _C is not None"
stage gpu_render 35 sh -c "python3 bench/gpu_render.py > '$OUT/gpu_render.json'"
stage gpu_train 90 sh -c "python3 bench/gpu_train.py --images 200 --garden-steps 20 \
    --ranks-images 200 > '$OUT/gpu_train.json'"
# Last: the suite has grown with each feature's GPU test, and a stage over its limit
# stops the check; the figures above are in by then.
stage gpu_tests 130 python3 -m pytest -m gpu -q -p no:cacheprovider
summarise
