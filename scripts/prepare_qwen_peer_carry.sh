#!/usr/bin/env bash
# Builds .carry-qwen/ (git-ignored): everything a GPU-machine call needs to benchmark the open Qwen3-TTS engines
# faster-qwen3-tts and faster-qwen3-tts-batch (benchmarks/bench_qwen3_peers.py) and our own engine on the same
# random checkpoint, without .carry/ (the two together exceed the 64 MiB carry limit). Wheels for Python 3.12,
# x86-64; the machine's image already has torch 2.11, triton, numpy, safetensors, onnxruntime, torchaudio,
# transformers 5.17, huggingface_hub 1.x, tokenizers 0.23 and accelerate 1.15.
#   common/  what both peers import and the image lacks or may lack: soundfile (+ cffi), sox (the Python wrapper;
#            imported by the 25 Hz tokenizer module, never run for 12 Hz checkpoints), einops, soxr (our librosa
#            stand-in's resampler, benchmarks/qwen_peers/librosa), requests and its dependencies (huggingface_hub 0.36
#            and transformers 4.57 import it). librosa itself is not carried: with numba and llvmlite it is over
#            60 MB, and the peers call only three of its functions.
#   tf5/     faster-qwen3-tts 0.5.4 (newest) on qwen-tts-hf 0.1.1.post1, the Transformers 5 port of qwen-tts, with
#            transformers 5.15.1 (its minimum) and the tokenizers it accepts: on the image's 5.17 loading fails
#            (qwen-tts-hf registers a "default" RoPE initializer that 5.17 then applies to the codec's Mimi
#            config, which has no rope_theta; checked on CPU here).
#   tf4/     faster-qwen3-tts-batch 0.2.0 (newest), written against transformers 4.57 (one-argument
#            `lazy_initialization`, indexable caches), so it runs on faster-qwen3-tts 0.3.2 (the last release on
#            qwen-tts 0.1.1) with qwen-tts 0.1.1, transformers 4.57.3 and the tokenizers / huggingface_hub /
#            accelerate that scripts/setup.sh pins for the reference.
#   engine/  the trimmed flash-attn wheel from ../shared/wheels, for our engine in the same call, and what pytest
#            needs for the engine's GPU tests (tests/conftest.py and the hypothesis suites; no server packages), so
#            that one call runs those tests, our benchmark and the peers'.
# Each set is installed into its own --target directory by scripts/qwen_peer_env.sh.
# Usage: scripts/prepare_qwen_peer_carry.sh [SHARED_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${1:-../shared}
out=.carry-qwen
rm -rf "$out"
mkdir -p "$out"/{common,tf5,tf4,engine}
cp "$shared"/wheels/flash_attn-*.whl "$out"/engine/
chmod -R u+w "$out"
dl() {
  local dir=$1
  shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 -d "$out/$dir" "$@"
}
dl common soundfile==0.14.0 cffi==2.1.1 pycparser==3.12 sox==1.4.1 einops==0.8.2 soxr==1.1.0 requests==2.34.2 \
  urllib3==2.8.0 certifi==2026.10.19.post1 charset_normalizer==3.5.3 idna==3.11
dl tf5 faster-qwen3-tts==0.5.4 qwen-tts-hf==0.1.1.post1 transformers==5.15.1 tokenizers==0.22.1
dl tf4 faster-qwen3-tts-batch==0.2.0 faster-qwen3-tts==0.3.2 qwen-tts==0.1.1 transformers==4.57.3 \
  tokenizers==0.22.1 huggingface_hub==0.36.0 accelerate==1.12.0
dl engine pytest-asyncio==1.5.0 orjson==3.13.0 hypothesis==6.170.17 sortedcontainers==2.4.0
du -sh "$out"/* "$out"
