# 28th session, call 4 (the same H100): the anchor on call 3's VoxCPM1.5 checkpoint at c=128 and 192, below the
# c=256 at which its VAE decode ran out of the H100's memory in call 3 (ours ran c=256 and 512 there).
source scripts/device_env.sh > $OUT/gpu.txt; cat $OUT/gpu.txt
timeout 200 bash .carry/anchor/run_anchor.sh /tmp/ckpt-voxcpm1.5 60 "128 192" 2>$OUT/err.txt | grep '"concurrency"' | tee $OUT/anchor.jsonl; echo anchor rc=$?
grep -E "Error|error" $OUT/err.txt | tail -3
