#!/usr/bin/env bash
# The plugin's GPU checks in one call (a machine with a GPU, python3 with numpy, cuda-python and NVRTC; no
# TensorRT needed): the kernels against the numpy reference (tests/gpu/test_plugin_kernels.py), then the
# GEMM benchmark. Logs and the benchmark's JSON go to ${OUT:-gpu-check}/.
set -u
out=${OUT:-gpu-check}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$out/install.log" 2>&1 \
  || { echo "install failed:"; tail -5 "$out/install.log"; exit 1; }
PYTHONUNBUFFERED=1 TRT_BRIDGE_GPU=1 timeout "${TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider --noconftest \
  --tb=short --maxfail=10 -W ignore::DeprecationWarning tests/gpu/test_plugin_kernels.py 2>&1 | tee "$out/tests.log" | tail -40
PYTHONUNBUFFERED=1 timeout "${BENCH_S:-120}" python3 scripts/bench_plugin_gemm.py --runs 50 --json "$out/bench.json" 2>&1 \
  | tee "$out/bench.log" | tail -30
