"""benchmarks/bench_intake.py: a burst from several workers through the engine's intake, timed, every request queued."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from benchmarks.bench_intake import StepLoop, main, run_round
from engine.config import EngineConfig
from engine.engine_core import EngineCore
from engine.process import Intake


def test_a_round_queues_every_request_of_every_worker(tiny_checkpoint: Callable[..., Path]) -> None:
    core = EngineCore(EngineConfig(model=str(tiny_checkpoint("voxcpm2")), device="cpu"))
    intake = Intake()
    for workers, requests in ((3, 20), (1, 5)):  # one intake serves round after round
        line = run_round(intake, core, workers, requests)
        assert (line["workers"], line["requests"]) == (workers, requests)
        # Both are rounded from one span (to 0.01 ms, 0.1 us): over a span of a few tenths of a ms, ~1 % apart.
        rounding = 5 / requests + 0.05 + 1e-9
        assert line["span_ms"] > 0
        assert line["us_per_request"] == pytest.approx(line["span_ms"] * 1e3 / requests, abs=rounding)


def test_the_step_loop_stand_in_keeps_adds_only(tiny_checkpoint: Callable[..., Path]) -> None:
    loop = StepLoop(EngineCore(EngineConfig(model=str(tiny_checkpoint("voxcpm2")), device="cpu")))
    loop.submit(object())  # type: ignore[arg-type]  # an abort or the like: not counted
    assert loop.adds == [] and loop.stats().running == 0


def test_main_makes_a_tiny_checkpoint_and_prints_a_line_per_round(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--workers", "2", "--requests", "6", "--rounds", "2"])
    lines = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["workers"], line["requests"]) for line in lines] == [(2, 6), (2, 6)]
