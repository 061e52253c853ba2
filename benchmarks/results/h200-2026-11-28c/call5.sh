source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
{ nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader; nproc; } | tee $OUT/gpu.txt
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
timeout 80 python3 benchmarks/bench_engine.py --model $C --steps 60 --concurrency 1 512 --max-num-seqs 512 --fp8-gemms on 2>>$OUT/err.txt | grep '^{' > $OUT/bench_engine.jsonl; t bench $?
WS="python3 benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --client-processes 4"
timeout 150 $WS --sessions 1 512 --format opus pcm_s16le --sample-rate 48000 24000 "--server-args=--fp8-gemms on" 2>>$OUT/err.txt | grep '^{' | sed 's/^{/{"r":1, /' >> $OUT/ws.jsonl; t ws1 $?
timeout 100 $WS --sessions 512 --format opus --sample-rate 48000 "--server-args=--fp8-gemms on" 2>>$OUT/err.txt | grep '^{' | sed 's/^{/{"r":2, /' >> $OUT/ws.jsonl; t ws2 $?
grep -v "uvicorn.error\|SyntaxWarning\|is not 0\|connection closed\|draining" $OUT/err.txt | tail -c 1500
