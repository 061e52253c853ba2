source scripts/device_env.sh >/dev/null
T0=$(date +%s); t() { echo "$1 rc=$2 $(( $(date +%s)-T0 ))s" | tee -a $OUT/log.txt; }
C=/tmp/c2
[ -f $C/config.json ] || python3 -m engine.models.voxcpm.make_checkpoint --variant voxcpm2 --size full --no-stop --out $C >/dev/null 2>>$OUT/log.txt; t ckpt $?
export PYTHONPATH="$PWD/.carry/exp:$PYTHONPATH"
WS="python3 benchmarks/ws_latency.py --model $C --device 0 --max-patches 60 --sessions 512 512 512 --format opus --sample-rate 48000 --client-processes 4"
VOX_GCX=1 timeout 200 $WS "--server-args=--fp8-gemms on" 2>$OUT/errA.txt | grep '^{' > $OUT/wsA.jsonl; t A $?
VOX_GCX=1 VOX_GCTHRESH=100000,50,1000 timeout 200 $WS "--server-args=--fp8-gemms on" 2>$OUT/errB.txt | grep '^{' > $OUT/wsB.jsonl; t B $?
python3 .carry/gcsum.py $OUT/errA.txt $OUT/wsA.jsonl A
python3 .carry/gcsum.py $OUT/errB.txt $OUT/wsB.jsonl B
for f in A B; do python3 - $OUT/ws$f.jsonl $f <<'PY'
import json, sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if "sessions" in d:
        print(json.dumps({"v": sys.argv[2]} | {k: d.get(k) for k in ("starved_sessions", "starved_ms_total", "dry_at_audio_s", "xrt", "opus_frames")} | {"ff": d["first_text_to_first_frame_ms"]["p50"], "client": d["cpu"]["client"]["util"], "wcpu": d["cpu"]["workers"]["util"]}))
PY
done
grep -c GCX $OUT/errA.txt $OUT/errB.txt
grep -v "GCX\|uvicorn.error\|SyntaxWarning\|is not 0\|connection closed\|draining" $OUT/errA.txt | tail -c 600
gzip $OUT/err*.txt
