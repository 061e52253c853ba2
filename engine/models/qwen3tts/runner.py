"""The Qwen3-TTS family's ModelRunner (engine/models/family.py): one engine step = one 12.5 Hz frame per row.

A row producing frame k in a step (k = `Sequence.num_generated`):
1. prefill rows (k = 0) run their prompt through the paged talker and sample frame 0's codebook 0; the others
   read the talker hidden and codebook 0 that the previous step left in their slot;
2. the code predictor completes every row's frame (codebooks 1..15, all rows batched);
3. the streaming codec decoder turns the frames into 1920 samples per row (per-slot causal state);
4. look-ahead: each frame is fed back (its summed embeddings + the row's next text row) through the talker, and
   codebook 0 of frame k + 1 is sampled now, so a row whose next codebook 0 is EOS reports stop with its last real
   frame and no EOS frame is ever decoded. A row at its last allowed frame has no KV reserved for that position:
   its look-ahead writes K/V into the scratch block and its results are never read (the request ends).
One host sync per step: the frames, audio and stop flags come back together in one packed row per request.

Steps 2-4 are one body (`_frame`) over fixed shapes that reads everything from per-slot device state and a small
int64 input [B, 3] (slot, frame, look-ahead flag). On CUDA it is captured as one CUDA graph per batch bucket
(engine/cuda_graphs.py): the 15 predictor passes with their sampling, the codec decoder and the talker's decode
position replay as one launch. The rows of a step pad to the smallest bucket with the scratch slot (frame 0, no
look-ahead: its K/V go to the scratch block), so padded rows touch scratch state only. Under
`EngineConfig.enforce_eager` and on the CPU the same body runs eagerly over the step's own rows.

Admission (step 1's prefill rows, at low load most of the time to first audio): the slot state goes over in two
host->device copies, the prompts are embedded on the device without a host sync, then the talker over the packed
prompts and frame 0's codebook 0 (`_prefill_body`) replay from a graph per (token, sequence) bucket up to
`EngineConfig.prefill_graph_tokens` positions and 8 sequences: one launch instead of ~1,000 eager kernels. The
prompts pad to the bucket as the frame's rows do (padded positions and sequences write the scratch block and
slot). Larger admissions, enforce_eager and the CPU run the body eagerly over the prompts alone. An ICL clone's
decoder priming (its reference codes through the codec decoder) stays eager, with native convolutions.

Sampling: the checkpoint's generation_config (temperature 0.9, top-k 50, top-p 1, repetition penalty 1.05, the
same for the predictor); `GenerationParams.temperature` other than 1.0 replaces both temperatures, 0 is greedy.
Draws use counter noise keyed by (seed, frame * 16 + codebook), so a request's codes do not depend on its batch,
equal `OfflineGenerator`'s, and a graph replay draws what the eager body draws. EOS may end a request from frame
max(2, min_patches + 2) on: the reference's two-frame minimum, and never a stop the scheduler would ignore (it
applies `min_patches`).

Per-slot device state (slot `max_num_seqs` is scratch), written at admission: the talker hidden and codebook 0 of
the next frame, the codebook-0 history (repetition penalty), seed, both sampling settings, the first frame EOS may
end, the KV block table and prompt length, the trailing text ids, the codec decoder's causal state.

Voices (Base checkpoints): `encode_audio(wav, "right")` is the x-vector (speaker encoder; as [H/16, 1, 16]
float32), `encode_audio(wav, "left")` the ICL reference codes ([frames, 1, 16] float32). A request clones with
`reference_latents` = x-vector alone (x-vector-only mode) or with both plus `Prompt.text` = the reference
transcript (ICL): voice roles "reference" and "both".
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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
from engine.lora.pool import LoRAPool
from engine.models.family import StepResult
from engine.models.qwen3tts.checkpoint import load_qwen3tts
from engine.models.qwen3tts.config import SAMPLE_RATE, SAMPLES_PER_FRAME
from engine.models.qwen3tts.generate import CODEBOOKS
from engine.models.qwen3tts.prompt import ClonePrompt, PromptError, Qwen3Prompt, VoiceRequest, build_prompt
from engine.models.qwen3tts.sampling import (
    MIN_NEW_TOKENS,
    RowSampling,
    SamplingParams,
    choose,
    codebook0_mask,
    process_codebook0,
)
from engine.noise import uniform
from engine.outputs import ModelInfo
from engine.params import GenerationParams, GenerationRequest
from engine.sequence import Sequence

DEFAULT_SPEAKER = "vivian"


@dataclass(slots=True)
class StepGraphs:
    """The runner's CUDA graphs: the frame body (`Qwen3Runner._frame`) per batch bucket, and the admission's
    talker prefill with frame 0's codebook 0 (`Qwen3Runner._prefill_body`) per (token, sequence) bucket (None
    when prefill_graph_tokens is 0)."""

    buckets: list[int]
    frame: GraphSet[int, torch.Tensor]
    prefill: GraphSet[tuple[int, int], None] | None
    prefill_buckets: PrefillBuckets | None

    def bucket(self, rows: int) -> int:
        bucket = smallest_fit(self.buckets, rows)
        assert bucket is not None, f"{rows} rows exceed the largest graph bucket {self.buckets[-1]}"
        return bucket


@dataclass(frozen=True, slots=True)
class HostPrompt:
    """What `make_prompt` hands the core (engine/sequence.py FamilyPrompt) and `run` reads at prefill."""

    prompt: Qwen3Prompt
    frame_cap: int  # the checkpoint's max_new_tokens - 1 (its last codebook 0 never gets a frame)

    @property
    def num_positions(self) -> int:
        return len(self.prompt)

    @property
    def patch_cap(self) -> int:
        return self.frame_cap


def load(config: EngineConfig, directory: Path) -> Qwen3Runner:
    """The family's loader (engine/models/registry.py)."""
    return Qwen3Runner(config, directory)


