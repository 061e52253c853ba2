# Session 14, call 5: the residual add + RMSNorm in the few-rows gate/up kernel (working tree) against bc6a259
# (base): the few-rows GPU tests and bf16 parity, profile_step at B=1, bench_engine c=1 alternating x3.
source scripts/device_env.sh >/dev/null
ROOT=$PWD; T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
C=/tmp/c2
(python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/err.txt) &
timeout 150 python3 -m pytest -q -m gpu -s tests/engine/kernels/test_kernels_gpu.py tests/engine/models/voxcpm/test_model_gpu.py -k few_rows -p no:cacheprovider > $OUT/gpu_tests_few.txt 2>&1; t few_tests $?
timeout 120 python3 -m pytest -q -m gpu tests/engine/models/voxcpm/test_parity_gpu.py -p no:cacheprovider 2>&1 | grep -v "^$" | tail -12 > $OUT/gpu_tests.txt; t gpu_tests $?
grep -h "few-rows kernels vs\|passed\|failed\|Error" $OUT/gpu_tests_few.txt | tail -8; tail -2 $OUT/gpu_tests.txt
wait; t ckpt 0
timeout 150 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/profile_step.py --model $C --batch 1 --fp8-gemms on 2>>$OUT/err.txt | grep '"batch"' > $OUT/profile_b1.jsonl; t profile $?
python3 -c "
import json,os
for l in open(os.environ['OUT']+'/profile_b1.jsonl'):
    d=json.loads(l); print(json.dumps({k:d.get(k) for k in ('tree','batch','admit','engine_step','step_graph','cfm','vae','locdit_call','backbone','host')}))"
for c in 1 1 1; do
  B="benchmarks/bench_engine.py --model $C --steps 60 --concurrency $c --max-num-seqs 512 --fp8-gemms on"
  (cd .carry/base && PYTHONPATH=$ROOT/.carry/base:$PYTHONPATH timeout 60 python3 $B 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "base", /' >> $OUT/bench_ab.jsonl); t base_$c $?
  timeout 60 python3 $B 2>>$OUT/err.txt | grep '"concurrency"' | sed 's/^{/{"tree": "new", /' >> $OUT/bench_ab.jsonl; t new_$c $?
done
python3 -c "
import json,os
for l in open(os.environ['OUT']+'/bench_ab.jsonl'):
    d=json.loads(l); print(json.dumps({k:d.get(k) for k in ('tree','concurrency','ttfb_p50_ms','rtf_p90','xrt_aggregate')}))"
tail -3 $OUT/err.txt
