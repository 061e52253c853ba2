# Session 20, call 5: the GPU kernel tests of the fused attention, now also at the engine's default launch
# (ROPE_ATTENTION_LARGE_GRID from 2,048 programs on).
source scripts/device_env.sh > $OUT/gpu.txt
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/kernels/test_kernels_gpu.py -k "rope or attention" > $OUT/gpu_tests.txt 2>&1; echo tests rc=$?
tail -3 $OUT/gpu_tests.txt
