#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and CUDA's compiler, without network: install
# splatscale and gsplat from the wheels in .whl/ (a CUDA build of torch among
# them), run the gpu tests and the GPU benchmarks, and write the logs and one
# JSON summary to $OUT (./gpu_out when unset): the gpu tests (the cuda backend
# against the cpu one, a 600-image run against the CPU's PSNR), our render
# against gsplat's rasterization() (bench/gpu_render.py), training speed and
# peak GPU memory of the local and offload engines (bench/gpu_train.py). Stops
# at the first step that cannot run, saying which, with its log kept.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_out}"
mkdir -p "$OUT"
summary() { printf '{"stage": "%s", "ok": %s}\n' "$1" "$2" > "$OUT/summary.json"; }
step() {  # step NAME COMMAND...: run it, log it, stop the script if it fails
    local name="$1"; shift
    echo "gpu_check: $name" >&2
    if ! "$@" > "$OUT/$name.log" 2>&1; then
        echo "gpu_check: $name failed, see $OUT/$name.log" >&2
        summary "$name" false
        exit 1
    fi
}
step install pip install --no-index --find-links .whl -e ".[test,cuda]"
step cuda python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')"
# gsplat compiles its kernels on first use (minutes on 16 cores); say so, then cache them.
echo "gpu_check: compiling gsplat's CUDA kernels (first use only)" >&2
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
step compile python -c "from gsplat.cuda._backend import _C; assert _C is not None"
step gpu_tests python -m pytest -m gpu -q
step gpu_render sh -c "python bench/gpu_render.py > '$OUT/gpu_render.json'"
step gpu_train sh -c "python bench/gpu_train.py > '$OUT/gpu_train.json'"
python - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
summary = {"stage": "done", "ok": True,
           **{name: json.loads((out / f"{name}.json").read_text())
              for name in ("gpu_render", "gpu_train")}}
(out / "summary.json").write_text(json.dumps(summary) + "\n")
print(json.dumps(summary))
PY
