"""Which requests run in the next step, and when a request is done.

Every step decodes all running requests and, in the same batch, prefills newly admitted ones, so an
admission never freezes the streams already playing (the anchor engine runs prefill-only steps). The
per-step prefill is bounded by `max_prefill_tokens`, which bounds how much an admission can stretch a
step, and by the larger `idle_prefill_tokens` when nothing decodes (no stream waits for that step). Neither a burst's
leads, which the step loop admitted alone ahead of it (engine.engine_loop), nor its requests prefilled while it still
arrived (`admit_ahead`, in full passes) count as decoding: they wait for the step that admits the rest of it. Admission
is FIFO and stops at the first request that does not fit (slots, KV blocks, prefill budget), so a long prompt
cannot be overtaken forever by short ones. With an AdmissionPacer (engine/pacing.py) the
prefill budget is also what the playing streams can spare: an admission must not run them dry.
"""

from __future__ import annotations

import itertools
from collections import deque

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.outputs import FinishReason
from engine.pacing import AdmissionPacer
from engine.sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(self, config: EngineConfig, num_kv_blocks: int, pacer: AdmissionPacer | None = None) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_model_len = config.max_model_len
        self.max_prefill_tokens = config.max_prefill_tokens
        self.idle_prefill_tokens = config.idle_prefill_budget
        self.max_patches = config.max_patches
        self.block_manager = BlockManager(num_kv_blocks, config.kv_block_size)
        self.pacer = pacer  # None: every step may admit max_prefill_tokens
        # One slot per admitted request indexes its device state; pop() hands out the lowest first.
        self.free_slots: list[int] = list(reversed(range(config.max_num_seqs)))
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admitted (RUNNING or PAUSED), in admission order
        self._paused = 0  # how many of `running` are PAUSED: counted, not summed, as every step and stats() ask
        self.requests: dict[str, Sequence] = {}  # every unfinished request, waiting or admitted
        # Set by the step loop for the next schedule() only: the leads of a burst whose rest is queued now. That step
        # does not count them as decoding, so that the burst lands in one step at the idle budget instead of in waves.
        self.leads: frozenset[str] = frozenset()

    @property
    def num_running(self) -> int:
        return len(self.running) - self._paused

    @property
    def num_paused(self) -> int:
        return self._paused

    def _stepped(self) -> list[Sequence]:
        """The admitted requests the next step decodes: the running ones, in admission order."""
        if not self._paused:
            return list(self.running)
        return [seq for seq in self.running if seq.status is SequenceStatus.RUNNING]

    def patch_cap(self, seq: Sequence) -> int:
        """The request's patch cap (LENGTH finish), or ValueError if its prompt can never run.

        The family's cap (VoxCPM: the reference's text-proportional one) applies unless the request sets its own; the
        engine's absolute cap and the KV room left after the prompt (max_model_len) bound it further.
        """
        if seq.num_prompt >= self.max_model_len:
            raise ValueError(
                f"prompt of {seq.num_prompt} positions leaves no room in max_model_len={self.max_model_len}"
            )
        cap = seq.params.max_patches
        if cap is None:
            cap = seq.prompt.patch_cap
        cap = min(cap, self.max_patches, self.max_model_len - seq.num_prompt + 1)
        num_blocks = self.block_manager.blocks_needed(seq.num_prompt + cap - 1)
        if num_blocks > self.block_manager.num_blocks:
            raise ValueError(f"request needs {num_blocks} KV blocks, the pool has {self.block_manager.num_blocks}")
        return cap

    def add(self, seq: Sequence) -> None:
        if seq.request_id in self.requests:
            raise ValueError(f"request id {seq.request_id!r} is already in use")
        seq.max_patches = self.patch_cap(seq)
        self.requests[seq.request_id] = seq
        self.waiting.append(seq)

    def has_work(self) -> bool:
        """True when schedule() would return a non-empty batch."""
        return self.num_running > 0 or self._can_admit_head(self.idle_prefill_tokens, self.idle_prefill_tokens)

    def _full_budget(self, batch: list[Sequence]) -> int:
        """A step's prefill budget before pacing: max_prefill_tokens while streams decode (`batch`: the running ones;
        a burst's leads do not count), else the idle one."""
        return self.max_prefill_tokens if self._decoding(batch) else self.idle_prefill_tokens

    def _decoding(self, batch: list[Sequence]) -> bool:
        """Whether some stream of `batch` plays: a burst's leads and the requests prefilled ahead of it do not."""
        return any(not seq.prefilled_ahead and seq.request_id not in self.leads for seq in batch)

    def admission_ahead(self, arriving: list[int]) -> int:
        """Prompt positions the next schedule() would admit, at most, if prompts of `arriving` positions joined the
        queue now: the queue's head run, then theirs, within the free slots and the prefill budget (KV blocks and
        pacing not counted: an upper bound)."""
        prompts = [seq.num_prompt for seq in self.waiting] + arriving
        full = self._full_budget(self._stepped())
        admitted = 0
        for positions in prompts[: len(self.free_slots)]:
            if admitted and admitted + positions > full:
                break
            admitted += positions
        return admitted

    def schedule(self) -> list[Sequence]:
        """The next step's batch: every running request (one decode position each), then admissions."""
        batch = self._stepped()
        budget = full = self._full_budget(batch)
        if self.pacer is not None and self.waiting:
            paced = self.pacer.budget(batch, self.waiting[0].num_prompt)  # with nobody playing: ends any hold
            budget = paced if self._decoding(batch) else full
        self.leads = frozenset()
        return batch + self._admit(budget, full)

    def admit_ahead(self, max_tokens: int, max_seqs: int) -> list[Sequence]:
        """A full pass of the queue's head run, admitted ahead of the step that starts it: while a burst still arrives
        at an idle engine, its arrivals' prompts are prefilled a pass at a time (EngineCore.prefill_ahead) and the
        next step starts their solvers with the rest of the burst's. A pass holds at most `max_tokens` prompt
        positions (a longer prompt goes alone) over at most `max_seqs` requests, and is full once the next waiting
        request would not fit it; a part-filled one is not admitted (more of the burst may come to fill it, or its
        step takes it in). Nothing may be decoding."""
        assert not self._decoding(self._stepped()), "prefill ahead only at an idle engine"
        count = positions = 0
        for seq in itertools.islice(self.waiting, max_seqs):
            if count and positions + seq.num_prompt > max_tokens:
                break
            count += 1
            positions += seq.num_prompt
        else:
            if count < max_seqs and positions < max_tokens:
                return []
        return self._admit(max_tokens, max_tokens, count)

    def _admit(self, budget: int, full: int, max_seqs: int | None = None) -> list[Sequence]:
        """FIFO admissions within `budget` positions of a step's `full` budget (and `max_seqs` requests): slots and KV
        blocks handed out."""
        admitted: list[Sequence] = []
        while self._can_admit_head(budget, full) and (max_seqs is None or len(admitted) < max_seqs):
            seq = self.waiting.popleft()
            self.block_manager.allocate(seq)
            seq.slot = self.free_slots.pop()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            admitted.append(seq)
            budget -= seq.num_prompt
        return admitted

    def _can_admit_head(self, budget: int, full: int) -> bool:
        """Whether the queue's head can go in with `budget` positions left of the step's `full` budget."""
        if not self.waiting or not self.free_slots:
            return False
        seq = self.waiting[0]
        # A prompt longer than the whole budget is admitted alone rather than never.
        fits_budget = seq.num_prompt <= budget or budget == full
        return fits_budget and self.block_manager.can_allocate(seq)

    def postprocess(self, batch: list[Sequence], stops: list[bool]) -> list[Sequence]:
        """Account one generated patch per sequence; finish those that stop or hit their cap."""
        finished = []
        for seq, stop in zip(batch, stops, strict=True):
            seq.num_cached = seq.num_positions
            seq.num_generated += 1
            if self.pacer is not None:
                self.pacer.emitted(seq)
            # The reference honours the stop head only from patch index min_patches + 1 (`i > min_len`).
            if stop and seq.num_generated - 1 > seq.params.min_patches:
                self._finish(seq, FinishReason.STOP)
                finished.append(seq)
            elif seq.num_generated >= seq.max_patches:
                self._finish(seq, FinishReason.LENGTH)
                finished.append(seq)
        if finished:
            self.running = [seq for seq in self.running if seq.status is not SequenceStatus.FINISHED]
        return finished

    def abort(self, request_id: str) -> Sequence | None:
        """Drop a queued or admitted request and free its blocks and slot now; None if unknown."""
        seq = self.requests.get(request_id)
        if seq is None:
            return None
        if seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        else:
            self.running.remove(seq)
        self._finish(seq, FinishReason.CANCELLED)
        return seq

    def pause(self, request_id: str) -> None:
        """Skip a running request until resume(); it keeps its KV blocks and slot."""
        seq = self.requests.get(request_id)
        if seq is not None and seq.status is SequenceStatus.RUNNING:
            seq.status = SequenceStatus.PAUSED
            self._paused += 1

    def resume(self, request_id: str) -> None:
        seq = self.requests.get(request_id)
        if seq is not None and seq.status is SequenceStatus.PAUSED:
            seq.status = SequenceStatus.RUNNING
            self._paused -= 1
            if self.pacer is not None:
                self.pacer.resumed(seq)

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        if seq.status is SequenceStatus.PAUSED:
            self._paused -= 1
        if seq.status is not SequenceStatus.WAITING:
            self.block_manager.deallocate(seq)
            self.free_slots.append(seq.slot)
            seq.slot = -1
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        del self.requests[seq.request_id]
