source scripts/device_env.sh >/dev/null
ROOT=$PWD; T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
{
echo "governor: $(cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>&1) driver: $(cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_driver 2>&1)"
echo "freq cur/min/max: $(cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq /sys/devices/system/cpu/cpu0/cpufreq/scaling_min_freq /sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq 2>&1 | tr '\n' ' ')"
for s in /sys/devices/system/cpu/cpu0/cpuidle/state*; do echo "$s $(cat $s/name $s/latency $s/disable 2>&1 | tr '\n' ' ')"; done
echo "idle driver: $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>&1)"
ls -l /dev/cpu_dma_latency 2>&1; id; nproc; lscpu | grep -E "Model name|MHz|NUMA node0"; cat /proc/cmdline
} > $OUT/cpu.txt 2>&1
cat $OUT/cpu.txt
python3 .carry/pingpong.py | tee $OUT/pingpong.jsonl; t pingpong $?
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/err.txt; t ckpt $?
WS1="python3 benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --sessions 1 1 1 1 1 1 --format opus --sample-rate 48000 --client-processes 1 --client-cpus 12-15 --server-args=--fp8-gemms=on"
cd .carry/hoptree
for round in 1 2; do
  for w in 0 tree; do
    mkdir -p /tmp/hop_${w}_$round
    if [ $w = 0 ]; then A="--workers 0"; else A=""; fi
    HOP_TRACE_DIR=/tmp/hop_${w}_$round PYTHONPATH=$ROOT/.carry/hoptree:$PYTHONPATH timeout 70 $WS1 $A 2>>$OUT/err.txt | grep '^{' >> $OUT/ws_$w.jsonl; t ws_${w}_$round $?
    python3 $ROOT/.carry/hops_one_session.py /tmp/hop_${w}_$round >> $OUT/hops_$w.txt
  done
done
cd $ROOT
cat $OUT/hops_0.txt; echo; cat $OUT/hops_tree.txt
python3 - <<'PY'
import json, os, statistics
out = os.environ["OUT"]
for layout in ("0", "tree"):
    ff = [json.loads(l)["first_text_to_first_frame_ms"]["p50"] for l in open(f"{out}/ws_{layout}.jsonl") if '"sessions"' in l]
    print(json.dumps({"layout": layout, "levels": len(ff), "first_frame_ms": ff, "median": statistics.median(ff) if ff else None}))
PY
tail -3 $OUT/err.txt
