#!/usr/bin/env bash
# Tiny end-to-end example of HeteroSim's workload layer (a few seconds to a minute on a laptop CPU).
#
#   1. train the `tiny` preset for real, one process (gloo, fp32): the loss falls;
#   2. capture the same script as 16 ranks (tp 2 x pp 2 with 2 virtual chunks x dp 4,
#      sequence parallelism, distributed optimizer with overlapped grad reduction);
#   3. print the trace's totals, then replay it on a DGX A100 cluster.
#
# Usage: examples/tiny_gpt.sh [OUT_DIR]     (run from anywhere; python = the repo's .venv if present)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python
OUT="${1:-$(mktemp -d)}/tiny_trace"
cd "$ROOT"

echo "== 1. real training, world size 1"
RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT="${MASTER_PORT:-29517}" \
    "$PY" models/pretrain_gpt.py --preset tiny --train-iters 8

echo "== 2. capture as 16 ranks -> $OUT"
"$PY" -m capture --world-size 16 -o "$OUT" models/pretrain_gpt.py $(grep -v '^#' examples/tiny_gpt.args)

echo "== 3. trace totals and replay"
"$PY" -m capture --inspect "$OUT"
"$PY" -m replay simulate "$OUT" --cluster dgx-a100
