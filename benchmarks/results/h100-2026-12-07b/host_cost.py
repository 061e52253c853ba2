"""The host's cost of building one VoxCPM2 prompt (the bench sentence, /tmp/c2's tokenizer), 1,024 kept alive as a
burst's are, five rounds; and of tokenising it alone.   python3 host_cost.py TREE_NAME"""

import json
import sys
import time

from engine.models.voxcpm.config import load_config
from engine.models.voxcpm.prompt import build_prompt
from engine.models.voxcpm.tokenizer import VoxCPMTokenizer
from engine.params import Prompt

TEXT = "The quick brown fox jumps over the lazy dog while the weather report plays on the radio in the kitchen."
config, tokenizer = load_config("/tmp/c2"), VoxCPMTokenizer.from_dir("/tmp/c2")
rounds = []
for _ in range(5):
    start = time.perf_counter()
    kept = [build_prompt(TEXT, Prompt(), tokenizer, config) for _ in range(1024)]
    rounds.append(round((time.perf_counter() - start) / 1024 * 1e6, 1))
    del kept
start = time.perf_counter()
for _ in range(1024):
    tokenizer.encode(TEXT)
encode_us = round((time.perf_counter() - start) / 1024 * 1e6, 1)
print(json.dumps({"tree": sys.argv[1], "build_prompt_us": rounds, "encode_us": encode_us}))
