"""The open Qwen3-TTS engines on a checkpoint of ours: faster-qwen3-tts (single stream, CUDA graphs) and
faster-qwen3-tts-batch (batched CUDA graphs, batch-and-wait), with bench_engine.py's sentence, a fixed number of
codec frames per request (EOS is suppressed until then, as our runs use min_patches = max_patches) and its JSON
keys, one line per (peer, concurrency), plus the GPU's name. Both peers need CUDA.

    python benchmarks/bench_qwen3_peers.py --model CKPT --frames 120

- faster-qwen3-tts 0.5.4 streams (`generate_custom_voice_streaming` / `generate_voice_clone_streaming`, x-vector
  only): c=1 is --repeats requests one after another, ttfb = time to the first audio chunk (its --chunk-sizes frames
  decoded; by default 1 frame, its lowest, and 8, as its README's figures); it has no batching, so c>1 queues the c
  requests and serves them one at a time (`serialized`: its aggregate xRT is its c=1 xRT), hence c=1 by default.
- faster-qwen3-tts-batch 0.2.0 clones voices only (a Base checkpoint; x-vector only, its default) and does not
  stream: a burst of c is one `generate_voice_clone_batch` with graphs captured at batch size c, and every request's
  first audio is its whole audio (ttfb = the burst's wall time); c=64 and 256 by default.

The two need different transformers (5.15.1 for faster-qwen3-tts 0.5.4 through qwen-tts-hf; 4.57.3 for the batch
package through faster-qwen3-tts 0.3.2 and qwen-tts 0.1.1; scripts/prepare_qwen_peer_carry.sh says why), so each
peer runs in its own process with its stack first on sys.path: `--site-root` holds common/, tf5/ and tf4/ as
scripts/qwen_peer_env.sh installs them from .carry-qwen. benchmarks/qwen_peers/ (a librosa stand-in) goes first too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# bench_engine.py's sentence (tests/benchmarks/test_bench_qwen3_peers.py keeps them equal)
TEXT = "The quick brown fox jumps over the lazy dog while the weather report plays on the radio in the kitchen."
FRAME_RATE = 12.5  # Qwen3-TTS 12 Hz codec frames per second (1920 samples at 24 kHz)


# each peer's --site-root subdirectory with its transformers and packages
PEERS = {"faster-qwen3-tts": "tf5", "faster-qwen3-tts-batch": "tf4"}
CONCURRENCY = {"faster-qwen3-tts": [1], "faster-qwen3-tts-batch": [64, 256]}  # without --concurrency


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


@dataclass
class Result:
    ttfb: float  # seconds from the burst's start to the request's first audio
    wall: float  # seconds from the burst's start to the request's last audio
    audio_s: float
    gap: float  # the longest wait between two chunks of the request


def summary(peer: str, c: int, results: list[Result], wall: float, extra: dict) -> dict:
    import torch

    rtf = [r.wall / r.audio_s for r in results]
    line = {
        "engine": peer,
        "concurrency": c,
        "requests": len(results),
        "ttfb_p50_ms": round(1000 * percentile([r.ttfb for r in results], 50), 1),
        "ttfb_p90_ms": round(1000 * percentile([r.ttfb for r in results], 90), 1),
        "rtf_mean": round(statistics.mean(rtf), 4),
        "rtf_p90": round(percentile(rtf, 90), 4),
        "audio_s_per_req": round(min(r.audio_s for r in results), 2),
        "xrt_aggregate": round(sum(r.audio_s for r in results) / wall, 2),
        "gap_max_ms": round(1000 * max(r.gap for r in results), 1),
    } | extra
    if torch.cuda.is_available():
        line["gpu"] = torch.cuda.get_device_name()
        line["gpu_mem_reserved_gib"] = round(torch.cuda.memory_reserved() / 2**30, 2)
        line["gpu_mem_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return line


def reference_voice(directory: Path) -> str:
    """A 3 s, 24 kHz voice file for x-vector cloning (a random checkpoint makes no voice worth matching)."""
    import numpy as np
    import soundfile

    t = np.arange(3 * 24000) / 24000
    rng = np.random.default_rng(0)
    audio = 0.3 * np.sin(2 * np.pi * 140 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t)) + 0.02 * rng.standard_normal(
        t.size
    )
    path = directory / "voice.wav"
    soundfile.write(path, audio.astype(np.float32), 24000)
    return str(path)


def model_type(model_dir: str) -> str:
    return json.loads((Path(model_dir) / "config.json").read_text())["tts_model_type"]


# ---- faster-qwen3-tts: one stream at a time ------------------------------------------------------------------


def run_faster(args: argparse.Namespace, emit: Callable[[dict], None]) -> None:
    import torch
    from faster_qwen3_tts import FasterQwen3TTS

    model = FasterQwen3TTS.from_pretrained(
        args.model, device="cuda", dtype=getattr(torch, args.dtype), max_seq_len=args.max_seq_len
    )
    kind = model.model.model.tts_model_type
    if kind == "custom_voice":
        voice = {"speaker": args.speaker}
        generate = model.generate_custom_voice_streaming
    elif kind == "base":
        voice = {"ref_audio": reference_voice(Path(tempfile.mkdtemp())), "ref_text": "", "xvec_only": True}
        generate = model.generate_voice_clone_streaming
    else:
        raise SystemExit(f"faster-qwen3-tts: a {kind} checkpoint is not benchmarked here (custom_voice or base)")

    def stream(chunk_size: int, frames: int) -> Iterator[int]:
        for audio, _sr, _timing in generate(
            text=TEXT,
            language=args.language,
            max_new_tokens=frames,
            min_new_tokens=frames,
            chunk_size=chunk_size,
            **voice,
        ):
            yield len(audio)

    def one(chunk_size: int, t0: float) -> Result:
        ttfb, samples, last, gap = None, 0, t0, 0.0
        for n in stream(chunk_size, args.frames):
            now = time.perf_counter()
            if n and ttfb is None:
                ttfb = now - t0
            elif n:
                gap = max(gap, now - last)
            last = now
            samples += n
        assert ttfb is not None, "no audio"
        return Result(ttfb, time.perf_counter() - t0, samples / model.sample_rate, gap)

    base = {"model": Path(args.model).name, "variant": kind, "frames": args.frames, "dtype": args.dtype}
    for chunk_size in args.chunk_sizes:
        for _ in range(args.warmup):
            one(chunk_size, time.perf_counter())
        for c in args.concurrency:
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            extra = base | {"chunk_size": chunk_size, "streaming": True}
            if c == 1:
                results = [one(chunk_size, time.perf_counter()) for _ in range(args.repeats)]
                wall = sum(r.wall for r in results)
            else:  # no batching: the burst waits in line, each request timed from the burst's start
                t0 = time.perf_counter()
                results = [one(chunk_size, t0) for _ in range(c)]
                wall = time.perf_counter() - t0
                extra |= {"serialized": True}
            emit(summary("faster-qwen3-tts", c, results, wall, extra))


# ---- faster-qwen3-tts-batch: a burst is one batch ------------------------------------------------------------


def run_batch(args: argparse.Namespace, emit: Callable[[dict], None]) -> None:
    import torch
    from faster_qwen3_tts import FasterQwen3TTS
    from faster_qwen3_tts_batch import BatchedFasterQwen3TTS

    kind = model_type(args.model)
    if kind != "base":
        raise SystemExit(f"faster-qwen3-tts-batch clones voices only (generate_voice_clone_batch): {kind} checkpoint")
    base = FasterQwen3TTS.from_pretrained(
        args.model, device="cuda", dtype=getattr(torch, args.dtype), max_seq_len=args.max_seq_len
    )
    voice = reference_voice(Path(tempfile.mkdtemp()))
    info = {"model": Path(args.model).name, "variant": kind, "frames": args.frames, "dtype": args.dtype}
    for c in args.concurrency:
        batched = BatchedFasterQwen3TTS(base, max_batch_size=c, max_seq_len=args.max_seq_len)
        requests = [{"text": TEXT, "language": args.language, "ref_audio": voice, "ref_text": ""}] * c
        # captures this batch size's graphs, on a short run
        batched.generate_voice_clone_batch(requests, max_new_tokens=4, min_new_tokens=4)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        outputs = batched.generate_voice_clone_batch(requests, max_new_tokens=args.frames, min_new_tokens=args.frames)
        wall = time.perf_counter() - t0
        results = [Result(wall, wall, len(audio[0]) / sr, 0.0) for audio, sr in outputs]
        emit(summary("faster-qwen3-tts-batch", c, results, wall, info | {"streaming": False}))
        del batched
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def child(args: argparse.Namespace) -> None:
    """One peer in this process: its stack, then the stand-ins and the repo (the stand-in uses engine's mel)."""
    args.concurrency = args.concurrency or CONCURRENCY[args.peer]
    site = Path(args.site_root)
    for path in reversed([REPO / "benchmarks" / "qwen_peers", site / PEERS[args.peer], site / "common", REPO]):
        sys.path.insert(0, str(path))

    # the peers print their progress: to stderr, so that stdout carries only the JSON lines
    out, sys.stdout = sys.stdout, sys.stderr

    def emit(line: dict) -> None:
        expected = args.frames / FRAME_RATE
        if abs(line["audio_s_per_req"] - expected) > 0.02 * expected:
            raise SystemExit(f"{args.peer} made {line['audio_s_per_req']} s, not {expected} s: raise --max-seq-len")
        print(json.dumps(line), file=out, flush=True)

    {"faster-qwen3-tts": run_faster, "faster-qwen3-tts-batch": run_batch}[args.peer](args, emit)


def main(args: argparse.Namespace, argv: list[str]) -> int:
    """Every peer in its own process (given this command line; the child ignores --peers); a peer that fails prints
    an error line and the next one still runs."""
    failed = 0
    for peer in args.peers:
        proc = subprocess.run(
            [sys.executable, __file__, "--peer", peer, *argv], stdout=subprocess.PIPE, text=True, check=False
        )
        sys.stdout.write(proc.stdout)
        if proc.returncode:
            failed += 1
            print(json.dumps({"engine": peer, "error": f"exit {proc.returncode} (stderr above)"}), flush=True)
    return 1 if failed else 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a Qwen3-TTS checkpoint directory (Base for both peers)")
    p.add_argument("--peers", nargs="+", choices=sorted(PEERS), default=sorted(PEERS))
    p.add_argument("--peer", choices=sorted(PEERS), help=argparse.SUPPRESS)  # set for the child process
    p.add_argument("--frames", type=int, default=120, help="codec frames per request (120 = 9.6 s)")
    p.add_argument("--concurrency", type=int, nargs="+", help="bursts to run (default: per peer, CONCURRENCY)")
    p.add_argument("--repeats", type=int, default=5, help="requests at c=1 (ttfb_p50 is their median)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--chunk-sizes", type=int, nargs="+", default=[1, 8], help="faster-qwen3-tts frames per chunk")
    p.add_argument("--language", default="English")
    p.add_argument("--speaker", default="vivian", help="CustomVoice speaker (our engine's default)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-seq-len", type=int, default=512, help="the peers' static KV length (prompt + frames)")
    p.add_argument("--site-root", default=os.environ.get("QWEN_PEER_SITE", "/tmp/qpeer"))
    return p.parse_args(argv)


if __name__ == "__main__":
    argv = sys.argv[1:]
    args = parse_args(argv)
    if args.peer:
        child(args)
    else:
        sys.exit(main(args, argv))
