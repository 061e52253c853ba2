# Source on the GPU machine, with `.carry-qwen` carried (scripts/prepare_qwen_peer_carry.sh), for the Qwen3-TTS
# call: installs the peers' three wheel sets into their own directories under /tmp/qpeer (common/, tf5/, tf4/:
# benchmarks/bench_qwen3_peers.py puts one stack first on a peer's sys.path), and flash-attn with the test tools into
# /tmp/site (our engine and its GPU tests), and puts /tmp/site and the repo on PYTHONPATH.
#   Usage: source scripts/qwen_peer_env.sh
for set in common tf5 tf4; do
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "/tmp/qpeer/$set" \
    .carry-qwen/"$set"/*.whl 2>&1 | grep -v -e WARNING -e "^$" || true
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .carry-qwen/engine/*.whl 2>&1 | grep -v -e WARNING -e "^$" || true
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 QWEN_PEER_SITE=/tmp/qpeer
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
