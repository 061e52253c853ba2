"""The device side of the engine: weights, the KV pool, per-slot state, and every host<->device copy.

One `run(batch)` is one engine step, in two parts: the running streams (decode) and the requests admitted this step
(prefill). Each part is a pipeline over static device buffers, replayed piece by piece from CUDA graphs per batch
bucket on CUDA (engine/cuda_graphs.py) and run eagerly, the same code, elsewhere:
1. head: the backbone, then the solver's start (`VoxCPMModel.start`) into the static solver state `flow`.
   Decode: the one-position backbone from slot state, inside the decode head's graph. Prefill: the backbone over
   the prompts (variable length: replayed from a graph per (token, sequence) bucket when the admission is small
   and text only, or a text-only pass prefilled ahead of a burst's first step; eager otherwise), then the prefill
   head's graph from its hiddens.
2. the Euler iterations, in place on `flow`: a part's rows come ordered by their Euler-step count, most first, and
   iteration k runs on the rows that still have steps, a prefix. Every count 1-100 replays the same graphs, and a
   request asking for many steps costs the others nothing but its own rows' work.
3. finish: the generated patches are fed back into per-slot device buffers and decoded to audio by the streaming
   VAE; the packed [latents | audio | stop] rows are copied to the host. A step waits for the device ONCE.

Per-slot device state (indexed by `Sequence.slot`, written at admission, read by every step):
- `slot_patch`: the patch a request generated last; the next step's input position for that request.
  The autoregressive feedback never leaves the device.
- `slot_seed`, `slot_step`: the counter-based noise key; `slot_step` counts the request's patches.
- `slot_cfg`, `slot_temperature`, `slot_timesteps`: per-request sampling settings.
- `slot_adapter`: the request's LoRA slot (0: none; only with max_loras > 0). The LoRA linears read it per row,
  expanded to positions and LocDiT rows, so that rows of any adapters share every graph.
- `slot_prompt_len`, `slot_blocks`: the decode position (prompt length + patches - 1) and the KV block
  table (fixed at admission: KV is reserved for the request's whole life, see block_manager.py).
- the streaming VAE decoder's causal context (owned by `StreamingVAEDecoder`).
A decode step therefore needs from the host only the list of slots.

Slot `max_num_seqs` and KV block `num_kv_blocks` are scratch: padded graph rows point at them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from engine.attention.metadata import AttentionMetadata
from engine.config import EngineConfig
from engine.cuda_graphs import (
    GraphSet,
    PrefillBuckets,
    bucket_sizes,
    cache_pinned_rows,
    eager_token_ladder,
    eager_tokens,
    smallest_fit,
)
from engine.device import kv_pool_blocks, native_convs, resolve_device, resolve_dtype
from engine.lora.pool import LoRALimits, LoRAPool
from engine.models.family import StepResult
from engine.models.voxcpm.batch import BackboneInputs
from engine.models.voxcpm.checkpoint import LoadedVoxCPM, load_voxcpm
from engine.models.voxcpm.lora import attach_lora
from engine.models.voxcpm.prompt import HostPrompt, build_prompt
from engine.models.voxcpm.vae_stream import StreamingVAEDecoder
from engine.noise import NoiseSource, standard_normal
from engine.outputs import ModelInfo
from engine.params import GenerationRequest
from engine.sequence import Sequence

T = TypeVar("T")

# The reference decodes continuation output together with up to 3 trailing prompt patches
# (`streaming_prefix_len - 1`); priming the streaming decoder with them reproduces that audio.
DECODE_CONTEXT_PATCHES = 3


@dataclass(slots=True)
class StepGraphs:
    """The runner's CUDA graphs: the step's pieces per batch bucket, the backbone of small text-only admissions
    per (token, sequence) bucket (None when prefill_graph_tokens is 0)."""

    buckets: list[int]
    decode_head: GraphSet[int, None]
    prefill_head: GraphSet[int, None]
    euler: GraphSet[int, None]
    finish: GraphSet[int, torch.Tensor]
    backbone: GraphSet[tuple[int, int], tuple[torch.Tensor, ...]] | None
    backbone_buckets: PrefillBuckets | None

    def bucket(self, rows: int) -> int:
        bucket = smallest_fit(self.buckets, rows)
        assert bucket is not None, f"{rows} rows exceed the largest graph bucket {self.buckets[-1]}"
        return bucket

    def replay(self, graphs: GraphSet[int, T], rows: int) -> T:
        """A piece over the first `rows` rows of its static inputs: the graph of the smallest bucket holding them
        (the head left the padded rows inert)."""
        return graphs.run(self.bucket(rows))


def most_steps_first(seqs: list[Sequence]) -> list[Sequence]:
    """Rows in the order the solver wants them: Euler-step count descending (stable, so usually unchanged)."""
    return sorted(seqs, key=lambda seq: -seq.params.inference_timesteps)


def load(config: EngineConfig, directory: Path, noise: NoiseSource = standard_normal) -> VoxCPMRunner:
    """The family's loader (engine/models/registry.py)."""
    return VoxCPMRunner(config, noise, directory)