def _sampling(params: GenerationParams, defaults: SamplingParams) -> SamplingParams:
    if params.temperature == 0.0:
        return SamplingParams(do_sample=False)
    temperature = defaults.temperature if params.temperature == 1.0 else params.temperature
    return SamplingParams(defaults.do_sample, temperature, defaults.top_k, defaults.top_p)


class Qwen3Runner:
    def __init__(self, config: EngineConfig, directory: Path | None = None) -> None:
        if config.fp8_gemms or config.fp8_backbone:
            raise ValueError(
                "fp8_gemms and fp8_backbone are for VoxCPM checkpoints; Qwen3-TTS runs its GEMMs in the model dtype"
            )
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        loaded = load_qwen3tts(directory or config.model, self.device, self.dtype, config.attention_backend)
        self.loaded = loaded
        self.model = loaded.model
        self.config = loaded.config
        self.tokenizer = loaded.tokenizer
        defaults = self.config.sampling
        self.talker_defaults = SamplingParams(defaults.do_sample, defaults.temperature, defaults.top_k, defaults.top_p)
        self.predictor_defaults = SamplingParams(
            defaults.subtalker_dosample,
            defaults.subtalker_temperature,
            defaults.subtalker_top_k,
            defaults.subtalker_top_p,
        )

        if config.max_loras:
            raise ValueError("the Qwen3-TTS family serves no LoRA adapters (max_loras must be 0)")
        self.lora: LoRAPool | None = None  # no adapters for this family (yet)

        self.block_size = config.kv_block_size
        self.max_blocks_per_seq = -(-config.max_model_len // self.block_size)
        self.num_kv_blocks = kv_pool_blocks(
            config, self.device, self.model.kv_cache_bytes_per_token() * self.block_size
        )
        self.scratch_block = self.num_kv_blocks
        self.model.allocate_kv_cache(self.num_kv_blocks + 1, self.block_size)

        # Slot max_num_seqs and KV block num_kv_blocks are scratch: padded graph rows read and write only them.
        self.scratch_slot = config.max_num_seqs
        slots = config.max_num_seqs + 1
        hidden = self.config.talker.stack.hidden_size
        device = self.device
        self.slot_hidden = torch.zeros(slots, hidden, device=device, dtype=self.dtype)
        self.slot_c0 = torch.zeros(slots, dtype=torch.int64, device=device)
        self.slot_history = torch.full((slots, config.max_patches), -1, dtype=torch.int64, device=device)
        self.slot_seed = torch.zeros(slots, dtype=torch.int64, device=device)
        self.slot_penalty = torch.ones(slots, device=device)
        self.slot_eos_from = torch.full((slots,), MIN_NEW_TOKENS, dtype=torch.int64, device=device)
        self.slot_talker = RowSampling.of([self.talker_defaults] * slots, device)
        self.slot_predictor = RowSampling.of([self.predictor_defaults] * slots, device)
        # Where a slot's talker position and KV live: position = prompt length + frame.
        self.slot_prompt_len = torch.zeros(slots, dtype=torch.int64, device=device)
        self.slot_blocks = torch.full(
            (slots, self.max_blocks_per_seq), self.scratch_block, dtype=torch.int32, device=device
        )
        # The text fed with frame k: trailing ids + tts_pad, the last one repeating (index min(k, len - 1)). Frames
        # stop before config.max_patches, so longer text is cut there.
        self.slot_text = torch.full(
            (slots, config.max_patches), self.config.tts_pad_token_id, dtype=torch.int64, device=device
        )
        self.slot_text_len = torch.ones(slots, dtype=torch.int64, device=device)
        self.decoder = loaded.codec_decoder
        self.decoder_state = self.decoder.new_state(slots)
        with torch.no_grad():
            # Every causal context of the decoder exists before a graph captures it (a first call makes them).
            scratch = torch.tensor([self.scratch_slot], device=device)
            state = self.decoder_state.select(scratch)
            self.decoder(torch.zeros(1, 1, CODEBOOKS, dtype=torch.int64, device=device), state)
            self.decoder_state.assign(scratch, state)
        self.suppress = codebook0_mask(self.config.talker.stack.vocab_size, self.config.talker.codec_eos_id, device)
        # A step's packed result row: the frame's 16 codes (exact in float32), its audio, the stop flag.
        self.packed_width = CODEBOOKS + SAMPLES_PER_FRAME + 1

        variant = self.config.variant
        base = variant == "base"
        self.info = ModelInfo(
            name=Path(str(config.model).rstrip("/")).name,
            family="qwen3tts",
            architecture="qwen3tts-" + variant.replace("_", ""),
            sample_rate=SAMPLE_RATE,
            encoder_sample_rate=SAMPLE_RATE if base else 0,
            patch_size=1,
            feat_dim=CODEBOOKS,
            samples_per_patch=SAMPLES_PER_FRAME,
            voice_roles=("reference", "both") if base else (),
            continuation=False,
            speakers=tuple(self.config.speakers),
            instruction=self.config.accepts_instruction,
            languages=tuple(self.config.languages),
            audio_encoder_id=f"qwen3tts-{variant}-{self._encoder_digest()[:16]}" if base else "",
        )
        # The frame body's input rows (slot, frame, look-ahead flag), staged through pinned memory: one copy.
        rows = config.max_num_seqs
        self._step_input = torch.zeros(rows, 3, dtype=torch.int64, device=device)
        self._step_staging = torch.zeros(rows, 3, dtype=torch.int64, pin_memory=device.type == "cuda")
        # Eager prefills pad their positions to engine.cuda_graphs' ladder where cuBLAS runs them (see there), up to
        # the longest admission: a step's budget (an idle engine's is the larger), or one prompt alone.
        self.pad_eager_prefill = device.type == "cuda"
        self.eager_max_tokens = max(config.idle_prefill_budget, config.max_model_len)
        self.max_num_seqs = rows
        self.graphs: StepGraphs | None = None
        if device.type == "cuda" and not config.enforce_eager:
            self.graphs = self._capture_graphs(rows, config.prefill_graph_tokens)

    def _capture_graphs(self, max_rows: int, prefill_graph_tokens: int) -> StepGraphs:
        """The frame body's graph per batch bucket and the prefill's per (token, sequence) bucket, at start.
        Warm-ups and captures run on scratch rows only (the scratch slot, the scratch KV block)."""
        device, pool = self.device, torch.cuda.graph_pool_handle()
        buckets = bucket_sizes(max_rows)
        pad_row = torch.tensor([self.scratch_slot, 0, 0], device=device)

        def pad(bucket: int) -> None:
            self._step_input[:bucket] = pad_row

        frame = GraphSet(lambda b: self._frame(self._step_input[:b]), buckets, device, pool, pad)
        prefill, prefill_buckets = None, None
        if prefill_graph_tokens:
            prefill_buckets = PrefillBuckets.up_to(prefill_graph_tokens, max_rows)
            # Static inputs of every key (one graph replays at a time): the packed integers and the embedded rows.
            size = self._packed_size(prefill_graph_tokens, prefill_buckets.seqs[-1])
            self._prefill_packed = torch.zeros(size, dtype=torch.int64, device=device)
            hidden = self.config.talker.stack.hidden_size
            self._prefill_rows = torch.zeros(prefill_graph_tokens, hidden, device=device, dtype=self.dtype)

            def prepare(key: tuple[int, int]) -> None:
                packed = torch.from_numpy(self._pack_prefill([], *key))
                self._prefill_packed[: packed.numel()].copy_(packed)
                self._prefill_rows.zero_()

            prefill = GraphSet(
                lambda key: self._prefill_graph_body(*key), prefill_buckets.keys(), device, pool, prepare
            )
        graphs = StepGraphs(buckets, frame, prefill, prefill_buckets)
        with torch.inference_mode():
            for graph_set in (frame, prefill):
                if graph_set is not None:
                    graph_set.capture_all()
        return graphs

    def _prefill_graph_body(self, tokens: int, rows: int) -> None:
        packed = self._prefill_packed[: self._packed_size(tokens, rows)]
        # Bounds, not lengths: padded positions may be queries (their rows are discarded), but no sequence holds
        # more keys than max_model_len (rounded up to blocks), the width of a block table.
        max_k = min(tokens, self.max_blocks_per_seq * self.block_size)
        self._prefill_body(packed, self._prefill_rows[:tokens], tokens, rows, tokens, max_k)

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Where eager prefills are padded: the talker over the scratch slot at every size of the ladder, so that
        cuBLAS has chosen every GEMM of an eager admission before the first request; and the pinned result buffers
        of every batch bucket (engine.cuda_graphs.cache_pinned_rows)."""
        if not self.pad_eager_prefill:
            return
        sizes = eager_token_ladder(self.eager_max_tokens)
        x = torch.zeros(sizes[-1], self.config.talker.stack.hidden_size, device=self.device, dtype=self.dtype)
        for tokens in sizes:
            packed = self._to_device(self._pack_prefill([], tokens, 1))
            max_k = min(tokens, self.max_blocks_per_seq * self.block_size)  # bounds, as in `_prefill_graph_body`
            self._prefill_body(packed, x[:tokens], tokens, 1, tokens, max_k)
        if self.device.type == "cuda":
            cache_pinned_rows(self.max_num_seqs, self.packed_width)
            torch.cuda.current_stream(self.device).synchronize()

    def _encoder_digest(self) -> str:
        """Voices are bound to the codec encoder and the speaker encoder: a digest of both's weights."""
        digest = hashlib.sha256()
        for module in (self.loaded.codec_encoder, self.model.speaker_encoder):
            for name, tensor in sorted(module.state_dict().items()):
                digest.update(name.encode())
                digest.update(tensor.detach().float().cpu().numpy().tobytes())
        return digest.hexdigest()

    # -- requests (host only) -----------------------------------------------------------------------------------

    def make_prompt(self, request: GenerationRequest) -> HostPrompt:
        p = request.prompt
        clone = None
        if p.reference_latents is not None or p.latents is not None:
            if self.config.variant != "base":
                raise ValueError(f"a {self.config.variant} checkpoint cannot clone a voice")
            if p.reference_latents is None:
                raise ValueError("voice cloning needs the x-vector (reference_latents), not only reference codes")
            vector = torch.from_numpy(np.ascontiguousarray(p.reference_latents, dtype=np.float32)).reshape(-1)
            if vector.numel() != self.config.talker.stack.hidden_size:
                raise ValueError(f"reference_latents hold {vector.numel()} values, not this model's x-vector")
            codes = None
            if p.latents is not None:
                array = np.asarray(p.latents, dtype=np.float32).reshape(-1, CODEBOOKS)
                if not (np.all(array == np.round(array)) and array.min() >= 0 and array.max() < 2048):
                    raise ValueError("latents are not speech-tokenizer codes")
                codes = torch.from_numpy(array.astype(np.int64))
            clone = ClonePrompt(vector, codes, p.text or None)
        speaker = p.speaker or None
        if speaker is None and self.config.variant == "custom_voice":
            speaker = DEFAULT_SPEAKER if DEFAULT_SPEAKER in self.config.speakers else self.config.speakers[0]
        if p.instruction and not self.config.accepts_instruction:
            raise ValueError(f"this {self.info.architecture} checkpoint takes no instruction")
        voice = VoiceRequest(
            text=request.text, language=p.language or "auto", speaker=speaker, instruction=p.instruction, clone=clone
        )
        try:
            prompt = build_prompt(voice, self.tokenizer, self.config)
        except PromptError as exc:
            raise ValueError(str(exc)) from exc
        return HostPrompt(prompt, self.config.sampling.max_new_tokens - 1)

    def encode_audio(self, wav: np.ndarray, padding: str) -> np.ndarray:
        if self.config.variant != "base":
            raise ValueError(f"a {self.config.variant} checkpoint clones no voices")
        audio = torch.from_numpy(np.ascontiguousarray(wav, dtype=np.float32))
        if audio.ndim != 1 or audio.numel() < SAMPLES_PER_FRAME:
            raise ValueError("expected mono audio of at least one 80 ms frame")
        with torch.inference_mode(), native_convs():  # every clip is a new conv shape
            if padding == "right":
                return self.model.speaker_encoder.embed(audio).float().cpu().numpy().reshape(-1, 1, CODEBOOKS)
            if padding == "left":
                return self.loaded.codec_encoder.encode(audio).cpu().numpy().astype(np.float32)[:, None, :]
        raise ValueError(f"padding must be 'left' or 'right', got {padding!r}")

    # -- one step -----------------------------------------------------------------------------------------------

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(array)
        if self.device.type == "cuda":
            tensor = tensor.pin_memory()
        return tensor.to(self.device, non_blocking=True)

    def _admit(self, seqs: list[Sequence]) -> None:
        """The prefill of newly admitted requests: their slot state (one host->device copy of every integer and
        one of the sampling floats), the clone's decoder priming, then the prompts through the talker and codebook
        0 of frame 0 (`_prefill`). The slot may have served a finished request: everything is written afresh. No
        host sync."""
        n, width, blocks = len(seqs), self.slot_text.shape[1], self.max_blocks_per_seq
        # Per row: slot, seed, prompt length, first EOS frame, text length, 2 + 2 sampling ints, text, block table.
        ints = np.zeros((n, 9 + width + blocks), dtype=np.int64)
        ints[:, 9 : 9 + width] = self.config.tts_pad_token_id
        ints[:, 9 + width :] = self.scratch_block
        floats = np.zeros((n, 4), dtype=np.float32)  # talker's then predictor's temperature, top-p
        talker, predictor = (
            RowSampling.columns([_sampling(s.params, defaults) for s in seqs])
            for defaults in (self.talker_defaults, self.predictor_defaults)
        )
        for row, seq in enumerate(seqs):
            ids = seq.prompt.prompt.trailing_ids.numpy()[:width]
            eos_from = max(MIN_NEW_TOKENS, seq.params.min_patches + 2)
            text_len = min(len(ids) + 1, width)  # the ids, then tts_pad
            ints[row, :5] = (seq.slot, seq.seed, seq.num_prompt, eos_from, text_len)
            ints[row, 5:9] = (*talker[0][row], *predictor[0][row])
            ints[row, 9 : 9 + len(ids)] = ids
            ints[row, 9 + width : 9 + width + len(seq.block_table)] = seq.block_table
            floats[row] = (*talker[1][row], *predictor[1][row])
        ints_d, floats_d = self._to_device(ints), self._to_device(floats)
        slots = ints_d[:, 0]
        self.slot_seed[slots] = ints_d[:, 1]
        self.slot_prompt_len[slots] = ints_d[:, 2]
        self.slot_eos_from[slots] = ints_d[:, 3]
        self.slot_text_len[slots] = ints_d[:, 4]
        self.slot_talker.assign(slots, RowSampling.from_columns(ints_d[:, 5:7], floats_d[:, :2]))
        self.slot_predictor.assign(slots, RowSampling.from_columns(ints_d[:, 7:9], floats_d[:, 2:]))
        self.slot_text[slots] = ints_d[:, 9 : 9 + width]
        self.slot_blocks[slots] = ints_d[:, 9 + width :].int()
        self.slot_history[slots] = -1
        self.slot_penalty[slots] = self.config.sampling.repetition_penalty
        self.decoder_state.reset(slots)
        for row, seq in enumerate(seqs):
            prompt: Qwen3Prompt = seq.prompt.prompt
            if prompt.ref_codes is not None:
                # the reference decodes its output after the clone's codes: they are the decoder's left context
                # (a new conv shape per reference length: no cuDNN plans built mid-step)
                state = self.decoder_state.select(slots[row : row + 1])
                with native_convs():
                    self.decoder(self._to_device(prompt.ref_codes.numpy())[None], state)
                self.decoder_state.assign(slots[row : row + 1], state)
        self._prefill(seqs)

    def _prefill(self, seqs: list[Sequence]) -> None:
        """The talker over the admitted prompts and codebook 0 of frame 0 into their slots: replayed from the
        graph of the smallest (token, sequence) bucket holding them, padded (see `_pack_prefill`), or eager
        (enforce_eager, the CPU, admissions past the buckets) over the prompts, padded to the eager ladder where
        `pad_eager_prefill`."""
        graphs = self.graphs
        tokens = sum(seq.num_prompt for seq in seqs)
        key = None
        if graphs is not None and graphs.prefill_buckets is not None:
            key = graphs.prefill_buckets.key_for(tokens, len(seqs))
        padded_tokens, rows = key or (eager_tokens(tokens) if self.pad_eager_prefill else tokens, len(seqs))
        packed = self._to_device(self._pack_prefill(seqs, padded_tokens, rows))
        x = self.model.embed_prompts([seq.prompt.prompt for seq in seqs], packed[: 2 * padded_tokens].view(2, -1))
        if key is None:
            longest = max(seq.num_prompt for seq in seqs)
            self._prefill_body(packed, x, padded_tokens, rows, longest, longest)
            return
        assert graphs is not None and graphs.prefill is not None

        def fill() -> None:
            # Device-to-device copies into the static inputs.
            self._prefill_packed[: packed.numel()].copy_(packed)
            self._prefill_rows[:padded_tokens].copy_(x)

        graphs.prefill.run(key, fill)

    def _packed_size(self, tokens: int, rows: int) -> int:
        return 4 * tokens + 4 * rows + 1 + rows * self.max_blocks_per_seq

    def _pack_prefill(self, seqs: list[Sequence], tokens: int, rows: int) -> np.ndarray:
        """Every integer an admission's prefill reads, packed for one host->device copy (`_prefill_body` unpacks
        it), padded to `tokens` positions and `rows` sequences: text ids, codec ids, positions, KV slot of each
        position, cu_seqlens, lengths, each sequence's last position, slots, block tables. Padding is inert:
        padded positions (ids -1: zero rows) write K/V into the scratch block, padded sequences are empty and
        write the scratch slot."""
        bs = self.block_size
        num_new = np.zeros(rows, dtype=np.int64)
        num_new[: len(seqs)] = [seq.num_prompt for seq in seqs]
        cu_seqlens = np.zeros(rows + 1, dtype=np.int64)
        np.cumsum(num_new, out=cu_seqlens[1:])
        n = int(cu_seqlens[-1])
        text_ids, codec_ids = np.full(tokens, -1, dtype=np.int64), np.full(tokens, -1, dtype=np.int64)
        positions = np.zeros(tokens, dtype=np.int64)
        block_tables = np.full((rows, self.max_blocks_per_seq), self.scratch_block, dtype=np.int64)
        slots = np.full(rows, self.scratch_slot, dtype=np.int64)
        slot_mapping = self.scratch_block * bs + np.arange(tokens) % bs
        if seqs:
            prompts: list[Qwen3Prompt] = [seq.prompt.prompt for seq in seqs]
            text_ids[:n] = np.concatenate([p.text_ids.numpy() for p in prompts])
            codec_ids[:n] = np.concatenate([p.codec_ids.numpy() for p in prompts])
            positions[:n] = np.concatenate([np.arange(seq.num_prompt) for seq in seqs])
            for row, seq in enumerate(seqs):
                block_tables[row, : len(seq.block_table)] = seq.block_table
                slots[row] = seq.slot
            seq_index = np.repeat(np.arange(rows), num_new)
            slot_mapping[:n] = block_tables[seq_index, positions[:n] // bs] * bs + positions[:n] % bs
        last_index = np.maximum(cu_seqlens[1:] - 1, 0)
        parts = (text_ids, codec_ids, positions, slot_mapping, cu_seqlens, num_new, last_index, slots, block_tables)
        return np.concatenate([part.ravel() for part in parts])

    def _prefill_body(
        self, packed: torch.Tensor, x: torch.Tensor, tokens: int, rows: int, max_seqlen_q: int, max_seqlen_k: int
    ) -> None:
        """The talker over the prompt rows x [tokens, H] (`_pack_prefill`'s layout in `packed`), then each
        sequence's last hidden and codebook 0 of its frame 0 into its slot. Fixed shapes, no host sync."""
        n, b = tokens, rows
        positions, slot_mapping = packed[2 * n : 4 * n].view(2, n)
        cu_seqlens = packed[4 * n : 4 * n + b + 1]
        seq_lens, last_index, slots = packed[4 * n + b + 1 : 4 * n + 4 * b + 1].view(3, b)
        attn = AttentionMetadata(
            cu_seqlens_q=cu_seqlens.int(),
            seq_lens=seq_lens.int(),
            max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k,
            slot_mapping=slot_mapping,
            block_tables=packed[4 * n + 4 * b + 1 :].view(b, self.max_blocks_per_seq).int(),
            decode_only=False,
            context_free=True,  # whole prompts from position 0
        )
        hidden = self.model.talker_forward(x, positions, attn)[last_index]
        self.slot_hidden[slots] = hidden
        self.slot_c0[slots] = self._choose_c0(slots, hidden, torch.zeros_like(slots))

    # -- the frame body (graphed per batch bucket on CUDA): fixed shapes, device state only, no host sync ----------

    def _choose_c0(self, slots: torch.Tensor, hidden: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
        """Codebook 0 of frame `frame` [B] for rows of `slots` [B] from their talker hidden [B, H] (penalty history:
        the row's earlier frames, -1 beyond them)."""
        logits = process_codebook0(
            self.model.codebook0_logits(hidden),
            self.slot_history[slots],
            self.slot_penalty[slots],
            frame >= self.slot_eos_from[slots],
            self.suppress,
            self.config.talker.codec_eos_id,
        )
        noise = uniform(self.slot_seed[slots], frame * CODEBOOKS, (logits.shape[-1],))
        return choose(logits, self.slot_talker.select(slots), noise)

    def _decode_attention(self, slots: torch.Tensor, positions: torch.Tensor, go: torch.Tensor) -> AttentionMetadata:
        """One position per row at `positions`, K/V written through the slot's block table, or into the scratch
        block for rows without look-ahead (`go` False: no KV reserved there). The torch kernels gather the whole
        block table (a graph cannot know the longest sequence); flash-attn reads only seq_lens."""
        bs = self.block_size
        blocks = self.slot_blocks[slots]  # int32 [B, max_blocks]
        block_of = blocks.gather(1, (positions // bs).unsqueeze(1)).squeeze(1).long()
        offsets = torch.arange(slots.shape[0] + 1, device=slots.device)
        return AttentionMetadata(
            cu_seqlens_q=offsets.int(),
            seq_lens=(positions + 1).int(),
            max_seqlen_q=1,
            max_seqlen_k=self.max_blocks_per_seq * bs,
            slot_mapping=torch.where(go, block_of * bs, self.scratch_block * bs) + positions % bs,
            block_tables=blocks,
            decode_only=True,
        )

    def _frame(self, inputs: torch.Tensor) -> torch.Tensor:
        """One frame for rows `inputs` int64 [B, 3] = (slot, frame k, look-ahead flag): codebooks 1..15, audio,
        and the look-ahead (talker position of frame k, codebook 0 of frame k + 1) into slot state. Returns the
        packed rows [B, 16 codes | 1920 samples | stop] float32."""
        slots, frame, go = inputs[:, 0], inputs[:, 1], inputs[:, 2].bool()
        hidden, c0, seeds = self.slot_hidden[slots], self.slot_c0[slots], self.slot_seed[slots]
        steps = frame * CODEBOOKS
        frames = self.model.predict_rest(
            hidden, c0, self.slot_predictor.select(slots), lambda g, vocab: uniform(seeds, steps + g, (vocab,))
        )
        state = self.decoder_state.select(slots)
        audio = self.decoder(frames[:, None], state)
        self.decoder_state.assign(slots, state)

        self.slot_history[slots, frame] = c0
        text = self.slot_text[slots, torch.minimum(frame, self.slot_text_len[slots] - 1)]
        x = self.model.frame_embed(frames) + self.model.text_embed(text)
        positions = torch.where(go, self.slot_prompt_len[slots] + frame, 0)
        next_hidden = self.model.talker_forward(x, positions, self._decode_attention(slots, positions, go))
        next_c0 = self._choose_c0(slots, next_hidden, frame + 1)
        self.slot_hidden[slots] = next_hidden
        self.slot_c0[slots] = next_c0
        stop = go & (next_c0 == self.config.talker.codec_eos_id)
        return torch.cat((frames.float(), audio.float(), stop.float()[:, None]), dim=1)

    # -- one step -----------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def run(self, batch: list[Sequence], while_running: Callable[[], None]) -> StepResult:
        admitted = [seq for seq in batch if seq.is_prefill]
        if admitted:
            self._admit(admitted)
        rows = len(batch)
        inputs = np.array(
            [(s.slot, s.num_generated, s.num_generated + 1 < s.max_patches) for s in batch], dtype=np.int64
        )
        cuda = self.device.type == "cuda"
        # A fresh pinned buffer (the host allocator caches them): the chunks handed out keep views of it.
        host = torch.empty((rows, self.packed_width), pin_memory=cuda)
        host.copy_(self._step(inputs)[:rows], non_blocking=True)
        while_running()
        if cuda:
            torch.cuda.current_stream(self.device).synchronize()
        packed = host.numpy()
        return StepResult(
            seqs=batch,
            latents=packed[:, None, :CODEBOOKS],
            samples=packed[:, CODEBOOKS:-1],
            stops=(packed[:, -1] > 0.5).tolist(),
        )

    def _step(self, inputs: np.ndarray) -> torch.Tensor:
        """The frame body over the step's rows: replayed from the smallest bucket holding them (padded with scratch
        rows), or eager. The result's first len(inputs) rows are the step's."""
        graphs = self.graphs
        if graphs is None:
            return self._frame(self._to_device(inputs))
        rows, bucket = len(inputs), graphs.bucket(len(inputs))

        def fill() -> None:
            # The host waits for every step's result before preparing the next: the staging buffer is free.
            staging = self._step_staging.numpy()
            staging[:rows] = inputs
            staging[rows:bucket] = (self.scratch_slot, 0, 0)
            self._step_input[:bucket].copy_(self._step_staging[:bucket], non_blocking=True)

        return graphs.frame.run(bucket, fill)
