#!/usr/bin/env bash
# Side by side with the anchor engine (nano-vllm-voxcpm) on one GPU, in one device call:
# a full-size random checkpoint from our generator (stop head disabled, so both engines run exactly
# STEPS patches per request), our benchmark, the anchor's runner on the same checkpoint, and the ratios.
#
#   bash benchmarks/compare_anchor.sh VARIANT ANCHOR_DIR [STEPS] ["CONCURRENCY LIST"]
#
# VARIANT: voxcpm2 | voxcpm1.5 | voxcpm-0.5b. ANCHOR_DIR: a copy of ../shared/anchor whose ../wheels
# holds the flash-attn wheel (the working tree travels to the GPU machine, ../shared does not).
# BENCH_ARGS: extra arguments for our benchmark (e.g. "--max-num-seqs 256").
set -euo pipefail
cd "$(dirname "$0")/.."
variant=${1:?variant}
anchor=${2:?anchor dir}
steps=${3:-60}
conc=${4:-"1 8 32 64 128 256"}
out=${OUT:-artifacts}/compare-$variant
ckpt=${CKPT_ROOT:-/tmp}/ckpt-$variant
mkdir -p "$out"
export PYTHONUNBUFFERED=1

[ -f "$ckpt/config.json" ] || python3 -m engine.models.voxcpm.make_checkpoint --variant "$variant" --size full --no-stop --out "$ckpt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
# shellcheck disable=SC2086
python3 benchmarks/bench_engine.py --model "$ckpt" --steps "$steps" --concurrency $conc ${BENCH_ARGS:-} | tee "$out/ours.jsonl"
bash "$anchor/run_anchor.sh" "$ckpt" "$steps" "$conc" | tee "$out/anchor.jsonl"
python3 benchmarks/ratios.py "$out/ours.jsonl" "$out/anchor.jsonl" --gpu "$(head -1 "$out/gpu.txt")" --model "$variant" | tee "$out/ratios.md"
