#!/usr/bin/env bash
# One command for the GPU figures of issue 30 (about 8 minutes on one GPU; see benchmarks/gpu_check.py):
#   bash benchmarks/gpu_check.sh [--device D] [--quick] [--data DIR] [--model DIR] [--out DIR]
# Defaults: --device cuda, the full run, --data ../shared/data, --model the packaged all-MiniLM-L6-v2,
# --out benchmarks/results. Writes OUT/gpu_check.json and OUT/gpu_check.md. Needs only torch, transformers,
# sentence-transformers, tokenizers, safetensors, numpy and tqdm; bertforge runs from src/ (no install).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=true
exec "${PYTHON:-python3}" "$root/benchmarks/gpu_check.py" "$@"
