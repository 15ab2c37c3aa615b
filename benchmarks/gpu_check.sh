#!/usr/bin/env bash
# On a machine with a CUDA device: the gpu-marked tests, then the GPU benchmark, in one go; on
# a node with two or more GPUs also torchrun with two ranks, one per GPU, against one process.
#   bash benchmarks/gpu_check.sh        (after the README's set-up; about 5 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
gpus=$("$python" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.device_count())")
"$python" -c "import torch; print(torch.cuda.get_device_name(), 'x', torch.cuda.device_count())"
"$python" -m pytest -q -m gpu tests/test_gpu.py
# every device of the node from one command (the two-GPU test is skipped on fewer than two)
"$python" -m pytest -q -m gpu -n 0 tests/test_torchrun.py
if [ "$gpus" -ge 2 ]; then  # the same with a real model: rank 0's rate, and the merge
    TQDM_DISABLE=1 "$python" -m torch.distributed.run --nproc-per-node=2 -m probe model=resnet18 \
        'layers=[layer4]' dataset.num_samples=512 batch_size=64 hydra.run.dir="$(mktemp -d)" 2>&1 \
        | grep -E "rank|wrote|merged"
fi
TQDM_DISABLE=1 "$python" benchmarks/bench.py --device cuda --case light --case heavy --case grad \
    --samples 256 --batch 64 --repeat 3
