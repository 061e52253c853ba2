"""TTSServer's own rules, without sockets (the server over real sockets: tests/e2e)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.outputs import EngineStats
from wsserver.config import parse_args
from wsserver.server import TTSServer


@dataclass
class Engine:
    """What can_move reads of an engine handle: its health."""

    healthy: bool

    def stats(self) -> EngineStats:
        return EngineStats(0, 0, 0, 8, 0, 0, 0, 0.0, 0.0, healthy=self.healthy)


def test_a_segment_moves_off_a_failed_engine_only_to_a_healthy_one_and_at_most_once_per_engine() -> None:
    server = TTSServer(parse_args([]))
    dead, alive, other_dead = Engine(False), Engine(True), Engine(False)
    server.engines = [dead, alive]  # type: ignore[list-item]
    assert server.can_move(dead, 0) and server.can_move(dead, 1)
    assert not server.can_move(dead, 2)  # routed back to it again and again: fail rather than circle
    assert not server.can_move(alive, 0)  # a healthy engine's error is the request's own (a bad request)
    server.engines = [dead, other_dead]  # type: ignore[list-item]
    assert not server.can_move(dead, 0)  # nowhere to go: the context fails with the engine's error
    server.engines = [dead]  # type: ignore[list-item]
    assert not server.can_move(dead, 0)  # one engine (a single-process server)
