"""The synchronous engine: add_request / abort / step(). Single-threaded; AsyncEngine drives it.

The model is the family's ModelRunner (engine/models/family.py), picked from the checkpoint by the registry."""

from __future__ import annotations

import bisect
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from engine.config import EngineConfig
from engine.lora.format import Adapter, AdapterError, read_adapter
from engine.models.family import ModelRunner, PrefillsAhead
from engine.models.registry import load_runner
from engine.noise import draw_seed
from engine.outputs import STEP_BUCKETS_S, AudioChunk, EngineError, EngineStats, FinishReason
from engine.pacing import AdmissionPacer
from engine.params import GenerationRequest
from engine.scheduler import Scheduler
from engine.sequence import Sequence

_EMA = 0.1  # weight of the newest step in the step-time and batch-size averages


class EngineCore:
    def __init__(
        self, config: EngineConfig, runner: ModelRunner | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self.runner = runner or load_runner(config)
        self.info = self.runner.info
        self.clock = clock  # steps' durations and chunks' emission times (tests drive it)
        self.pacer = (
            AdmissionPacer(config, self.info.samples_per_patch / self.info.sample_rate, clock)
            if config.pace_admissions
            else None
        )
        self.scheduler = Scheduler(config, self.runner.num_kv_blocks, self.pacer)
        # The queued prompt positions at which the step loop prefills a burst's arrivals ahead of its first step
        # (EngineConfig.prefill_ahead_tokens); 0 where the family cannot (engine.models.family.PrefillsAhead).
        self.prefill_ahead_tokens = config.prefill_ahead_tokens if isinstance(self.runner, PrefillsAhead) else 0
        self.healthy = True
        self.num_steps = 0
        self.step_ms_avg = 0.0
        self.batch_size_avg = 0.0
        self.step_counts = [0] * (len(STEP_BUCKETS_S) + 1)  # EngineStats.step_counts
        self.step_s_total = 0.0
        self.trace = _open_trace(config.step_trace)
        for name, directory in config.loras:
            self.load_lora(name, self.read_lora(directory))

    def make_sequence(self, request: GenerationRequest) -> Sequence:
        """Validate and tokenize a request (EngineError if it can never run). Touches no engine state, so
        callers may run it on their own thread, before queueing."""
        try:
            request.params.validate()
            seq = Sequence(
                request_id=request.request_id,
                prompt=self.runner.make_prompt(request),
                params=request.params,
                seed=draw_seed() if request.params.seed is None else request.params.seed,
                arrival_time=request.arrival_time,
                received_time=self.clock(),
            )
            self.scheduler.patch_cap(seq)
        except ValueError as exc:
            raise EngineError(f"bad request {request.request_id}: {exc}") from exc
        return seq

    def add_sequence(self, seq: Sequence) -> None:
        if not self.healthy:
            raise EngineError("the engine has failed and accepts no requests")
        if seq.params.lora is not None:
            seq.lora_slot = self._lora_slot(seq.params.lora)
        try:
            self.scheduler.add(seq)
        except ValueError as exc:
            raise EngineError(f"bad request {seq.request_id}: {exc}") from exc

    def add_request(self, request: GenerationRequest) -> None:
        self.add_sequence(self.make_sequence(request))

    # LoRA adapters: read anywhere (read_lora touches no engine state), made resident and removed on the step loop's
    # thread between steps (a few device copies: running requests do not wait).

    def _lora_slot(self, name: str) -> int:
        pool = self.runner.lora
        if pool is None:
            raise EngineError(f"unknown LoRA adapter {name!r}: this engine serves none (max_loras = 0)")
        try:
            return pool.slot(name)
        except KeyError as exc:
            raise EngineError(exc.args[0]) from None

    def read_lora(self, directory: str | Path) -> Adapter:
        """An adapter directory read and checked against this model and the engine's limits (EngineError if not)."""
        pool = self.runner.lora
        if pool is None:
            raise EngineError("this engine serves no LoRA adapters (max_loras = 0)")
        try:
            return read_adapter(directory, pool.targets, pool.limits.max_rank)
        except AdapterError as exc:
            raise EngineError(str(exc)) from exc

    def load_lora(self, name: str, adapter: Adapter) -> None:
        pool = self.runner.lora
        if pool is None:
            raise EngineError("this engine serves no LoRA adapters (max_loras = 0)")
        try:
            pool.add(name, adapter)
        except AdapterError as exc:
            raise EngineError(str(exc)) from exc

    def unload_lora(self, name: str) -> None:
        """Remove a resident adapter; refused while a request (queued, running or paused) uses it."""
        self._lora_slot(name)
        users = sum(seq.params.lora == name for seq in self.scheduler.requests.values())
        if users:
            raise EngineError(f"LoRA adapter {name!r} is in use by {users} request(s); remove it once they end")
        assert self.runner.lora is not None
        self.runner.lora.remove(name)

    def loras(self) -> tuple[str, ...]:
        return tuple(self.runner.lora.names()) if self.runner.lora is not None else ()

    def abort(self, request_id: str) -> bool:
        """Cancel a queued or running request, freeing its KV blocks and slot now. False if unknown."""
        return self.scheduler.abort(request_id) is not None

    def pause(self, request_id: str) -> None:
        self.scheduler.pause(request_id)

    def resume(self, request_id: str) -> None:
        self.scheduler.resume(request_id)

    def has_work(self) -> bool:
        return self.healthy and self.scheduler.has_work()

    def admission_ahead(self, arriving: list[int]) -> int:
        """See Scheduler.admission_ahead."""
        return self.scheduler.admission_ahead(arriving)

    def lead_burst(self, request_ids: frozenset[str]) -> None:
        """The next step admits the rest of the burst these requests led: see Scheduler.leads."""
        self.scheduler.leads = request_ids

    def step(self, while_running: Callable[[], None] | None = None) -> list[AudioChunk]:
        """Run one step; one chunk per stepped request, `finish_reason` set on a request's last chunk.
        `while_running` is called once the step's device work is queued, while the host waits for it (the caller's
        own work then overlaps the device's); not at all if nothing runs.

        Any failure is fatal: the engine turns unhealthy, drops every request and raises EngineError.
        """
        return self.step_lazily(while_running).make()

    def step_lazily(self, while_running: Callable[[], None] | None = None) -> StepChunks:
        """step(), its chunks made when asked: at B=1,024, ~1 ms of the host's time between two steps, while the
        device waits for the next, that can instead overlap the next step's device work (engine.engine_loop)."""
        if not self.healthy:
            raise EngineError("the engine has failed")
        start = self.clock()
        try:
            batch = self.scheduler.schedule()
            if not batch:
                return StepChunks([], np.empty((0, 0), np.float32), np.empty((0, 0, 0), np.float32))
            admitted = [seq for seq in batch if seq.is_prefill]
            ahead = sum(seq.prefilled_ahead for seq in admitted)
            positions = sum(seq.num_prompt for seq in admitted if not seq.prefilled_ahead)  # prefilled this step
            result = self.runner.run(batch, while_running or _nothing)
            self.scheduler.postprocess(result.seqs, result.stops)
        except Exception as exc:
            self.fail()
            raise EngineError(f"engine step failed: {exc!r}") from exc
        # What each chunk says of its request, taken now: before the chunks are made the next step may move it on
        heads = [(seq.request_id, seq.num_generated - 1, seq.finish_reason) for seq in result.seqs]
        chunks = StepChunks(heads, result.samples, result.latents)
        seconds = self.clock() - start
        self._record(len(batch), seconds)
        self._trace(start, seconds, len(batch), admitted, positions, ahead)
        if self.pacer is not None:
            self.pacer.record(len(batch) - len(admitted), positions, seconds)
        return chunks

    def prefill_ahead(self) -> None:
        """Admit what waits in full passes (Scheduler.admit_ahead, EngineConfig.prefill_ahead_chunk) and prefill each
        ahead of the step that starts it, queueing the device work without waiting for it: only while nothing
        decodes, so that a burst's arrivals go through the backbone while the rest arrive (engine.engine_loop). A
        part-filled pass waits. Each pass is traced; any failure is fatal, as a step's."""
        if not self.healthy:
            raise EngineError("the engine has failed")
        assert self.prefill_ahead_tokens, "this engine prefills nothing ahead"
        max_tokens, max_seqs = self.config.prefill_ahead_chunk
        while True:
            start = self.clock()
            try:
                seqs = self.scheduler.admit_ahead(max_tokens, max_seqs)
                if not seqs:
                    return
                assert isinstance(self.runner, PrefillsAhead)
                self.runner.prefill_ahead(seqs)
            except Exception as exc:
                self.fail()
                raise EngineError(f"engine prefill failed: {exc!r}") from exc
            for seq in seqs:
                seq.num_cached = seq.num_prompt
            self._trace(start, self.clock() - start, 0, seqs, sum(seq.num_prompt for seq in seqs), len(seqs))

    def _trace(
        self, start: float, seconds: float, batch: int, admitted: list[Sequence], positions: int, ahead: int
    ) -> None:
        """The step trace's line of a step (`batch` rows), or of a prefill ahead (batch 0, its device work queued
        and not waited for: `ms` is the host's). `admitted` took their first step or were prefilled ahead (`ahead`
        of them), `positions` their prompt positions prefilled then."""
        if self.trace is None:
            return
        line = {"t": round(start, 4), "ms": round(seconds * 1e3, 2), "batch": batch}
        line |= {"admitted": len(admitted), "positions": positions, "waiting": len(self.scheduler.waiting)}
        if ahead:
            line["ahead"] = ahead
        if admitted:  # how the admitted requests reached the engine: made, then taken in (first, last)
            for key in ("arrival_time", "received_time"):
                times = [getattr(seq, key) for seq in admitted]
                line[key.removesuffix("_time")] = [round(min(times), 4), round(max(times), 4)]
        self.trace.write(json.dumps(line) + "\n")

    def fail(self) -> None:
        """The engine can no longer serve: unhealthy from now on, every request dropped (KV blocks and slot freed)."""
        self.healthy = False
        for request_id in list(self.scheduler.requests):
            self.scheduler.abort(request_id)
        if self.trace is not None:  # no step follows
            self.trace.close()
            self.trace = None

    def _record(self, batch_size: int, seconds: float) -> None:
        first = self.num_steps == 0
        self.num_steps += 1
        self.step_ms_avg = seconds * 1e3 if first else (1 - _EMA) * self.step_ms_avg + _EMA * seconds * 1e3
        self.batch_size_avg = batch_size if first else (1 - _EMA) * self.batch_size_avg + _EMA * batch_size
        self.step_counts[bisect.bisect_left(STEP_BUCKETS_S, seconds)] += 1
        self.step_s_total += seconds

    def stats(self) -> EngineStats:
        scheduler = self.scheduler
        return EngineStats(
            running=scheduler.num_running,
            waiting=len(scheduler.waiting),
            paused=scheduler.num_paused,
            max_num_seqs=scheduler.max_num_seqs,
            kv_blocks_free=scheduler.block_manager.num_free_blocks,
            kv_blocks_total=scheduler.block_manager.num_blocks,
            steps=self.num_steps,
            step_ms_avg=self.step_ms_avg,
            batch_size_avg=self.batch_size_avg,
            healthy=self.healthy,
            loras=self.loras(),
            step_counts=tuple(self.step_counts),
            step_s_total=self.step_s_total,
        )

    def encode_audio(self, wav: np.ndarray, padding: str = "left") -> np.ndarray:
        try:
            return self.runner.encode_audio(wav, padding)
        except ValueError as exc:
            raise EngineError(f"cannot encode audio: {exc}") from exc


@dataclass(frozen=True, slots=True)
class StepChunks:
    """One step's chunks, not made yet: each request's id, chunk index and finish reason as the step left them, and
    the step's host arrays (samples, latents: one row a request; they keep the step's host buffer alive)."""

    heads: list[tuple[str, int, FinishReason | None]]
    samples: np.ndarray
    latents: np.ndarray

    def __len__(self) -> int:
        return len(self.heads)

    def make(self) -> list[AudioChunk]:
        # Callers keep latents for a while (continuation prompts): a copy, so that they do not pin the step's whole
        # host buffer (pinned memory on CUDA). Samples stay views: they are consumed right away. zip: iterating the
        # arrays makes each row's view faster than indexing them.
        rows = zip(self.heads, self.samples, self.latents.copy(), strict=True)
        return [
            AudioChunk(request_id, index, samples, latents, reason)
            for (request_id, index, reason), samples, latents in rows
        ]


def _nothing() -> None:
    pass


def _open_trace(path: str) -> TextIO | None:
    if not path:
        return None
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return open(path, "a", buffering=1)  # line-buffered: a killed engine's trace ends at its last whole step
