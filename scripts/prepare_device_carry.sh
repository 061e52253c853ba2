#!/usr/bin/env bash
# Builds .carry/ (git-ignored) for runs on the GPU machine, whose image has torch, triton and numpy but lacks
# flash-attn, the server's packages and libopus, the test tools (hypothesis too: pytest imports every test package's
# conftest) and the reference package: the trimmed flash-attn wheel and the anchor runner from ../shared, wheels for
# the rest (Python 3.12, x86-64), libopus from Debian, and py-spy for profiling a server process there. Name `.carry`
# in the device call's `carry` and start the command with `source scripts/device_env.sh`.
# Usage: scripts/prepare_device_carry.sh [SHARED_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${1:-../shared}
rm -rf .carry/wheels .carry/lib
mkdir -p .carry/wheels .carry/lib
cp "$shared"/wheels/*.whl .carry/wheels/
rm -rf .carry/anchor
cp -r "$shared/anchor" .carry/anchor
chmod -R u+w .carry
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 -d .carry/wheels \
  voxcpm==2.0.3 pytest-asyncio==1.5.0 websockets==17.4 orjson==3.13.0 uvloop==0.23.0 py-spy==0.4.3 \
  uvicorn==0.54.0 h11==0.16.0 click==8.3.1 httptools==0.9.0 starlette==1.10.0 anyio==4.16.0 idna==3.11 \
  python-multipart==0.0.34 av==18.1.0 soxr==1.1.0 \
  hypothesis==6.170.17 sortedcontainers==2.4.0
python3 -m pip wheel -q --no-deps -w .carry/wheels opuslib==3.0.1  # pure Python, published as an sdist only
tmp=$(mktemp -d)
(cd "$tmp" && apt-get download -q libopus0 >/dev/null 2>&1 && dpkg-deb -x libopus0_*.deb root)
cp -L "$tmp"/root/usr/lib/x86_64-linux-gnu/libopus.so.0 .carry/lib/
rm -rf "$tmp"
ls .carry/wheels .carry/lib
