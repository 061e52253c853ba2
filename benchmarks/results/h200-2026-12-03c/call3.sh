# Session 24, call 3: channels_last_probe.py (cuDNN's transposed conv on channels-last tensors, per VAE block).
source scripts/device_env.sh > $OUT/gpu.txt
timeout 200 python3 benchmarks/results/h200-2026-12-03c/channels_last_probe.py > $OUT/probe.jsonl 2>$OUT/err.txt; echo rc=$?
python3 -c "
import json,os
for l in open(os.environ['OUT']+'/probe.jsonl'):
    d=json.loads(l); print(json.dumps({k:v for k,v in d.items() if not k.endswith('kernels')})); [print('  ',k,v) for k,v in d.items() if k.endswith('kernels')]
"
tail -3 $OUT/err.txt
