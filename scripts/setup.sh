#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian/Ubuntu machine, idempotently:
# system libraries (libopus; Chromium for the browser tests), a virtual environment with the CPU build of
# torch (GPU hosts: create the venv with a CUDA torch first, this script keeps it), the project itself,
# and with --test the test tools, the Pipecat and LiveKit Agents extras and the reference packages (`voxcpm`, and
# `qwen-tts` beside the venv's site-packages) that the parity tests compare against.
set -euo pipefail
cd "$(dirname "$0")/.."

with_test=0
[ "${1:-}" = "--test" ] && with_test=1
venv=${VENV:-.venv}

apt_pkgs=()
ldconfig -p 2>/dev/null | grep -q 'libopus\.so\.0' || apt_pkgs+=(libopus0)
if [ "$with_test" = 1 ] && ! command -v chromium >/dev/null; then apt_pkgs+=(chromium); fi
# node runs the validators of the Helm chart's custom resources (tests/deploy)
if [ "$with_test" = 1 ] && ! command -v npm >/dev/null; then apt_pkgs+=(nodejs npm); fi
if [ ${#apt_pkgs[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  echo "setup: installing system packages: ${apt_pkgs[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${apt_pkgs[@]}" >/dev/null
fi

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
# The CPU build, so that no CUDA wheels are downloaded on machines without a GPU.
"$venv/bin/python" -c "import torch" 2>/dev/null || "${pip[@]}" torch==2.13.0

if [ "$with_test" = 1 ]; then
  # The adapters' extras too: their tests drive the real Pipecat and LiveKit Agents.
  "${pip[@]}" -e ".[test,hub,pipecat,livekit]"
  # The reference implementation, for parity tests only. Its declared dependencies (gradio, funasr,
  # torchaudio, ...) are for its demo and training code; the model code needs what [test] installs.
  "${pip[@]}" --no-deps voxcpm==2.0.3
  # The Qwen3-TTS reference pins transformers 4.57 while the project (and voxcpm) run 5.x, so it goes, with the
  # transformers, tokenizers, huggingface_hub and accelerate versions it accepts, into a side directory that only
  # its parity worker (tests/engine/models/qwen3tts/ref_worker.py) puts first on sys.path.
  qwen_ref="$venv/qwen-tts-ref"
  if [ ! -d "$qwen_ref/qwen_tts" ]; then
    "${pip[@]}" --no-deps --target "$qwen_ref" qwen-tts==0.1.1 transformers==4.57.3 tokenizers==0.22.1 \
      huggingface_hub==0.36.0 accelerate==1.12.0
  fi
  # The Gateway API and Prometheus Operator CRD schemas, as the npm packages of @kubernetes-models carry them, for
  # validating the chart offline; pinned by tests/deploy/package-lock.json.
  deploy_tests=tests/deploy
  if [ ! "$deploy_tests/node_modules/.package-lock.json" -nt "$deploy_tests/package-lock.json" ]; then
    npm ci --prefix "$deploy_tests" --no-audit --no-fund --silent
  fi
else
  "${pip[@]}" -e ".[hub]"
fi
