#!/usr/bin/env bash
# Run the GPU tests (and optionally the GPU benchmark) on a machine with a CUDA device, using the
# python3 that already has torch, Triton, pytest, pytest-xdist and filelock; nothing is downloaded.
#   scripts/gpu-tests.sh            # GPU tests only
#   scripts/gpu-tests.sh --bench    # then the GPU benchmark
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "device", torch.cuda.get_device_name(0))'
# Six workers, one per long test: the real-model suite (about 2.5 minutes) runs beside the others, not after them.
python3 -m pytest tests/test_gpu.py "tests/test_cold_cache.py::test_cold_cache_isolates_counts_and_restores[plain]" \
  -q -rs -p no:randomly -n 6 --dist worksteal --durations=10
if [ "${1:-}" = "--bench" ]; then
  python3 benchmarks/gpu_compile.py
fi
