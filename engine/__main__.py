"""Text in, WAV out: `python -m engine --model DIR_OR_REPO --text "Hello." --out hello.wav`.

The interim serve command. Without --model it runs a tiny random checkpoint (made under .cache/ on first
use), which exercises the whole engine but produces noise, not speech.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import wave
from pathlib import Path

import numpy as np

from engine import AsyncEngine, EngineConfig, GenerationParams, GenerationRequest
from engine.models.voxcpm.make_checkpoint import demo_checkpoint


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint directory or Hugging Face repo id (default: tiny random demo)")
    parser.add_argument("--text", required=True)
    parser.add_argument("--out", required=True, type=Path, help="WAV file to write (16-bit PCM, mono)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--cfg-value", type=float, default=2.0)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--timesteps", type=int, default=10, help="CFM Euler steps per patch")
    parser.add_argument("--max-patches", type=int, help="cap on generated patches (default: from text length)")
    parser.add_argument("--device", default="auto")
    return parser.parse_args(argv)


def demo_model() -> str:
    path = demo_checkpoint()
    banner = "#" * 78
    print(
        f"{banner}\n# WARNING: no --model given. Using a TINY RANDOM demo checkpoint: the output is\n"
        f"# NOISE, NOT SPEECH. Pass --model DIR_OR_REPO for a real VoxCPM model.\n{banner}",
        file=sys.stderr,
    )
    return str(path)


def write_wav(path: Path, samples: np.ndarray, sample_rate: int) -> None:
    pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm.tobytes())


async def synthesize(args: argparse.Namespace) -> None:
    engine = AsyncEngine(EngineConfig(model=args.model or demo_model(), device=args.device, max_num_seqs=1))
    await engine.start()
    params = GenerationParams(
        cfg_value=args.cfg_value,
        temperature=args.temperature,
        inference_timesteps=args.timesteps,
        seed=args.seed,
        max_patches=args.max_patches,
    )
    chunks = []
    try:
        async for chunk in engine.generate(GenerationRequest(text=args.text, params=params)):
            chunks.append(chunk)
    finally:
        await engine.close()
    audio = np.concatenate([chunk.samples for chunk in chunks])
    write_wav(args.out, audio, engine.info.sample_rate)
    reason = chunks[-1].finish_reason.value
    seconds = len(audio) / engine.info.sample_rate
    print(f"wrote {args.out}: {seconds:.2f} s at {engine.info.sample_rate} Hz, {len(chunks)} patches ({reason})")


def main(argv: list[str] | None = None) -> None:
    asyncio.run(synthesize(parse_args(argv)))


if __name__ == "__main__":
    main()
