"""A minimal test driver for VoxCPMModel.forward: sequences, a trivial block allocator and packed steps.

Inputs are assembled on the CPU and moved to the model's device for the forward; patches come back to the CPU.

Not the engine's scheduler: each `step()` call says which sequences take part and, for prefilling ones, how
many prompt positions to feed (chunked prefill), which is enough to build any mix of prefill and decode.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.attention.metadata import AttentionMetadata
from engine.models.voxcpm.batch import ModelInputs, ModelOutputs
from engine.models.voxcpm.model import VoxCPMModel
from engine.models.voxcpm.prompt import HostPrompt


@dataclass
class Seq:
    prompt: HostPrompt
    noise: torch.Tensor  # [num_patches, D, P], the CFM start of each generated patch
    cfg_value: float = 2.0
    temperature: float = 1.0
    timesteps: int = 10
    adapter: int = 0  # LoRA slot (0: none)
    fed: int = 0  # prompt positions already in the KV cache
    blocks: list[int] = field(default_factory=list)
    patches: list[torch.Tensor] = field(default_factory=list)
    stops: list[bool] = field(default_factory=list)

    @property
    def kv_len(self) -> int:
        return self.fed + max(len(self.patches) - 1, 0) if self.prefilled else self.fed

    @property
    def prefilled(self) -> bool:
        return self.fed == self.prompt.num_positions


class Driver:
    def __init__(
        self,
        model: VoxCPMModel,
        num_blocks: int = 64,
        block_size: int = 4,
        forward: Callable[[ModelInputs], ModelOutputs] | None = None,
    ) -> None:
        self.model = model
        self.forward = forward or model  # a stand-in for model.forward (e.g. a reference implementation)
        self.block_size = block_size
        model.allocate_kv_cache(num_blocks, block_size)
        # Hand out blocks in a scrambled order so that block tables are not contiguous.
        self.free = list(reversed(range(num_blocks)))[::2] + list(reversed(range(num_blocks)))[1::2]

    def step(self, seqs: list[Seq], chunk: dict[int, int] | None = None) -> None:
        """One forward over `seqs`; a sequence still in prefill feeds min(chunk[i], rest) prompt positions
        (all by default), a prefilled one its last patch. Records patch and stop for every sequence whose
        prompt is complete after this step."""
        chunk = chunk or {}
        model = self.model
        dtype_feat = torch.float32
        ids, feats, mask, positions, slots = [], [], [], [], []
        cu, seq_lens, finishing, adapter = [0], [], [], []
        for i, seq in enumerate(seqs):
            start = seq.kv_len
            if seq.prefilled:
                n = 1
                ids.append(torch.zeros(1, dtype=torch.long))
                feats.append(seq.patches[-1][None])
                mask.append(torch.ones(1, dtype=torch.bool))
            else:
                n = min(chunk.get(i, seq.prompt.num_positions), seq.prompt.num_positions - seq.fed)
                sl = slice(seq.fed, seq.fed + n)
                ids.append(torch.from_numpy(seq.prompt.token_ids[sl]))
                feats.append(torch.tensor(seq.prompt.feats[sl]))  # a copy: text-only feats are a read-only view
                mask.append(torch.from_numpy(seq.prompt.audio_mask[sl]))
                seq.fed += n
            end = start + n
            while len(seq.blocks) * self.block_size < end:
                seq.blocks.append(self.free.pop())
            for pos in range(start, end):
                positions.append(pos)
                slots.append(seq.blocks[pos // self.block_size] * self.block_size + pos % self.block_size)
            cu.append(cu[-1] + n)
            adapter += [seq.adapter] * n
            seq_lens.append(end)
            finishing.append(seq.prefilled)
        width = max(len(s.blocks) for s in seqs)
        tables = torch.full((len(seqs), width), -1, dtype=torch.int32)
        for i, seq in enumerate(seqs):
            tables[i, : len(seq.blocks)] = torch.tensor(seq.blocks, dtype=torch.int32)
        q_lens = [b - a for a, b in itertools.pairwise(cu)]
        attn = AttentionMetadata(
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            max_seqlen_q=max(q_lens),
            max_seqlen_k=max(seq_lens),
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            block_tables=tables,
            decode_only=all(q == 1 for q in q_lens),
        )
        noise = torch.stack([s.noise[min(len(s.patches), s.noise.shape[0] - 1)] for s in seqs])
        inputs = ModelInputs(
            token_ids=torch.cat(ids),
            feats=torch.cat(feats).to(dtype_feat),
            audio_mask=torch.cat(mask),
            positions=torch.tensor(positions, dtype=torch.int64),
            last_index=torch.tensor(cu[1:], dtype=torch.int64) - 1,
            cfg_value=torch.tensor([s.cfg_value for s in seqs], dtype=torch.float32),
            temperature=torch.tensor([s.temperature for s in seqs], dtype=torch.float32),
            timesteps=torch.tensor([s.timesteps for s in seqs], dtype=torch.int64),
            noise=noise,
            attn=attn,
            text_only=False,
            adapter=torch.tensor(adapter, dtype=torch.int32),
        )
        device = model.device
        for name in (
            "token_ids",
            "feats",
            "audio_mask",
            "positions",
            "last_index",
            "cfg_value",
            "temperature",
            "timesteps",
            "noise",
            "adapter",
        ):
            setattr(inputs, name, getattr(inputs, name).to(device))
        for name in ("cu_seqlens_q", "seq_lens", "slot_mapping", "block_tables"):
            setattr(attn, name, getattr(attn, name).to(device))
        out = self.forward(inputs)
        for i, seq in enumerate(seqs):
            if finishing[i]:
                seq.patches.append(out.patches[i].cpu())
                seq.stops.append(bool(out.stop[i]))

    def generate(self, seq: Seq, num_patches: int) -> Seq:
        """Prefill in one step, then decode alone until `num_patches` patches exist."""
        while len(seq.patches) < num_patches:
            self.step([seq])
        return seq
