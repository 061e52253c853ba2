"""Where a Qwen3-TTS engine step and an admission spend their time, per batch size: one JSON line per B.

    python benchmarks/profile_qwen3.py --model CKPT --batch 1 64 256 --top 15
    python benchmarks/profile_qwen3.py --model TINY --batch 1 4 --device cpu   # a smoke run: no graph timings

Keys (milliseconds, medians; `null` where the device has no such measure, e.g. graph replays on the CPU):
- admit_first / admit: wall time of the step(s) admitting B requests at once, until every one of them decodes
  (the first time, then steady); at B = 1 this is the engine's share of the time to first audio.
- make_prompt: host prompt building for one request (tokenizer, prompt rows), which the caller's thread pays.
- admit_split (B = 1, one admission with a synchronisation after each piece, so the pieces add up): slot_state
  (the slot's device state written), priming (the codec decoder over an ICL clone's reference codes; 0 without
  one), embed (prompt embeddings), prefill (packing, the talker over the prompt, and frame 0's codebook 0 when the
  prefill is graphed), first_c0 (frame 0's codebook 0 when the prefill runs eagerly; 0 when graphed), frame (the
  step's frame body, graphed or eager) and rest (the step's remainder: scheduling, D2H, chunks); total = their
  sum; prefill_graphed says which prefill ran. `admit_split_clone` does the same for a Base checkpoint's ICL
  clone (random x-vector, --ref-frames reference frames), where priming is paid. `--prefill-graph-tokens 0`
  runs every prefill eagerly (what the engine did before prefill graphs).
- engine_step: EngineCore.step() wall time in steady state with B running requests.
- frame_graph: one replay of the frame body's graph of B's bucket (GPU time, CUDA events); frame_eager: the same
  body run eagerly (wall time, synchronised).
- talker_decode, predictor, codec_decoder, choose_c0: the frame's pieces over B rows, each captured as its own
  graph and replayed (GPU time; eager wall time on the CPU): the talker's decode position (embedding of the
  frame + text, the layers over the paged KV), the code predictor's 15 passes with their sampling, the
  streaming codec decoder step, codebook 0's logits and sampling.
- host = engine_step - frame_graph: the host's share of a step and the gaps around the replay.
- kernels_frame / kernels_admit: GPU kernel time by kind of one eager frame / one admission of B requests
  (torch.profiler), with --top N also the N kernels with the most time (`top_ms`). CUDA only.
The pieces and eager frames run on the scratch slot only (padded rows' state): requests' state is untouched.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch

from engine import EngineConfig, GenerationParams, GenerationRequest
from engine.engine_core import EngineCore
from engine.models.qwen3tts.generate import CODEBOOKS
from engine.models.qwen3tts.runner import Qwen3Runner
from engine.noise import uniform
from engine.params import Prompt

try:  # python -m benchmarks.profile_qwen3 (repo root on sys.path) or python benchmarks/profile_qwen3.py
    from benchmarks.profile_step import TEXT, graph_ms, kernel_breakdown
except ModuleNotFoundError:
    from profile_step import TEXT, graph_ms, kernel_breakdown


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall_ms(fn: Callable[[], object], device: torch.device, iters: int = 3) -> float:
    """Median synchronised wall time of fn (after one warm-up call)."""
    fn()
    times = []
    for _ in range(iters):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(1e3 * (time.perf_counter() - t0))
    return round(statistics.median(times), 3)


def piece_ms(fn: Callable[[], object], device: torch.device) -> float:
    """GPU time of fn replayed as a CUDA graph; its eager wall time on the CPU."""
    return round(graph_ms(fn), 3) if device.type == "cuda" else wall_ms(fn, device)


class AdmitTimer:
    """Times the pieces of `Qwen3Runner._admit` (and the step around it) by wrapping the runner's methods on the
    instance, with a synchronisation before and after each piece while `on`."""

    def __init__(self, runner: Qwen3Runner) -> None:
        self.runner = runner
        self.on = False
        self.in_admit = False
        self.times: dict[str, float] = {}

    def _timed(self, name: str, fn: Callable, admit_only: bool = True) -> Callable:
        def wrapper(*args, **kwargs):
            if not self.on or (admit_only and not self.in_admit):
                return fn(*args, **kwargs)
            sync(self.runner.device)
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            sync(self.runner.device)
            self.times[name] = self.times.get(name, 0.0) + 1e3 * (time.perf_counter() - t0)
            return out

        return wrapper

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        runner, model = self.runner, self.runner.model
        admit = runner._admit

        def admit_wrapper(seqs):
            self.in_admit = True
            try:
                return admit(seqs)
            finally:
                self.in_admit = False

        wrapped = {
            (runner, "_admit"): self._timed("admit", admit_wrapper, admit_only=False),
            (runner, "decoder"): self._timed("priming", runner.decoder),
            (runner, "_prefill"): self._timed("prefill_total", runner._prefill),
            (model, "embed_prompts"): self._timed("embed", model.embed_prompts),
            (runner, "_choose_c0"): self._timed("first_c0", runner._choose_c0),
            (runner, "_step"): self._timed("frame", runner._step, admit_only=False),
        }
        originals = {key: getattr(*key) for key in wrapped}
        for (obj, name), fn in wrapped.items():
            object.__setattr__(obj, name, fn)
        try:
            yield
        finally:
            for (obj, name), fn in originals.items():
                if obj is model:
                    del model.__dict__[name]  # the bound method comes back from the class
                else:
                    object.__setattr__(obj, name, fn)

    def split(self, step_ms: float) -> dict[str, object]:
        t = {"priming": 0.0, "first_c0": 0.0, **self.times}
        line = {
            "slot_state": t["admit"] - t["prefill_total"] - t["priming"],
            "priming": t["priming"],
            "embed": t["embed"],
            "prefill": t["prefill_total"] - t["embed"] - t["first_c0"],
            "first_c0": t["first_c0"],
            "frame": t["frame"],
            "rest": step_ms - t["admit"] - t["frame"],
            "total": step_ms,
        }
        graphs = self.runner.graphs
        return {
            **{k: round(v, 3) for k, v in line.items()},
            "prefill_graphed": graphs is not None and graphs.prefill is not None and not self.times.get("first_c0"),
        }


def clone_prompt(runner: Qwen3Runner, ref_frames: int) -> Prompt:
    """An ICL voice clone of random data: an x-vector and `ref_frames` reference frames with their transcript."""
    gen = np.random.default_rng(0)
    vector = gen.standard_normal(runner.config.talker.stack.hidden_size).astype(np.float32)
    codes = gen.integers(0, 2048, (ref_frames, 1, CODEBOOKS)).astype(np.float32)
    return Prompt(text="A short reference sentence.", latents=codes, reference_latents=vector.reshape(-1, 1, 16))


def profile(core: EngineCore, batch: int, steps: int, top: int, ref_frames: int) -> dict[str, object]:
    runner = core.runner
    assert isinstance(runner, Qwen3Runner), "profile_qwen3.py profiles Qwen3-TTS checkpoints"
    device = runner.device
    cuda = device.type == "cuda"
    params = GenerationParams(seed=1, max_patches=steps + 4, min_patches=steps + 4)
    tag = iter(range(10**6))

    def request(prompt: Prompt | None = None) -> GenerationRequest:
        return GenerationRequest(
            text=TEXT, params=params, request_id=f"p{batch}-{next(tag)}", prompt=prompt or Prompt()
        )

    def admit(n: int = batch, prompt: Prompt | None = None) -> float:
        """Admit n requests at once; wall ms until every one of them decodes."""
        for _ in range(n):
            core.add_request(request(prompt))
        sync(device)
        t0 = time.perf_counter()
        while core.scheduler.waiting or any(seq.is_prefill for seq in core.scheduler.running):
            core.step()
        return round(1e3 * (time.perf_counter() - t0), 3)

    def abort_all() -> None:
        for seq in list(core.scheduler.running):
            core.abort(seq.request_id)

    line: dict[str, object] = {"batch": batch, "gpu": torch.cuda.get_device_name(device) if cuda else "cpu"}
    line["admit_first"] = admit()
    abort_all()
    line["admit"] = admit()
    abort_all()
    line["make_prompt"] = wall_ms(lambda: core.make_sequence(request()), device, iters=5)
    if batch == 1:
        variants = [("admit_split", None)]
        if runner.config.variant == "base":
            variants.append(("admit_split_clone", clone_prompt(runner, ref_frames)))
        for key, prompt in variants:
            admit(1, prompt)  # warm-up (a clone's priming shapes)
            abort_all()
            timer = AdmitTimer(runner)
            with timer.installed():
                timer.on = True
                step = admit(1, prompt)
            abort_all()
            line[key] = timer.split(step)
    line["kernels_admit"] = kernel_breakdown(lambda: (admit(), abort_all()), top) if cuda else None

    admit()
    if (running := len(core.scheduler.running)) != batch:
        raise RuntimeError(f"{running} requests decode, not {batch}: the profile would mix batch sizes")
    step_times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        core.step()
        step_times.append(1e3 * (time.perf_counter() - t0))
    line["engine_step"] = round(statistics.median(step_times), 3)
    abort_all()

    # The frame and its pieces over B scratch rows (frame 0, no look-ahead: K/V into the scratch block).
    scratch = runner.scratch_slot
    inputs = torch.tensor([[scratch, 0, 0]] * batch, device=device)
    slots, frame, go = inputs[:, 0], inputs[:, 1], inputs[:, 2].bool()
    model = runner.model
    if runner.graphs is not None:
        bucket = runner.graphs.bucket(batch)

        def pad() -> None:
            runner._step_input[:bucket] = torch.tensor([scratch, 0, 0], device=device)

        times = []
        for _ in range(10):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            pad()
            start.record()
            runner.graphs.frame.run(bucket)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        line["frame_graph"] = round(statistics.median(times), 3)
        line["host"] = round(line["engine_step"] - line["frame_graph"], 3)  # type: ignore[operator]
    else:
        line["frame_graph"] = line["host"] = None
    line["frame_eager"] = wall_ms(lambda: runner._frame(inputs), device)

    hidden, c0 = runner.slot_hidden[slots], runner.slot_c0[slots]
    seeds = runner.slot_seed[slots]
    frames = torch.zeros(batch, CODEBOOKS, dtype=torch.int64, device=device)
    text = runner.slot_text[slots, 0]

    def talker_decode() -> object:
        x = model.frame_embed(frames) + model.text_embed(text)
        return model.talker_forward(x, frame, runner._decode_attention(slots, frame, go))

    def predictor() -> object:
        sampling = runner.slot_predictor.select(slots)
        steps = frame * CODEBOOKS
        return model.predict_rest(hidden, c0, sampling, lambda g, vocab: uniform(seeds, steps + g, (vocab,)))

    def codec_decoder() -> object:
        state = runner.decoder_state.select(slots)
        audio = runner.decoder(frames[:, None], state)
        runner.decoder_state.assign(slots, state)
        return audio

    line["talker_decode"] = piece_ms(talker_decode, device)
    line["predictor"] = piece_ms(predictor, device)
    line["codec_decoder"] = piece_ms(codec_decoder, device)
    line["choose_c0"] = piece_ms(lambda: runner._choose_c0(slots, hidden, frame + 1), device)
    line["kernels_frame"] = kernel_breakdown(lambda: runner._frame(inputs), top) if cuda else None
    return line


@torch.inference_mode()
def main(args: argparse.Namespace) -> None:
    config = EngineConfig(
        model=args.model,
        device=args.device,
        max_num_seqs=max(args.batch),
        max_model_len=512,  # prompt + the profiled frames, with room
        enforce_eager=args.enforce_eager,
        **({} if args.prefill_graph_tokens is None else {"prefill_graph_tokens": args.prefill_graph_tokens}),
    )
    t0 = time.perf_counter()
    core = EngineCore(config)
    print(json.dumps({"model": args.model, "startup_s": round(time.perf_counter() - t0, 1)}), flush=True)
    for batch in args.batch:
        print(json.dumps(profile(core, batch, args.steps, args.top, args.ref_frames)), flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a Qwen3-TTS checkpoint directory")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--steps", type=int, default=8, help="steady-state steps timed per batch size")
    p.add_argument("--top", type=int, default=0, help="list the N kernels with the most GPU time")
    p.add_argument("--ref-frames", type=int, default=50, help="reference frames of the ICL clone (Base only)")
    p.add_argument("--device", default="auto", help="auto | cuda | cpu (cpu: a smoke run, no graph timings)")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (frame_graph null)")
    p.add_argument(
        "--prefill-graph-tokens",
        type=int,
        help="prefill graphs up to this many prompt positions (default: the engine's; 0: every prefill eager)",
    )
    main(p.parse_args())
