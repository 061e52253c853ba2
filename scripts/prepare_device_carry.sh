#!/usr/bin/env bash
# Builds .carry/ (git-ignored) for runs on the GPU machine, whose image lacks flash-attn, pytest-asyncio,
# pydantic and the reference package: the trimmed flash-attn wheel and the anchor runner from ../shared, and
# wheels for the rest. Name `.carry` in the device call's `carry` and start the command with
# `source scripts/device_env.sh`.        Usage: scripts/prepare_device_carry.sh [SHARED_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${1:-../shared}
mkdir -p .carry/wheels
cp "$shared"/wheels/*.whl .carry/wheels/
rm -rf .carry/anchor
cp -r "$shared/anchor" .carry/anchor
chmod -R u+w .carry
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 -d .carry/wheels voxcpm==2.0.3 pytest-asyncio==1.5.0
ls .carry/wheels
