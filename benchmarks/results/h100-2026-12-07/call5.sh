# 28th session, call 5 (the same H100): issue 16's c=1,024 run with the bench's sentence (90 prompt positions from the
# random checkpoint's tokenizer) and with 26-position prompts (words that tokenizer holds whole; the released
# tokenizer spells the bench's sentence in ~22-24), one after the other, step traces for both.
source scripts/device_env.sh > $OUT/gpu.txt; cat $OUT/gpu.txt
SHORT="hello world and the speech model is to stream audio and voice test the model is to stream the voice and the audio test world hello"  # the 16th session's
F="--model /tmp/c2 --steps 60 --max-num-seqs 1024 --fp8-gemms on --fp8-backbone on --fp8-backbone-min-rows 8192 --coalesce-ms 5 --coalesce-max-ms 150 --concurrency 1024"
timeout 110 python3 benchmarks/bench_engine.py $F --step-trace $OUT/trace_text90.jsonl 2>>$OUT/err.txt | grep -e '"concurrency"' -e prompt_positions | cut -c1-400 | tee $OUT/text90.jsonl; echo rc=$?
timeout 110 python3 benchmarks/bench_engine.py $F --text "$SHORT" --step-trace $OUT/trace_text26.jsonl 2>>$OUT/err.txt | grep -e '"concurrency"' -e prompt_positions | cut -c1-400 | tee $OUT/text26.jsonl; echo rc=$?
for n in 90 26; do python3 benchmarks/results/h200-2026-12-03d/bursts.py $OUT/text$n.jsonl $OUT/trace_text$n.jsonl; done
