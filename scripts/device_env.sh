# Source on the GPU machine (its image has torch/triton/transformers but not flash-attn, pytest-asyncio,
# pydantic or the reference package): installs the wheels carried in .carry/ into /tmp/site and puts
# them and the repo on PYTHONPATH.   Usage: source scripts/device_env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .carry/wheels/*.whl .carry/anchor/wheels/pydantic*.whl .carry/anchor/wheels/annotated_types*.whl \
  .carry/anchor/wheels/typing_inspection*.whl 2>&1 | grep -v -e WARNING -e "^$" || true
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
