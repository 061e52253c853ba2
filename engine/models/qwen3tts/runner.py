"""The Qwen3-TTS family's ModelRunner (engine/models/family.py): one engine step = one 12.5 Hz frame per row.

A row producing frame k in a step (k = `Sequence.num_generated`):
1. prefill rows (k = 0) run their prompt through the paged talker and sample frame 0's codebook 0; the others
   read the talker hidden and codebook 0 that the previous step left in their slot;
2. the code predictor completes every row's frame (codebooks 1..15, all rows batched);
3. the streaming codec decoder turns the frames into 1920 samples per row (per-slot causal state);
4. look-ahead: each frame is fed back (its summed embeddings + the row's next text row) through the talker, and
   codebook 0 of frame k + 1 is sampled now, so a row whose next codebook 0 is EOS reports stop with its last real
   frame and no EOS frame is ever decoded. A row at its last allowed frame skips this (no KV is reserved for it).
One host sync per step: the frames, audio and stop flags come back together.

Sampling: the checkpoint's generation_config (temperature 0.9, top-k 50, top-p 1, repetition penalty 1.05, the
same for the predictor); `GenerationParams.temperature` other than 1.0 replaces both temperatures, 0 is greedy.
Draws use counter noise keyed by (seed, frame * 16 + codebook), so a request's codes do not depend on its batch,
and equal `OfflineGenerator`'s. EOS may end a request from frame max(2, min_patches + 2) on: the reference's
two-frame minimum, and never a stop the scheduler would ignore (it applies `min_patches`).

Per-slot state (slot `max_num_seqs` is scratch): the talker hidden and codebook 0 of the next frame, the
codebook-0 history (repetition penalty), seed, sampling settings, the codec decoder's causal state. Host-side per
slot: the request's trailing text ids. Eager on every device for now (no CUDA graphs yet).

Voices (Base checkpoints): `encode_audio(wav, "right")` is the x-vector (speaker encoder; as [H/16, 1, 16]
float32), `encode_audio(wav, "left")` the ICL reference codes ([frames, 1, 16] float32). A request clones with
`reference_latents` = x-vector alone (x-vector-only mode) or with both plus `Prompt.text` = the reference
transcript (ICL): voice roles "reference" and "both".
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.attention.metadata import AttentionMetadata
from engine.config import EngineConfig
from engine.device import kv_pool_blocks, resolve_device, resolve_dtype
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

        slots = config.max_num_seqs + 1
        hidden = self.config.talker.stack.hidden_size
        device = self.device
        self.slot_hidden = torch.zeros(slots, hidden, device=device, dtype=self.dtype)
        self.slot_c0 = torch.zeros(slots, dtype=torch.int64, device=device)
        self.slot_history = torch.full((slots, config.max_patches), -1, dtype=torch.int64, device=device)
        self.slot_seed = torch.zeros(slots, dtype=torch.int64, device=device)
        self.slot_penalty = torch.ones(slots, device=device)
        self.slot_trailing: list[list[int]] = [[] for _ in range(slots)]
        self.slot_sampling: list[tuple[SamplingParams, SamplingParams]] = [
            (self.talker_defaults, self.predictor_defaults)
        ] * slots
        self.slot_eos_from = [MIN_NEW_TOKENS] * slots  # first frame whose codebook 0 may be EOS
        self.decoder = loaded.codec_decoder
        self.decoder_state = self.decoder.new_state(slots)
        self.suppress = codebook0_mask(self.config.talker.stack.vocab_size, self.config.talker.codec_eos_id, device)

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
        with torch.inference_mode():
            if padding == "right":
                return self.model.speaker_encoder.embed(audio).float().cpu().numpy().reshape(-1, 1, CODEBOOKS)
            if padding == "left":
                return self.loaded.codec_encoder.encode(audio).cpu().numpy().astype(np.float32)[:, None, :]
        raise ValueError(f"padding must be 'left' or 'right', got {padding!r}")

    # -- one step -----------------------------------------------------------------------------------------------

    def _attention(self, seqs: list[Sequence], starts: list[int], lengths: list[int]) -> AttentionMetadata:
        bs = self.block_size
        slots = []
        for seq, start, n in zip(seqs, starts, lengths, strict=True):
            slots.extend(seq.block_table[pos // bs] * bs + pos % bs for pos in range(start, start + n))
        width = max(len(seq.block_table) for seq in seqs)
        table = np.full((len(seqs), width), self.scratch_block, dtype=np.int32)
        for row, seq in enumerate(seqs):
            table[row, : len(seq.block_table)] = seq.block_table
        cu = list(itertools.accumulate([0, *lengths]))
        device = self.device
        return AttentionMetadata(
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(
                [s + n for s, n in zip(starts, lengths, strict=True)], dtype=torch.int32, device=device
            ),
            max_seqlen_q=max(lengths),
            max_seqlen_k=max(s + n for s, n in zip(starts, lengths, strict=True)),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            block_tables=torch.from_numpy(table).to(device),
            decode_only=all(n == 1 for n in lengths),
        )

    def _talker(self, seqs: list[Sequence], inputs: list[torch.Tensor], starts: list[int]) -> torch.Tensor:
        """Packed talker forward; each row's last hidden [B, H]."""
        lengths = [x.shape[0] for x in inputs]
        positions = torch.tensor(
            [p for s, n in zip(starts, lengths, strict=True) for p in range(s, s + n)], device=self.device
        )
        hidden = self.model.talker_forward(torch.cat(inputs), positions, self._attention(seqs, starts, lengths))
        last = torch.tensor(list(itertools.accumulate(lengths)), device=self.device) - 1
        return hidden[last]

    def _sample_c0(self, seqs: list[Sequence], slots: torch.Tensor, hidden: torch.Tensor, frame: list[int]):
        """Codebook 0 of frame `frame[i]` for each row from its talker hidden (history: frames before it)."""
        width = max(max(frame), 1)
        eos_allowed = torch.tensor([f >= self.slot_eos_from[s.slot] for s, f in zip(seqs, frame, strict=True)])
        logits = process_codebook0(
            self.model.codebook0_logits(hidden),
            self.slot_history[slots, :width],
            self.slot_penalty[slots],
            eos_allowed.to(self.device),
            self.suppress,
            self.config.talker.codec_eos_id,
        )
        steps = torch.tensor(frame, dtype=torch.int64, device=self.device) * CODEBOOKS
        noise = uniform(self.slot_seed[slots], steps, (logits.shape[-1],))
        sampling = RowSampling.of([self.slot_sampling[s.slot][0] for s in seqs], self.device)
        return choose(logits, sampling, noise)

    def _admit(self, seqs: list[Sequence]) -> None:
        slots = torch.tensor([s.slot for s in seqs], device=self.device)
        self.slot_history[slots] = -1
        self.slot_seed[slots] = torch.tensor([s.seed for s in seqs], dtype=torch.int64, device=self.device)
        self.slot_penalty[slots] = self.config.sampling.repetition_penalty
        self.decoder_state.reset(slots)
        for seq in seqs:
            prompt: Qwen3Prompt = seq.prompt.prompt
            self.slot_trailing[seq.slot] = [*prompt.trailing_ids.tolist(), self.config.tts_pad_token_id]
            self.slot_sampling[seq.slot] = (
                _sampling(seq.params, self.talker_defaults),
                _sampling(seq.params, self.predictor_defaults),
            )
            self.slot_eos_from[seq.slot] = max(MIN_NEW_TOKENS, seq.params.min_patches + 2)
            if prompt.ref_codes is not None:
                # the reference decodes its output after the clone's codes: they are the decoder's left context
                row = torch.tensor([seq.slot], device=self.device)
                state = self.decoder_state.select(row)
                self.decoder(prompt.ref_codes[None].to(self.device), state)
                self.decoder_state.assign(row, state)
        hidden = self._talker(seqs, [self.model.embed_prompt(s.prompt.prompt) for s in seqs], [0] * len(seqs))
        self.slot_hidden[slots] = hidden
        self.slot_c0[slots] = self._sample_c0(seqs, slots, hidden, [0] * len(seqs))

    @torch.inference_mode()
    def run(self, batch: list[Sequence]) -> StepResult:
        admitted = [seq for seq in batch if seq.is_prefill]
        if admitted:
            self._admit(admitted)
        seqs = batch
        device = self.device
        slots = torch.tensor([s.slot for s in seqs], device=device)
        frame = [s.num_generated for s in seqs]
        hidden, c0 = self.slot_hidden[slots], self.slot_c0[slots]
        steps = torch.tensor(frame, dtype=torch.int64, device=device) * CODEBOOKS
        seeds = self.slot_seed[slots]
        sampling = RowSampling.of([self.slot_sampling[s.slot][1] for s in seqs], device)
        frames = self.model.predict_rest(hidden, c0, sampling, lambda g, vocab: uniform(seeds, steps + g, (vocab,)))
        state = self.decoder_state.select(slots)
        audio = self.decoder(frames[:, None], state)
        self.decoder_state.assign(slots, state)

        # look-ahead: feed the frame, sample the next codebook 0; rows at their last frame stop by length instead
        stops = torch.zeros(len(seqs), dtype=torch.bool, device=device)
        go = [i for i, s in enumerate(seqs) if s.num_generated + 1 < s.max_patches]
        if go:
            rows = torch.tensor(go, device=device)
            go_seqs = [seqs[i] for i in go]
            self.slot_history[slots[rows], torch.tensor([frame[i] for i in go], device=device)] = c0[rows]
            text = [
                self.slot_trailing[s.slot][min(s.num_generated, len(self.slot_trailing[s.slot]) - 1)] for s in go_seqs
            ]
            x = self.model.frame_embed(frames[rows]) + self.model.text_embed(torch.tensor(text, device=device))
            starts = [s.num_prompt + s.num_generated for s in go_seqs]
            next_hidden = self._talker(go_seqs, list(x[:, None]), starts)
            next_c0 = self._sample_c0(go_seqs, slots[rows], next_hidden, [frame[i] + 1 for i in go])
            self.slot_hidden[slots[rows]] = next_hidden
            self.slot_c0[slots[rows]] = next_c0
            stops[rows] = next_c0 == self.config.talker.codec_eos_id
        latents = frames.float()[:, None, :].cpu().numpy()
        return StepResult(seqs, latents, audio.float().cpu().numpy(), stops.cpu().tolist())
