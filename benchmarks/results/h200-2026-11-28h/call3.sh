source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
timeout 150 python3 -m pytest -q -x tests/engine/kernels/test_kernels_gpu.py -k "conv_snake or pointwise" 2>&1 | tail -15 > $OUT/unit_tests.txt; t unit_tests $?
tail -3 $OUT/unit_tests.txt
timeout 150 python3 -m pytest -q -m gpu tests/engine/models/voxcpm/test_parity_gpu.py tests/engine/models/voxcpm/test_model_gpu.py 2>&1 | tail -15 > $OUT/model_tests.txt; t model_tests $?
tail -3 $OUT/model_tests.txt
timeout 160 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/profile_step.py --model $C --batch 512 --fp8-gemms on --top 14 2>$OUT/err_p.txt | grep '^{' > $OUT/profile_ab.jsonl; t profile_ab $?
python3 -c "
import json,os
for l in open(os.environ['OUT']+'/profile_ab.jsonl'):
    d=json.loads(l)
    if 'batch' in d: print(d.get('tree'), {k: d[k] for k in ('engine_step','step_graph','cfm','vae','backbone','host')}, d['kernels_eager']['top_ms'])
"
timeout 200 python3 benchmarks/ab_trees.py run --base .carry/base -- python3 benchmarks/bench_engine.py --model $C --steps 60 --concurrency 1 512 --max-num-seqs 512 --fp8-gemms on 2>$OUT/err_b.txt | grep '^{' > $OUT/bench_ab.jsonl; t bench_ab $?
cut -c1-330 $OUT/bench_ab.jsonl | grep concurrency
