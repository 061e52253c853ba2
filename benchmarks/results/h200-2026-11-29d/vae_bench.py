"""The streaming VAE decode of one VoxCPM2 patch for B streams, as one CUDA graph (fp16, as the engine runs it):
median ms of 20 replays after warm-up. Run in a tree's root: python3 vae_bench.py CKPT B..."""

import json
import statistics
import sys
from pathlib import Path

import torch

from engine.models.voxcpm.audio_vae import load_audio_vae
from engine.models.voxcpm.checkpoint import _vae_file, load_config
from engine.models.voxcpm.vae_stream import StreamingVAEDecoder

directory = sys.argv[1]
config = load_config(directory)
vae = load_audio_vae(_vae_file(Path(directory)), config.audio_vae_config, device="cuda", dtype=torch.float16)
for batch in map(int, sys.argv[2:]):
    decoder = StreamingVAEDecoder(vae, batch, "cuda", torch.float16)
    slots = torch.arange(batch, device="cuda")
    z = torch.randn(batch, vae.latent_dim, 4, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            decoder.decode(slots, z)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            decoder.decode(slots, z)
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    print(json.dumps({"batch": batch, "vae_graph_ms": round(statistics.median(times), 3)}), flush=True)
