#!/usr/bin/env bash
# On a machine with a CUDA device: the gpu-marked tests, then the GPU benchmark, in one go.
#   bash benchmarks/gpu_check.sh        (after the README's set-up; about 5 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
"$python" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
"$python" -m pytest -q -m gpu tests/test_gpu.py
TQDM_DISABLE=1 "$python" benchmarks/bench.py --device cuda --case light --case heavy --case grad \
    --samples 256 --batch 64 --repeat 3
