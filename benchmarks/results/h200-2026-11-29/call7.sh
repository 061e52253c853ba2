# Call 7: fewer warps for RoPE (2), quantize_rows (1) and the tiny-row attention (4) at the LocDiT's shapes (call 6's
# sweep). The three kernels' GPU tests, then bench_engine c=512 base (86f50fb) against this tree, one pair.
source scripts/device_env.sh >/dev/null
ROOT=$PWD; T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/err.txt; t ckpt $?
timeout 50 python3 -m pytest -q -m gpu tests/engine/kernels/test_kernels_gpu.py -k "rope_in_place or dense_attention or quantize_rows" -p no:cacheprovider 2>&1 | tail -3 > $OUT/gpu_tests.txt; t gpu_tests $?
tail -1 $OUT/gpu_tests.txt
B="benchmarks/bench_engine.py --model $C --steps 60 --concurrency 512 --max-num-seqs 512 --fp8-gemms on"
timeout 55 python3 $B 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "new", /' | tee -a $OUT/bench_ab.jsonl; t bench_new $?
(cd .carry/base && PYTHONPATH=$ROOT/.carry/base:$PYTHONPATH timeout 55 python3 $B 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "base", /' | tee -a $OUT/bench_ab.jsonl); t bench_base $?
