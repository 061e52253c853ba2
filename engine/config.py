"""Engine configuration: one flat dataclass that checks itself."""

from __future__ import annotations

from dataclasses import dataclass

IDLE_POSITIONS_PER_SLOT = 96  # a sentence or two of text: the default idle step budget's share of each slot
# A pass prefilled ahead of a burst's first step (EngineCore.prefill_ahead) holds prefill_ahead_tokens prompt positions
# over at most one request per AHEAD_POSITIONS_PER_ROW of them (at least AHEAD_MIN_ROWS, at most max_num_seqs): with
# CUDA graphs each pass is one replay of a backbone graph of that size, where an eager pass of ~100 requests makes
# ~2,100 torch calls, each of which waits out a GIL switch interval beside the burst's submitter (on an H100, 113-153 ms
# a pass; docs/benchmarks.md, "Thirtieth session"). One row per 32 positions holds a burst of short sentences (VoxCPM2
# prompts of 90 positions: 91 a pass) and bounds the rows a graph pads.
AHEAD_POSITIONS_PER_ROW = 32
AHEAD_MIN_ROWS = 8


@dataclass(slots=True)
class EngineConfig:
    model: str  # checkpoint directory or Hugging Face repo id
    device: str = "auto"  # "auto" = cuda if available, else cpu
    dtype: str = "auto"  # "auto" = bfloat16 on cuda, float32 on cpu
    max_num_seqs: int = 256  # concurrent running requests (engine slots)
    max_model_len: int = 4096  # LM positions per request: prompt + generated patches
    kv_block_size: int = 256  # flash-attn's paged kernel needs a multiple of 256
    num_kv_blocks: int | None = None  # None: sized from max_num_seqs and max_model_len, within kv_memory_fraction
    # On CUDA the KV pool takes at most this share of the device memory free once the weights are loaded; the rest
    # is for the step's activations, the decoders' per-slot state and the CUDA graphs' pools.
    kv_memory_fraction: float = 0.8
    max_prefill_tokens: int = 8192  # prompt positions admitted per step
    # A step of an idle engine (no stream decoding) admits up to this many (never fewer than max_prefill_tokens): no
    # player waits for that step, and a burst cut in two waves leaves the first playing one patch while the second's
    # prefill runs, its first chunks held back or its players run dry (on one H200, 512 sessions of 21-position
    # prompts: 390 then 122 admitted over two ~130 ms steps; in one 10,752-position step of ~160 ms, first frames
    # came ~100 ms sooner, docs/benchmarks.md). 0: as max_prefill_tokens. None: IDLE_POSITIONS_PER_SLOT per slot, at
    # least 16384, so that a burst filling every slot with sentence-long prompts lands whole (on one H200, 1,024 VoxCPM2
    # requests of 90 positions: in 11 waves over 2.3 s, xRT 834 and TTFB p50 963 ms; in one 738 ms step, 880 and 835).
    idle_prefill_tokens: int | None = None
    # While a burst's arrivals wait for the rest of it at an idle engine (coalesce_ms below), each time this many of
    # their prompt positions are queued the step loop takes them in and prefills them in full passes of this many
    # (prefill_ahead_chunk), so that the backbone works through the burst while it still arrives and its first step
    # is left with the last arrivals' prompts and the solvers' start (VoxCPM; a family that cannot, Qwen3-TTS, waits
    # as before). 0: never.
    prefill_ahead_tokens: int = 8192
    max_patches: int = 2000  # absolute cap on generated patches per request
    # When idle, the first arrival waits for the rest of its burst: admission starts once no request arrived for
    # coalesce_ms, and at most coalesce_max_ms after that first arrival.
    coalesce_ms: float = 1.0
    coalesce_max_ms: float = 20.0
    # While streams play, a step admits only the prompts it can prefill before the stream with the least audio ahead
    # runs dry, with pacing_margin_ms to spare; pacing holds the queue's head at most pacing_max_hold_ms (pacing.py).
    pace_admissions: bool = False
    pacing_margin_ms: float = 50.0
    pacing_max_hold_ms: float = 500.0
    # A stream's first chunk waits for its second while the next step is due to admit more than this many prompt
    # positions (queued, or arrived and not yet queued): such a step outlasts the one patch a stream that has just
    # started holds, so its player would run dry right after the first patch (a burst's early arrivals, admitted a
    # step before the rest). The held stream starts a step later with two patches in hand. 0: never hold (the
    # default of an engine used alone; the server's is 1024: wsserver.config says why).
    first_chunk_hold_positions: int = 0
    max_buffered_chunks: int = 32  # a request whose consumer lags this far is paused (no engine work)
    # A file that gets one JSON line per step (when it started on the host's monotonic clock, how long it took, its
    # batch and admissions, and when the admitted requests were made and taken in): the timeline that says why a
    # stream waited. "": none.
    step_trace: str = ""
    # VoxCPM: the LocDiT's qkv, gate/up and down GEMMs in FP8 (e4m3, per-token and per-feature scales), about twice
    # the bf16 rate on an H100; its drift from bf16 is bounded in tests/engine/models/voxcpm/test_fp8.py.
    fp8_gemms: bool = False
    # VoxCPM: the backbone's stacks too (LocEnc, base and residual LM: qkv, o, gate/up, down) in FP8, in the calls with
    # FP8_MIN_ROWS rows or more (engine/models/layers.py): an admission's prefill, and decode steps of 512 streams and
    # more. Opt-in apart from fp8_gemms: the LMs' error feeds back through every later patch.
    fp8_backbone: bool = False
    # The backbone's FP8 from this many rows per call instead (0: FP8_MIN_ROWS), e.g. 4096 for the large admissions'
    # prefills alone, where its GEMMs are most of the time a burst's first audio waits, while decode steps stay bf16.
    fp8_backbone_min_rows: int = 0
    attention_backend: str = "auto"  # auto | flash_attn | sdpa | torch
    enforce_eager: bool = False  # no CUDA graphs
    # Admissions of up to this many prompt positions (and 8 requests) replay a prefill graph: the time to first
    # audio at low load (VoxCPM: text-only prompts; Qwen3-TTS: any). 0: every admission's prefill runs eagerly.
    prefill_graph_tokens: int = 1024
    # LoRA adapters resident at once (0: no LoRA support, no cost), their max rank, and the released linear names
    # they may target (voxcpm's default targets: attention in the LMs and the LocDiT, and the projections).
    max_loras: int = 0
    max_lora_rank: int = 32
    lora_modules: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "enc_to_lm_proj",
        "lm_to_dit_proj",
        "res_to_dit_proj",
        "fusion_concat_proj",
    )
    loras: tuple[tuple[str, str], ...] = ()  # (name, local adapter directory) made resident at start

    def __post_init__(self) -> None:
        assert self.max_num_seqs >= 1
        assert self.max_model_len >= 16
        assert self.kv_block_size >= 1
        assert self.max_prefill_tokens >= 1 and (self.idle_prefill_tokens or 0) >= 0
        assert self.prefill_ahead_tokens >= 0
        assert self.max_patches >= 1
        assert 0 < self.kv_memory_fraction <= 1
        assert 0 <= self.coalesce_ms <= self.coalesce_max_ms
        assert self.first_chunk_hold_positions >= 0
        assert self.pacing_margin_ms >= 0 and self.pacing_max_hold_ms >= 0
        assert self.max_buffered_chunks >= 1
        assert self.prefill_graph_tokens >= 0
        assert self.max_loras >= 0 and self.max_lora_rank >= 1 and self.lora_modules
        assert len(self.loras) <= self.max_loras, "more start-up LoRA adapters than max_loras"
        assert self.attention_backend in ("auto", "flash_attn", "sdpa", "torch")

    @property
    def idle_prefill_budget(self) -> int:
        """The prompt positions an idle engine's step admits (idle_prefill_tokens resolved)."""
        idle = self.idle_prefill_tokens
        if idle is None:
            idle = max(16384, IDLE_POSITIONS_PER_SLOT * self.max_num_seqs)
        return max(idle, self.max_prefill_tokens)

    @property
    def prefill_ahead_chunk(self) -> tuple[int, int]:
        """A pass prefilled ahead: at most this many prompt positions over at most this many requests (see
        AHEAD_POSITIONS_PER_ROW)."""
        tokens = self.prefill_ahead_tokens
        return tokens, min(self.max_num_seqs, max(AHEAD_MIN_ROWS, tokens // AHEAD_POSITIONS_PER_ROW))
