"""Where a decode step's time goes, per batch size: one JSON line per B (CUDA only).

    python benchmarks/profile_step.py --model CKPT --batch 1 64 256

Keys (milliseconds, medians):
- admit_first / admit: wall time of the step(s) admitting B requests at once (eager backbone over every prompt, graphed
  tail; first time and again); this is what TTFB pays under a burst.
- engine_step: EngineCore.step() wall time in steady state (scheduling, the pieces' graph replays, D2H, chunks).
- step_graph: the decode step's pieces (head, Euler iterations, finish) captured as ONE graph and replayed (GPU
  time, no gaps between replays), fused kernels; `*_twin`: the same with the torch twins.
- step_eager: the same step run eagerly (wall time, synchronised): what the engine did before graphs.
- cfm / vae / locdit_call: graphs of the CFM loop, the streaming VAE decode and one LocDiT estimator call
  at this batch; backbone = step_graph - cfm - vae (LocEnc, both LMs, FSQ, projections, stop head).
- cfm_vae_overlapped: the CFM and VAE graphs launched together on two streams, until both finished. Against cfm +
  vae it says how much of the VAE (bandwidth- and latency-bound) would hide under the CFM's GEMMs if a step's VAE
  ran beside the next step's solver instead of after its own.
- host = engine_step - step_graph: the host's share of a step and the gaps between the pieces' replays.
- kernels_admit: the same for one admission of B requests (prefill step(s) until all decode).
- gflop: the matrix work of one step and of each piece (`step`, `cfm`, `vae`, `locdit_call`, and `backbone` = step -
  cfm - vae), counted by torch.utils.flop_counter over the torch twins (GEMMs, FP8 ones included, convolutions and
  attention; the element-wise work is not counted); `tflops`: each piece's gflop over its graph time above (TFLOP/s
  achieved, against the GPU's dense peak: 989 bf16 and 1979 FP8 on an H100 or H200); `gflop_per_audio_s`: the step's
  work per second of audio of one stream, the arithmetic floor's unit.
- kernels_eager: GPU kernel time of one eager step by kind (torch.profiler), fused kernels on; with --top N
  also the N kernels with the most time (`top_ms`). Kinds: attention, fused_triton (every other Triton kernel), conv,
  gemm, other; the results up to benchmarks/results/h100-2026-11-27 counted the FP8 quantising kernels as "other" and
  cuDNN's implicit-GEMM convolutions as "gemm".
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from engine import EngineConfig, GenerationParams, GenerationRequest, kernels
from engine.engine_core import EngineCore

TEXT = "The quick brown fox jumps over the lazy dog while the weather report plays on the radio in the kitchen."


def capture(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """A CUDA graph of fn (warmed up first, on a side stream as capture requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def graph_ms(*fns: Callable[[], object], iters: int = 10) -> float:
    """Median time of CUDA graphs of fns, launched together, each replayed on a stream of its own (so that they may
    run at once), until the last has finished; for one fn, its graph's replay time."""
    graphs = [capture(fn) for fn in fns]
    main = torch.cuda.current_stream()
    streams = [torch.cuda.Stream() for _ in graphs]
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(main)
        for graph, stream in zip(graphs, streams, strict=True):
            stream.wait_stream(main)
            with torch.cuda.stream(stream):
                graph.replay()
        for stream in streams:
            main.wait_stream(stream)
        end.record(main)
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def grouped_sdpa_flop(query_shape: tuple, key_shape: tuple, value_shape: tuple, *args: object, **kwargs: object) -> int:
    """Attention's work with fewer key/value heads than query heads (SDPA's enable_gqa, which the twins use): each
    query head does a whole head's work. torch's own formula refuses the shapes, and has none for the CPU's kernel."""
    heads = query_shape[1]
    return sdpa_flop_count(
        query_shape, (key_shape[0], heads, *key_shape[2:]), (value_shape[0], heads, *value_shape[2:])
    )


ATTENTION_FLOPS = {
    op: grouped_sdpa_flop
    for op in (
        torch.ops.aten._scaled_dot_product_flash_attention,
        torch.ops.aten._scaled_dot_product_efficient_attention,
        torch.ops.aten._scaled_dot_product_cudnn_attention,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu,
    )
}


def gflop(fn: Callable[[], object]) -> float:
    """The matrix work of one eager run of fn, in GFLOP (torch.utils.flop_counter: GEMMs, convolutions, attention)."""
    with FlopCounterMode(display=False, custom_mapping=ATTENTION_FLOPS) as counter:
        fn()
    return counter.get_total_flops() / 1e9


def wall_ms(fn: Callable[[], object], iters: int = 3) -> float:
    fn()
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


# First match wins: attention first (flash-attn's names say "cutlass", ours start with "_"), then the other Triton
# kernels (engine/kernels/triton_ops.py: every name starts with "_", some contain "conv"), conv before gemm
# (cuDNN's convolutions are named "..._implicit_gemm_...").
KERNEL_KINDS = {
    "attention": ("flash", "fmha", "_dense_attention_kernel", "_cached_attention_kernel"),
    "fused_triton": ("_",),
    "conv": ("conv", "cudnn", "implicit", "winograd", "fft"),
    "gemm": ("gemm", "cutlass", "xmma", "nvjet", "cublas"),
}


def kernel_kind(name: str) -> str:
    """The kind a GPU kernel's time is counted under (see KERNEL_KINDS); "other" for the rest."""
    name = name.lower()
    for kind, keys in KERNEL_KINDS.items():
        if any(name.startswith(key) if key == "_" else key in name for key in keys):
            return kind
    return "other"


def kernel_breakdown(fn: Callable[[], object], top: int) -> dict[str, object]:
    fn()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    by_name: dict[str, float] = {}
    count = 0
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        kind = kernel_kind(event.name)
        totals[kind] = totals.get(kind, 0.0) + event.device_time / 1e3
        by_name[event.name[:90]] = by_name.get(event.name[:90], 0.0) + event.device_time / 1e3
        count += 1
    heaviest = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    return {
        "launches": count,
        **{k: round(v, 2) for k, v in sorted(totals.items())},
        "top_ms": {name: round(ms, 2) for name, ms in heaviest},
    }


def profile(core: EngineCore, batch: int, steps: int, top: int) -> dict[str, object]:
    runner = core.runner
    # Every request must outlive its admission (a burst of B prompts takes several steps at max_prefill_tokens a
    # step, and the first admitted decode meanwhile) and the measured steps: no request may finish while profiled.
    patches = core.config.max_model_len // 2
    params = GenerationParams(seed=1, max_patches=patches, min_patches=patches)
    tag = iter(range(10**6))

    def admit() -> float:
        """Admit `batch` requests at once; wall ms until every one of them decodes."""
        for _ in range(batch):
            core.add_request(GenerationRequest(text=TEXT, params=params, request_id=f"p{batch}-{next(tag)}"))
        t0 = time.perf_counter()
        while core.scheduler.waiting or any(seq.is_prefill for seq in core.scheduler.running):
            core.step()  # admissions (prefill) until every request decodes
        return round(1e3 * (time.perf_counter() - t0), 2)

    def abort_all() -> None:
        for seq in list(core.scheduler.running):
            core.abort(seq.request_id)

    # The first admission of this size may pay one-time costs; the second is steady; the third is profiled.
    admit_times = [admit()]
    abort_all()
    admit_times.append(admit())
    abort_all()
    admit_kernels = kernel_breakdown(lambda: (admit(), abort_all()), top)
    admit()
    step_times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        core.step()
        step_times.append(1e3 * (time.perf_counter() - t0))
    seqs = list(core.scheduler.running)
    if len(seqs) != batch:
        raise RuntimeError(f"{len(seqs)} requests decode, not {batch}: the profile would mix batch sizes")
    slots = torch.tensor([seq.slot for seq in seqs], device=runner.device)
    timesteps = params.inference_timesteps
    model, cfm = runner.model, runner.model.feat_decoder
    dit = cfm.estimator
    gen = torch.Generator(device=runner.device).manual_seed(0)
    mu_dim = dit.hidden * max(dit.mu_tokens, 1)
    mu = torch.randn(batch, mu_dim, device=runner.device, dtype=model.dtype, generator=gen)
    cond = torch.randn(batch, runner.patch_size, runner.feat_dim, device=runner.device, dtype=model.dtype)
    noise = torch.randn(batch, runner.patch_size, runner.feat_dim, device=runner.device)
    ones = torch.ones(batch, device=runner.device)
    steps_t = torch.full((batch,), timesteps, device=runner.device)
    latents = torch.randn(batch, runner.feat_dim, runner.patch_size, device=runner.device)
    mu2, cond_tokens = dit.context(mu, cond)
    x2 = torch.randn(2 * batch, runner.patch_size, runner.feat_dim, device=runner.device, dtype=model.dtype)
    time_tok = dit.time_token(torch.full((2 * batch,), 0.5, device=runner.device, dtype=model.dtype))

    def step() -> object:
        """The decode step's pieces as the engine runs them when every row has `timesteps` Euler steps."""
        runner._decode_head(slots)
        for _ in range(2, timesteps + 1):
            runner._euler(batch)
        return runner._finish(batch)

    def run_cfm() -> object:
        return cfm(mu, cond, noise, ones, 2 * ones, steps_t, timesteps)

    def run_vae() -> object:
        return runner.vae_decoder.decode(slots, latents)

    def run_dit() -> object:
        return dit(x2, time_tok, mu2, cond_tokens)

    line: dict[str, object] = {
        "batch": batch,
        "admit_first": admit_times[0],
        "admit": admit_times[1],
        "engine_step": round(statistics.median(step_times), 2),
    }
    for suffix, fused in (("", True), ("_twin", False)):
        with kernels.fused_enabled(fused):
            line["step_graph" + suffix] = round(graph_ms(step), 2)
            line["cfm" + suffix] = round(graph_ms(run_cfm), 2)
            line["vae" + suffix] = round(graph_ms(run_vae), 2)
            line["locdit_call" + suffix] = round(graph_ms(run_dit), 3)
    line["cfm_vae_overlapped"] = round(graph_ms(run_cfm, run_vae), 2)
    line["backbone"] = round(line["step_graph"] - line["cfm"] - line["vae"], 2)  # type: ignore[operator]
    line["host"] = round(line["engine_step"] - line["step_graph"], 2)  # type: ignore[operator]
    with kernels.fused_enabled(False):
        line["step_eager_twin"] = round(wall_ms(step), 2)
        # The twins: the same matrix work in torch ops the counter knows (a Triton kernel's it would not see).
        work = {"step": gflop(step), "cfm": gflop(run_cfm), "vae": gflop(run_vae), "locdit_call": gflop(run_dit)}
    work["backbone"] = work["step"] - work["cfm"] - work["vae"]
    times = {"step": line["step_graph"], **{piece: line[piece] for piece in ("cfm", "vae", "locdit_call", "backbone")}}
    line["gflop"] = {piece: round(value, 3) for piece, value in work.items()}
    line["tflops"] = {piece: round(work[piece] / times[piece], 1) for piece in work}  # type: ignore[operator]
    patch_s = core.info.samples_per_patch / core.info.sample_rate  # one stream's audio per step
    line["gflop_per_audio_s"] = round(work["step"] / (batch * patch_s), 1)
    line["step_eager"] = round(wall_ms(step), 2)
    line["kernels_eager"] = kernel_breakdown(step, top)
    line["kernels_admit"] = admit_kernels
    for seq in seqs:
        core.abort(seq.request_id)
    return line


@torch.inference_mode()
def main(args: argparse.Namespace) -> None:
    config = EngineConfig(
        model=args.model,
        max_num_seqs=max(args.batch),
        max_model_len=1024,
        fp8_gemms=args.fp8_gemms == "on",
        fp8_backbone=args.fp8_backbone == "on",
    )
    t0 = time.perf_counter()
    core = EngineCore(config)
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "startup_s": round(time.perf_counter() - t0, 1)}))
    for batch in args.batch:
        print(json.dumps(profile(core, batch, args.steps, args.top)), flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--fp8-gemms", choices=["on", "off"], default="off", help="the LocDiT's GEMMs in FP8")
    p.add_argument("--fp8-backbone", choices=["on", "off"], default="off", help="the LocEnc's and LMs' GEMMs too")
    p.add_argument("--top", type=int, default=0, help="list the N kernels with the most GPU time (eager step)")
    main(p.parse_args())
