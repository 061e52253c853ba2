# Source on the GPU machine (its image has torch/triton/transformers but not flash-attn, the server's packages,
# libopus, pytest-asyncio, pydantic or the reference package): installs what scripts/prepare_device_carry.sh put
# in .carry/ into /tmp/site, registers libopus with the dynamic linker (opuslib looks it up by name), and puts
# the site and the repo on PYTHONPATH.   Usage: source scripts/device_env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .carry/wheels/*.whl .carry/anchor/wheels/pydantic*.whl .carry/anchor/wheels/annotated_types*.whl \
  .carry/anchor/wheels/typing_inspection*.whl 2>&1 | grep -v -e WARNING -e "^$" || true
echo "$PWD/.carry/lib" >/etc/ld.so.conf.d/voxstream-carry.conf && ldconfig
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 PATH="/tmp/site/bin:$PATH"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