class VoxCPMRunner:
    """The VoxCPM family's ModelRunner (engine/models/family.py); `Sequence.prompt` is a HostPrompt."""

    def __init__(
        self, config: EngineConfig, noise: NoiseSource = standard_normal, directory: Path | None = None
    ) -> None:
        """`directory`: the resolved checkpoint of `config.model` (None: resolve it here)."""
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.noise = noise
        checkpoint: LoadedVoxCPM = load_voxcpm(
            directory or config.model, self.device, self.dtype, config.attention_backend
        )
        self.checkpoint = checkpoint
        self.model = checkpoint.model
        self.vae = checkpoint.vae
        self.patch_size = checkpoint.config.patch_size
        self.feat_dim = checkpoint.config.feat_dim
        # Before LoRA, whose linears keep the FP8 weight they wrap.
        if config.fp8_gemms:
            self.model.feat_decoder.estimator.use_fp8()
        if config.fp8_backbone:
            for stack in (self.model.base_lm, self.model.residual_lm, self.model.feat_encoder.encoder):
                stack.use_fp8(min_rows=config.fp8_backbone_min_rows or None)
        # The LoRA slots (fixed size) before the KV pool, which takes a share of the memory left after them.
        self.lora: LoRAPool | None = None
        if config.max_loras:
            limits = LoRALimits(config.max_loras, config.max_lora_rank, config.lora_modules)
            self.lora = attach_lora(self.model, limits)

        self.block_size = config.kv_block_size
        self.max_blocks_per_seq = -(-config.max_model_len // self.block_size)
        self.num_kv_blocks = kv_pool_blocks(
            config, self.device, self.model.kv_cache_bytes_per_token() * self.block_size
        )
        # One block more than the scheduler hands out: the scratch block that padded graph rows write into.
        self.scratch_block = self.num_kv_blocks
        self.model.allocate_kv_cache(self.num_kv_blocks + 1, self.block_size)

        # Slot max_num_seqs is the scratch slot: padded graph rows read and write its state, never a request's.
        self.max_num_seqs = config.max_num_seqs
        self.scratch_slot = config.max_num_seqs
        num_slots = config.max_num_seqs + 1
        # The decoder runs in fp16 on CUDA (0.3 % rel. RMS from fp32, ~1.6x faster at batch) and fp32 on the CPU;
        # the encoder (prompt audio, once per request) stays fp32. float64 is for tests.
        self.vae_dtype = {torch.float64: torch.float64}.get(
            self.dtype, torch.float16 if self.device.type == "cuda" else torch.float32
        )
        self.encoder_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        self.vae.encoder.to(self.encoder_dtype)
        self.vae.decoder.to(self.vae_dtype)
        self.vae_decoder = StreamingVAEDecoder(self.vae, num_slots, self.device, self.vae_dtype)
        self.slot_patch = torch.zeros(num_slots, self.patch_size, self.feat_dim, device=self.device)
        self.slot_seed = torch.zeros(num_slots, dtype=torch.int64, device=self.device)
        self.slot_step = torch.zeros(num_slots, dtype=torch.int64, device=self.device)
        self.slot_cfg = torch.zeros(num_slots, device=self.device)
        self.slot_temperature = torch.zeros(num_slots, device=self.device)
        self.slot_timesteps = torch.ones(num_slots, dtype=torch.int64, device=self.device)
        self.slot_adapter = torch.zeros(num_slots, dtype=torch.int32, device=self.device)
        # Where a slot's decode position and KV live: position = prompt length + patches generated - 1.
        self.slot_prompt_len = torch.ones(num_slots, dtype=torch.int64, device=self.device)
        self.slot_blocks = torch.full(
            (num_slots, self.max_blocks_per_seq), self.scratch_block, dtype=torch.int32, device=self.device
        )

        # The static buffers of a step part (at most max_num_seqs rows): the solver state with its rows' slots,
        # stop flags and the Euler iteration counter (see `_start`), and the prefill head's inputs with their pad
        # values (the scratch slot, zero hiddens).
        rows = config.max_num_seqs
        self.flow = self.model.flow_buffers(rows)
        self.flow_slots = torch.full((rows,), self.scratch_slot, dtype=torch.int64, device=self.device)
        self.flow_stop = torch.zeros(rows, dtype=torch.bool, device=self.device)
        self.flow_k = torch.zeros((), dtype=torch.int64, device=self.device)
        model = self.model
        self._head_inputs: list[tuple[torch.Tensor, float]] = [
            (torch.full((rows,), self.scratch_slot, dtype=torch.int64, device=self.device), self.scratch_slot),
            (torch.zeros(rows, model.lm_to_dit_proj.in_features, dtype=self.dtype, device=self.device), 0.0),
            (torch.zeros(rows, model.res_to_dit_proj.in_features, dtype=self.dtype, device=self.device), 0.0),
            (torch.zeros(rows, self.patch_size, self.feat_dim, dtype=self.dtype, device=self.device), 0.0),
        ]
        # The hiddens a request prefilled ahead of its first step (prefill_ahead) starts its solver from, by slot.
        self.slot_head = [
            torch.zeros(num_slots, *static.shape[1:], dtype=static.dtype, device=self.device)
            for static, _ in self._head_inputs[1:]
        ]
        self.packed_width = self.patch_size * self.feat_dim + self.patch_size * self.vae.decode_chunk_size + 1

        self.info = ModelInfo(
            name=Path(config.model.rstrip("/")).name,
            family="voxcpm",
            architecture=checkpoint.config.architecture,
            sample_rate=self.vae.out_sample_rate,
            encoder_sample_rate=self.vae.sample_rate,
            patch_size=self.patch_size,
            feat_dim=self.feat_dim,
            samples_per_patch=self.patch_size * self.vae.decode_chunk_size,
            voice_roles=("prompt", "reference", "both") if checkpoint.config.is_v2 else ("prompt",),
            continuation=True,
            audio_encoder_id=f"{checkpoint.config.architecture}-vae-{checkpoint.vae_sha256[:16]}",
            max_loras=config.max_loras,
            max_lora_rank=config.max_lora_rank if config.max_loras else 0,
        )
        # Eager prefills pad their positions to engine.cuda_graphs' ladder where cuBLAS runs them (see there), up to
        # the longest admission: a step's budget (an idle engine's is the larger), or one prompt alone.
        self.pad_eager_prefill = self.device.type == "cuda"
        self.eager_max_tokens = max(config.idle_prefill_budget, config.max_model_len)
        # A pass prefilled ahead (EngineCore.prefill_ahead): graphed as one key of its own (PrefillBuckets.ahead).
        self.ahead_chunk = config.prefill_ahead_chunk if config.prefill_ahead_tokens else None
        self.graphs: StepGraphs | None = None
        if self.device.type == "cuda" and not config.enforce_eager:
            self.graphs = self._capture_graphs(config.max_num_seqs, config.prefill_graph_tokens)

    def _capture_graphs(self, max_rows: int, prefill_graph_tokens: int) -> StepGraphs:
        """Every graph, at start (capturing mid-serve would stall that step). Inert inputs for the warm-ups and
        captures: the scratch slot everywhere, so they touch scratch state only."""
        device, pool = self.device, torch.cuda.graph_pool_handle()
        buckets = bucket_sizes(max_rows)
        # The decode head's input: the slot list, staged through pinned memory in one host->device copy.
        self._decode_slots = torch.full((max_rows,), self.scratch_slot, dtype=torch.int64, device=device)
        self._decode_staging = torch.empty(max_rows, dtype=torch.int64, pin_memory=device.type == "cuda")

        def pad_decode(bucket: int) -> None:
            self._decode_slots[:bucket].fill_(self.scratch_slot)

        def pad_head(bucket: int) -> None:
            for static, pad in self._head_inputs:
                static[:bucket].fill_(pad)

        def pad_finish(bucket: int) -> None:
            self.flow_slots[:bucket].fill_(self.scratch_slot)

        backbone, backbone_buckets = None, None
        if prefill_graph_tokens:
            backbone_buckets = PrefillBuckets.up_to(prefill_graph_tokens, max_rows, self.ahead_chunk)
            # One packed buffer for every key (one graph replays at a time) and the prompt latents, which stay zero
            # (text only).
            keys = backbone_buckets.keys()
            size = max(self._packed_size(tokens, rows) for tokens, rows in keys)
            self._prefill_static = torch.zeros(size, dtype=torch.int64, device=device)
            self._prefill_static_feats = torch.zeros(
                max(tokens for tokens, _ in keys), self.patch_size, self.feat_dim, device=device
            )
            backbone = GraphSet(
                lambda key: self._prefill_backbone_body(*key),
                backbone_buckets.keys(),
                device,
                pool,
                lambda key: self._prepare_prefill_graph(*key),
            )
        graphs = StepGraphs(
            buckets=buckets,
            decode_head=GraphSet(
                lambda b: self._decode_head(self._decode_slots[:b]), buckets, device, pool, pad_decode
            ),
            prefill_head=GraphSet(
                lambda b: self._start(*(static[:b] for static, _ in self._head_inputs)), buckets, device, pool, pad_head
            ),
            euler=GraphSet(self._euler, buckets, device, pool),
            finish=GraphSet(self._finish, buckets, device, pool, pad_finish),
            backbone=backbone,
            backbone_buckets=backbone_buckets,
        )
        with torch.inference_mode():
            self.model.feat_decoder.schedule_tables(self.dtype, device)  # built outside any capture
            for graph_set in (graphs.decode_head, graphs.finish, graphs.euler, graphs.prefill_head, backbone):
                if graph_set is not None:
                    graph_set.capture_all()
        return graphs

    def _prefill_backbone_body(
        self, tokens: int, rows: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        packed = self._prefill_static[: self._packed_size(tokens, rows)]
        feats = self._prefill_static_feats[:tokens]
        # Bounds, not lengths: padded positions are discarded, and no sequence holds more queries or keys than
        # max_model_len (rounded up to blocks), the width of a block table (the torch backend pads every sequence's
        # queries to the bound).
        bound = min(tokens, self.max_blocks_per_seq * self.block_size)
        inputs, slots = self._unpack_prefill(packed, feats, tokens, rows, bound, bound, text_only=True)
        return (slots, *self.model.backbone(inputs))

    def _prepare_prefill_graph(self, tokens: int, rows: int) -> None:
        packed = self._pack_prefill([], tokens, rows)
        self._prefill_static[: packed.size].copy_(torch.from_numpy(packed))

    # host -> device

    def _host(self, array: np.ndarray) -> torch.Tensor:
        """`array` as a tensor that copies to the device asynchronously (pinned, on CUDA)."""
        tensor = torch.from_numpy(array)
        return tensor.pin_memory() if self.device.type == "cuda" else tensor

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        return self._host(array).to(self.device, non_blocking=True)

    def _admit(self, seqs: list[Sequence]) -> None:
        """Initialise the slot state of newly admitted requests (their prefill step)."""
        params = np.array([[seq.seed, seq.params.inference_timesteps, seq.num_prompt] for seq in seqs], dtype=np.int64)
        floats = np.array([[seq.params.cfg_value, seq.params.temperature] for seq in seqs], dtype=np.float32)
        blocks = np.full((len(seqs), self.max_blocks_per_seq), self.scratch_block, dtype=np.int32)
        for row, seq in enumerate(seqs):
            blocks[row, : len(seq.block_table)] = seq.block_table
        slots = self._to_device(np.array([seq.slot for seq in seqs], dtype=np.int64))
        params_d, floats_d = self._to_device(params), self._to_device(floats)
        self.slot_seed[slots] = params_d[:, 0]
        self.slot_timesteps[slots] = params_d[:, 1]
        self.slot_prompt_len[slots] = params_d[:, 2]
        self.slot_step[slots] = 0
        self.slot_cfg[slots] = floats_d[:, 0]
        self.slot_temperature[slots] = floats_d[:, 1]
        if self.lora is not None:
            self.slot_adapter[slots] = self._to_device(np.array([seq.lora_slot for seq in seqs], dtype=np.int32))
        self.slot_blocks[slots] = self._to_device(blocks)
        self.vae_decoder.reset(slots)
        # Prime in groups of equal context length: admissions are rare, so this loop is short.
        contexts: dict[int, list[tuple[int, np.ndarray]]] = {}
        for seq in seqs:
            context = seq.prompt.decode_context(DECODE_CONTEXT_PATCHES)
            if context is not None:
                contexts.setdefault(len(context), []).append((seq.slot, context))
        for group in contexts.values():
            group_slots = self._to_device(np.array([slot for slot, _ in group], dtype=np.int64))
            latents = self._to_device(np.stack([context for _, context in group]))  # [G, n, P, D]
            with native_convs():
                self.vae_decoder.prime(group_slots, latents.flatten(1, 2).transpose(1, 2))  # [G, D, n * P]

    def _slot_settings(self, slots: torch.Tensor) -> dict[str, torch.Tensor]:
        steps = self.slot_step[slots]
        settings = dict(
            cfg_value=self.slot_cfg[slots],
            temperature=self.slot_temperature[slots],
            timesteps=self.slot_timesteps[slots],
            noise=self.noise(self.slot_seed[slots], steps, (self.feat_dim, self.patch_size)),
        )
        if self.lora is not None:
            settings["adapter"] = self.slot_adapter[slots]
        return settings

    # the step's pieces (each a graph body: fixed shapes per row count, no host sync)

    def _start(self, slots: torch.Tensor, lm_h: torch.Tensor, res_h: torch.Tensor, cond: torch.Tensor) -> None:
        """Every head's end: the solver's start of B rows (slots int64 [B], `model.backbone`'s hiddens) into rows
        [:B] of the static solver state, their slots and stop flags; the Euler iteration counter back to 2 (step 1
        is a zero-velocity step for every row, see cfm.py)."""
        rows = slots.shape[0]
        state, stop = self.model.start(lm_h, res_h, cond, **self._slot_settings(slots))
        self.flow.rows(rows).copy_(state)
        self.flow_slots[:rows].copy_(slots)
        self.flow_stop[:rows].copy_(stop)
        self.flow_k.fill_(2)

    def _decode_head(self, slots: torch.Tensor) -> None:
        """The decode head of the streams in `slots` (int64 [B] on the device): the one-position backbone, then the
        solver's start. Everything comes from slot state, so the whole head is captured."""
        self._start(slots, *self.model.backbone(self._decode_inputs(slots)))

    def _euler(self, rows: int) -> None:
        """One Euler iteration over the first `rows` rows of the solver state; the counter moves on."""
        self.model.feat_decoder.step(self.flow.rows(rows), self.flow_k)
        self.flow_k += 1

    def _finish(self, rows: int) -> torch.Tensor:
        """Feed the first `rows` rows' patches back into their slots and decode them to audio: packed
        [rows, latents | samples | stop] float32."""
        slots = self.flow_slots[:rows]
        patches = self.flow.x[:rows].float()  # [B, P, D]
        self.slot_patch[slots] = patches
        self.slot_step[slots] += 1
        samples = self.vae_decoder.decode(slots, patches.transpose(1, 2))  # [B, D, P] -> [B, P * hop]
        self.slot_step[self.scratch_slot :].zero_()  # keeps padded rows at position 0 of the scratch block
        return torch.cat([patches.flatten(1), samples, self.flow_stop[:rows].float().unsqueeze(1)], dim=1)

    def _decode_inputs(self, slots: torch.Tensor) -> BackboneInputs:
        """The backbone's inputs of a decode step (one position per stream), derived on the device from slot
        state. The torch attention kernels gather the whole block table (a graph cannot know the longest
        sequence); flash-attn reads only seq_lens."""
        batch = slots.shape[0]
        steps = self.slot_step[slots]
        positions = self.slot_prompt_len[slots] + steps - 1
        blocks = self.slot_blocks[slots]  # int32 [B, max_blocks]
        block_of = blocks.gather(1, (positions // self.block_size).unsqueeze(1)).squeeze(1)
        offsets = torch.arange(batch + 1, device=self.device)
        return BackboneInputs(
            token_ids=torch.zeros(batch, dtype=torch.int64, device=self.device),
            feats=self.slot_patch[slots].to(self.dtype),
            audio_mask=torch.ones(batch, dtype=torch.bool, device=self.device),
            positions=positions,
            last_index=offsets[:batch],
            attn=AttentionMetadata(
                cu_seqlens_q=offsets.int(),
                seq_lens=(positions + 1).int(),
                max_seqlen_q=1,
                max_seqlen_k=self.max_blocks_per_seq * self.block_size,
                slot_mapping=block_of.long() * self.block_size + positions % self.block_size,
                block_tables=blocks,
                decode_only=True,
            ),
            text_only=False,
            adapter=None if self.lora is None else self.slot_adapter[slots],
        )

    def make_prompt(self, request: GenerationRequest) -> HostPrompt:
        checkpoint = self.checkpoint
        return build_prompt(request.text, request.prompt, checkpoint.tokenizer, checkpoint.config)

    # one step

    @torch.inference_mode()
    def run(self, batch: list[Sequence], while_running: Callable[[], None]) -> StepResult:
        """One step: the running streams decode, the admitted requests prefill, each part through head, Euler
        iterations and finish (graphed when there are graphs); one device->host copy per part, one wait, with
        `while_running` called before it."""
        decodes = most_steps_first([seq for seq in batch if not seq.is_prefill])
        prefills = most_steps_first([seq for seq in batch if seq.is_prefill])
        seqs = decodes + prefills
        cuda = self.device.type == "cuda"
        # A fresh pinned buffer (the host allocator caches them): the chunks handed out keep views of it.
        host = torch.empty((len(seqs), self.packed_width), pin_memory=cuda)
        if decodes:
            self._decode(decodes)
            self._solve(decodes, host[: len(decodes)])
        if prefills:
            fresh = [seq for seq in prefills if not seq.prefilled_ahead]
            if fresh:
                self._admit(fresh)
            if len(fresh) == len(prefills):
                self._prefill(prefills)
            else:
                if fresh:
                    self._keep_head_inputs(len(fresh), self._backbone(fresh))
                slots = self._to_device(np.array([seq.slot for seq in prefills], dtype=np.int64))
                self._prefill_head(len(prefills), (slots, *(kept[slots] for kept in self.slot_head)))
            self._solve(prefills, host[len(decodes) :])
        while_running()
        if cuda:
            torch.cuda.current_stream(self.device).synchronize()
        host_np = host.numpy()
        latent_size = self.patch_size * self.feat_dim
        return StepResult(
            seqs=seqs,
            latents=host_np[:, :latent_size].reshape(len(seqs), self.patch_size, self.feat_dim),
            samples=host_np[:, latent_size:-1],
            stops=(host_np[:, -1] > 0.5).tolist(),
        )

    def _decode(self, seqs: list[Sequence]) -> None:
        """The decode head of the running streams `seqs`."""
        slots = np.array([seq.slot for seq in seqs], dtype=np.int64)
        graphs = self.graphs
        if graphs is None:
            self._decode_head(self._to_device(slots))
            return
        rows, bucket = len(slots), graphs.bucket(len(slots))

        def fill() -> None:
            # One host->device copy; the host waits for every step's result before preparing the next, so the
            # staging buffer is free to reuse.
            staging = self._decode_staging.numpy()
            staging[:rows] = slots
            staging[rows:bucket] = self.scratch_slot
            self._decode_slots[:bucket].copy_(self._decode_staging[:bucket], non_blocking=True)

        graphs.decode_head.run(bucket, fill)

    def _prefill(self, seqs: list[Sequence]) -> None:
        """The prefill head of newly admitted requests: the backbone over their prompts, then the solver's start."""
        self._prefill_head(len(seqs), self._backbone(seqs))

    @torch.inference_mode()
    def prefill_ahead(self, seqs: list[Sequence]) -> None:
        """engine.models.family.PrefillsAhead: the backbone over the prompts of `seqs`, admitted while their burst
        still arrives; their hiddens wait in `slot_head` for the step that starts their solvers."""
        self._admit(seqs)
        self._keep_head_inputs(len(seqs), self._backbone(seqs, ahead=True))

    def _keep_head_inputs(self, rows: int, outputs: tuple[torch.Tensor, ...]) -> None:
        """A backbone's outputs (slots, then the prefill head's hiddens; their first `rows` rows are real) into
        `slot_head`."""
        slots, *hiddens = (value[:rows] for value in outputs)
        for kept, value in zip(self.slot_head, hiddens, strict=True):
            kept[slots] = value

    def _backbone(self, seqs: list[Sequence], ahead: bool = False) -> tuple[torch.Tensor, ...]:
        """The backbone over the prompts of newly admitted requests (graphed for small text-only admissions and
        text-only passes `ahead`, else eager): their slots and the prefill head's hiddens, row i for seqs[i] (padded
        rows beyond)."""
        graphs = self.graphs
        key = None
        buckets = graphs.backbone_buckets if graphs is not None else None
        if buckets is not None and not any(seq.prompt.audio_mask.any() for seq in seqs):
            key = buckets.key_for(sum(seq.num_prompt for seq in seqs), len(seqs), ahead)
        if key is None:
            inputs, slots = self._prefill_inputs(seqs)
            return (slots, *self.model.backbone(inputs))
        assert graphs is not None and graphs.backbone is not None
        packed = self._host(self._pack_prefill(seqs, *key))

        def fill_backbone() -> None:
            self._prefill_static[: packed.numel()].copy_(packed, non_blocking=True)

        return graphs.backbone.run(key, fill_backbone)

    def _prefill_head(self, rows: int, outputs: tuple[torch.Tensor, ...]) -> None:
        """The solver's start from an admission's backbone outputs (slots, lm_h, res_h, cond; their first `rows`
        rows are the admission's): graphed, through the prefill head's static inputs, padded to the bucket."""
        graphs = self.graphs
        if graphs is None:
            self._start(*(value[:rows] for value in outputs))
            return
        bucket = graphs.bucket(rows)

        def fill() -> None:
            # Device-to-device copies into the static inputs (the hiddens never leave the device).
            for (static, pad), value in zip(self._head_inputs, outputs, strict=True):
                static[:rows].copy_(value[:rows])
                static[rows:bucket].fill_(pad)

        graphs.prefill_head.run(bucket, fill)

    def _solve(self, seqs: list[Sequence], out: torch.Tensor) -> None:
        """After a head over `seqs` (most Euler steps first): the Euler iterations, iteration k over the rows that
        still have steps (a prefix), then finish, whose packed rows are copied into `out` (host) at once."""
        graphs = self.graphs
        euler: Callable[[int], object] = self._euler
        finish: Callable[[int], torch.Tensor] = self._finish
        if graphs is not None:  # the same bodies, replayed over the smallest bucket holding the rows
            euler = functools.partial(graphs.replay, graphs.euler)
            finish = functools.partial(graphs.replay, graphs.finish)
        steps = [seq.params.inference_timesteps for seq in seqs]
        active = len(seqs)
        for k in range(2, steps[0] + 1):
            while steps[active - 1] < k:
                active -= 1
            euler(active)
        out.copy_(finish(len(seqs))[: len(seqs)], non_blocking=True)

    def _packed_size(self, tokens: int, rows: int) -> int:
        return 4 * tokens + 4 * rows + 1 + rows * self.max_blocks_per_seq

    def _pack_prefill(self, seqs: list[Sequence], tokens: int, rows: int) -> np.ndarray:
        """Every integer the backbone reads for the prompts of `seqs`, packed for one host->device copy (see
        `_unpack_prefill`), padded to `tokens` positions and `rows` sequences. Padding is inert: padded
        positions write K/V into the scratch block, padded sequences are empty, with the scratch slot."""
        num_new = np.zeros(rows, dtype=np.int64)
        num_new[: len(seqs)] = [seq.num_prompt for seq in seqs]
        cu_seqlens = np.zeros(rows + 1, dtype=np.int64)
        np.cumsum(num_new, out=cu_seqlens[1:])
        n = int(cu_seqlens[-1])
        token_ids, audio_mask, positions = (np.zeros(tokens, dtype=np.int64) for _ in range(3))
        block_tables = np.full((rows, self.max_blocks_per_seq), self.scratch_block, dtype=np.int64)
        slots = np.full(rows, self.scratch_slot, dtype=np.int64)
        slot_mapping = self.scratch_block * self.block_size + np.arange(tokens) % self.block_size
        if seqs:
            token_ids[:n] = np.concatenate([seq.prompt.token_ids for seq in seqs])
            audio_mask[:n] = np.concatenate([seq.prompt.audio_mask for seq in seqs])
            positions[:n] = np.concatenate([np.arange(seq.num_prompt) for seq in seqs])
            for row, seq in enumerate(seqs):
                block_tables[row, : len(seq.block_table)] = seq.block_table
                slots[row] = seq.slot
            seq_index = np.repeat(np.arange(rows), num_new)
            slot_mapping[:n] = block_tables[seq_index, positions[:n] // self.block_size] * self.block_size
            slot_mapping[:n] += positions[:n] % self.block_size
        last_index = np.maximum(cu_seqlens[1:] - 1, 0)
        return np.concatenate(
            [
                token_ids,
                audio_mask,
                positions,
                slot_mapping,
                cu_seqlens,
                num_new,
                last_index,
                slots,
                block_tables.ravel(),
            ]
        )

    def _unpack_prefill(
        self,
        packed: torch.Tensor,
        feats: torch.Tensor,
        tokens: int,
        rows: int,
        max_seqlen_q: int,
        max_seqlen_k: int,
        text_only: bool,
    ) -> tuple[BackboneInputs, torch.Tensor]:
        """`_pack_prefill`'s layout as device views: the backbone's inputs and the slots (int64 [rows])."""
        n, b = tokens, rows
        token_ids, audio_mask, positions, slot_mapping = packed[: 4 * n].view(4, n)
        cu_seqlens = packed[4 * n : 4 * n + b + 1]
        seq_lens, last_index, slots = packed[4 * n + b + 1 : 4 * n + 4 * b + 1].view(3, b)
        block_tables = packed[4 * n + 4 * b + 1 :].view(b, self.max_blocks_per_seq)
        adapter = None
        if self.lora is not None:  # each position's sequence (padded positions: the last, padded, sequence)
            seq_of = torch.searchsorted(cu_seqlens[1:], torch.arange(n, device=packed.device), right=True)
            adapter = self.slot_adapter[slots[seq_of.clamp_(max=b - 1)]]
        inputs = BackboneInputs(
            token_ids=token_ids,
            feats=feats.to(self.dtype),
            audio_mask=audio_mask.bool(),
            positions=positions,
            last_index=last_index,
            attn=AttentionMetadata(
                cu_seqlens_q=cu_seqlens.int(),
                seq_lens=seq_lens.int(),
                max_seqlen_q=max_seqlen_q,
                max_seqlen_k=max_seqlen_k,
                slot_mapping=slot_mapping,
                block_tables=block_tables.int(),
                decode_only=False,
                context_free=True,  # an admission prefills whole prompts from position 0
            ),
            text_only=text_only,
            adapter=adapter,
        )
        return inputs, slots

    def _prefill_inputs(self, seqs: list[Sequence]) -> tuple[BackboneInputs, torch.Tensor]:
        """The backbone's inputs over the prompts of newly admitted requests (positions padded to the eager ladder
        where `pad_eager_prefill`), and their slots."""
        tokens = n = sum(seq.num_prompt for seq in seqs)
        if self.pad_eager_prefill:
            tokens = eager_tokens(n)
        packed = self._to_device(self._pack_prefill(seqs, tokens, len(seqs)))
        text_only = not any(seq.prompt.audio_mask.any() for seq in seqs)
        if text_only:  # the backbone reads no latents then but the last positions' (zero): none to pack and copy
            feats = torch.zeros(tokens, self.patch_size, self.feat_dim, dtype=self.dtype, device=self.device)
        else:
            padding = np.zeros((tokens - n, self.patch_size, self.feat_dim), dtype=np.float32)
            feats = self._to_device(np.concatenate([*(seq.prompt.feats for seq in seqs), padding]))
        max_seqlen = max(seq.num_prompt for seq in seqs)
        return self._unpack_prefill(packed, feats, tokens, len(seqs), max_seqlen, max_seqlen, text_only)

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Where eager prefills are padded: one backbone pass over the scratch slot at every size of the ladder,
        text only, so that cuBLAS has chosen every GEMM of an eager admission before the first request; and the
        pinned result buffers of every batch bucket (engine.cuda_graphs.cache_pinned_rows)."""
        if not self.pad_eager_prefill:
            return
        sizes = eager_token_ladder(self.eager_max_tokens)
        feats = torch.zeros(sizes[-1], self.patch_size, self.feat_dim, dtype=self.dtype, device=self.device)
        for tokens in sizes:
            packed = self._to_device(self._pack_prefill([], tokens, 1))
            max_k = min(tokens, self.max_blocks_per_seq * self.block_size)  # bounds, as in the backbone's graphs
            inputs, _ = self._unpack_prefill(packed, feats[:tokens], tokens, 1, tokens, max_k, text_only=True)
            self.model.backbone(inputs)
        if self.device.type == "cuda":
            cache_pinned_rows(self.max_num_seqs, self.packed_width)
            torch.cuda.current_stream(self.device).synchronize()

    @torch.inference_mode()
    def encode_audio(self, wav: np.ndarray, padding: str) -> np.ndarray:
        """float32 mono wav at the encoder rate -> latent patches [n, P, D].

        Padded to whole patches as the reference `_encode_wav`: on the left for continuation prompts (the
        audio must end where the generation starts), on the right for reference audio.
        """
        if padding not in ("left", "right"):
            raise ValueError(f"padding must be 'left' or 'right', got {padding!r}")
        wav = np.asarray(wav, dtype=np.float32)
        if wav.ndim != 1 or wav.size == 0:
            raise ValueError(f"wav must be a non-empty 1-D array, got shape {wav.shape}")
        pad = -wav.size % (self.patch_size * self.vae.chunk_size)
        wav = np.pad(wav, (pad, 0) if padding == "left" else (0, pad))
        with native_convs():
            latents = self.vae.encode(self._to_device(wav).view(1, 1, -1).to(self.encoder_dtype))  # [1, D, frames]
        patches = latents[0].float().view(self.feat_dim, -1, self.patch_size).permute(1, 2, 0)
        return patches.cpu().numpy()
