#!/usr/bin/env bash
# Here, with network: the wheels bench/gpu_check.sh installs on a GPU machine that has
# none, for its Python 3.12 on x86-64 Linux, into .whl/ (git-ignored). That machine's
# image has torch (a CUDA build), numba, numpy, scipy, Pillow, ninja, pytest, tqdm,
# jaxtyping and rich; it lacks these. --no-deps: each one's needs are listed here.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(
    gsplat==1.5.3     # its CUDA sources, compiled there on first use
    pycolmap==4.2.1   # the COLMAP scenes' reader
    plyfile==1.1.5    # point_cloud.ply
)
rm -rf .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
ls -l .whl
