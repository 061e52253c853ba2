"""The server as deployed: a supervisor, engine processes and worker processes (`python -m wsserver`).

Sessions spread over the workers (the supervisor deals each accepted connection to the worker with the fewest open)
and their segments over the engines (the coordinator grants each to the engine with the most free slots); the
guarantees hold across processes, and a process that dies takes only its own work with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from tests.e2e.client import Client, Frame, http_get
from tests.servers import ServerProcess, server_process, until

TEXT = "The quick brown fox jumps over the lazy dog. "


async def speak(server: ServerProcess, ctx: str = "c", text: str = TEXT) -> dict:
    client = await Client.connect(server.ws)
    try:
        await client.send("context.create", ctx=ctx, text=text)
        await client.send("context.end", ctx=ctx)
        return await client.until_ended(ctx, timeout=120)
    finally:
        await client.close()


async def sessions_on_both_workers(server: ServerProcess, count: int) -> list[Client]:
    """Open `count` sessions, which the supervisor deals over the two workers."""
    clients = [await Client.connect(server.ws) for _ in range(count)]
    workers = (await server.status())["worker_processes"]
    assert all(w["connections"] > 0 for w in workers), workers
    return clients


async def test_a_burst_of_sessions_is_dealt_evenly_over_the_workers(tiny_checkpoint: Callable[..., Path]) -> None:
    """12 sessions at once on 3 workers: 4 each (the kernel's SO_REUSEPORT hash split them so 1 time in 15). Those
    that close free their worker's share: the next sessions go where the fewest are open."""
    async with server_process(tiny_checkpoint("voxcpm2", stop=False), "--workers", "3") as server:
        clients = await asyncio.gather(*(Client.connect(server.ws) for _ in range(12)))

        async def counts() -> list[int]:
            return sorted(w["connections"] for w in (await server.status())["worker_processes"])

        assert await counts() == [4, 4, 4]
        for client in clients[:4]:
            await client.close()
        await until(lambda: _total(counts(), 8))
        await asyncio.sleep(1.0)  # the workers' sweeps tell the supervisor of the closed ones (every 0.1 s)
        clients = clients[4:] + [await Client.connect(server.ws) for _ in range(4)]
        assert await counts() == [4, 4, 4]
        for client in clients:
            await client.close()


async def _total(counts: Awaitable[list[int]], total: int) -> bool:
    return sum(await counts) == total


async def test_segments_spread_over_two_engines(tiny_checkpoint: Callable[..., Path]) -> None:
    args = ("--workers", "2", "--devices", "cpu,cpu", "--max-patches", "6")
    async with server_process(tiny_checkpoint("voxcpm2", stop=False), *args) as server:
        status = await server.status()
        assert status["workers"] == 2 and len(status["engines"]) == 2
        pids = {engine["pid"] for engine in status["engines"]}
        assert len(pids) == 2 and status["engine"]["slots"] == 2 * status["engines"][0]["slots"]
        steps = [engine["steps"] for engine in status["engines"]]
        done = await asyncio.gather(*(speak(server, f"c{i}") for i in range(8)))
        assert all(d["type"] == "context.done" for d in done)

        async def both_stepped() -> bool:
            # The worker that answers hears of an engine's steps with that engine's chunks for its own sessions, or
            # from the engine's idle report (every 0.25 s): all of its sessions may have gone to the other engine.
            engines = (await server.status())["engines"]
            return all(engine["steps"] > before for engine, before in zip(engines, steps, strict=True))

        await until(both_stepped, timeout=10)
        status = await server.status()
        # the coordinator's count of the segments it routed to each engine (8 contexts, a segment or more each)
        assert all(engine["segments"] > 0 for engine in status["engines"])
        assert sum(engine["segments"] for engine in status["engines"]) >= 8
        assert [engine["generating"] for engine in status["engines"]] == [0, 0]
        assert status["contexts"] == {"active": 0, "generating": 0, "queued": 0, "paused": 0}
        metrics = (await http_get(server.http + "/metrics"))[2].decode()
        assert 'ttsws_contexts_total{outcome="done"} 8' in metrics and "ttsws_engines_healthy 2.0" in metrics


async def test_a_worker_killed_under_load_takes_only_its_sessions(tiny_checkpoint: Callable[..., Path]) -> None:
    async with server_process(
        tiny_checkpoint("voxcpm2", stop=False), "--workers", "2", "--max-patches", "40"
    ) as server:
        clients = await sessions_on_both_workers(server, 4)
        victim = (await server.status())["worker_processes"][0]
        for client in clients:
            await client.send("context.create", ctx="c", text=TEXT * 3)
            await client.send("context.end", ctx="c")
        for client in clients:
            await client.until_message("segment.started", "c")
        os.kill(victim["pid"], signal.SIGKILL)

        async def outcome(client: Client) -> str:
            try:
                return (await client.until_ended("c", timeout=120))["type"]
            except ConnectionClosed:
                return "lost"

        outcomes = await asyncio.gather(*(outcome(client) for client in clients))
        assert outcomes.count("lost") == victim["connections"]
        assert outcomes.count("context.done") == len(clients) - victim["connections"]

        async def restarted() -> bool:
            status = await server.status()
            pids = {w["pid"] for w in status["worker_processes"]}
            return len(pids) == 2 and victim["pid"] not in pids

        await until(restarted)
        for client in clients:
            with contextlib.suppress(ConnectionClosed):
                await client.close()

        async def freed() -> bool:  # the dead worker's seats and slots came back, and the others' once they closed
            status = await server.status()
            return status["connections"]["active"] == 0 and status["contexts"]["generating"] == 0

        await until(freed)
        assert (await server.status())["can_accept"] and (await speak(server))["type"] == "context.done"


async def test_an_engine_killed_under_load_fails_every_context_clearly(tiny_checkpoint: Callable[..., Path]) -> None:
    args = ("--workers", "2", "--max-patches", "400")
    async with server_process(tiny_checkpoint("voxcpm2", stop=False), *args) as server:
        clients = await sessions_on_both_workers(server, 3)
        for client in clients:
            await client.send("context.create", ctx="c", text=TEXT)
            await client.send("context.end", ctx="c")
        for client in clients:
            await client.until_message("segment.started", "c")
        [engine] = (await server.status())["engines"]
        os.kill(engine["pid"], signal.SIGKILL)
        for client in clients:
            ended = await client.until_ended("c", timeout=60)
            assert ended["type"] == "error" and ended["code"] == "internal" and "engine" in ended["message"]

        async def unready() -> bool:
            return (await http_get(server.http + "/ready"))[0] == 503

        await until(unready, timeout=10)
        assert (await http_get(server.http + "/health"))[0] == 503  # nothing left to serve with: restart me
        for client in clients:
            await client.close()


async def test_one_of_two_engines_killed_fails_only_its_contexts(tiny_checkpoint: Callable[..., Path]) -> None:
    args = ("--workers", "2", "--devices", "cpu,cpu", "--max-patches", "150")
    async with server_process(tiny_checkpoint("voxcpm2", stop=False), *args) as server:
        clients = await sessions_on_both_workers(server, 6)
        for client in clients:
            await client.send("context.create", ctx="c", text=TEXT)
            await client.send("context.end", ctx="c")
        for client in clients:  # audio from every segment: none may move to the other engine (can_move)
            await client.until(lambda event: isinstance(event, Frame))

        def held(engine: dict[str, int]) -> int:
            return engine["running"] + engine["paused"] + engine["waiting"]

        async def reported() -> bool:  # the engines' figures reach /status with their next step
            return sum(held(engine) for engine in (await server.status())["engines"]) == len(clients)

        await until(reported, timeout=10)
        victim, survivor = (await server.status())["engines"]
        assert held(victim) > 0 and held(survivor) > 0  # most free slots first: both engines took segments
        os.kill(victim["pid"], signal.SIGKILL)
        # every client reads at once: one that waited its turn would be cut off for not reading (stall timeout)
        ended = await asyncio.gather(*(client.until_ended("c", timeout=120) for client in clients))
        failed = [e for e in ended if e["type"] == "error"]
        assert all(e["code"] == "internal" and "engine" in e["message"] for e in failed)
        assert len(failed) == held(victim) and len(ended) - len(failed) == held(survivor)

        async def one_engine_left() -> bool:
            return sum(engine["healthy"] for engine in (await server.status())["engines"]) == 1

        await until(one_engine_left, timeout=10)
        assert (await http_get(server.http + "/ready"))[0] == 200  # the other engine still serves
        assert (await speak(server, "after"))["type"] == "context.done"
        for client in clients:
            await client.close()


async def test_segments_a_dying_engine_had_not_started_move_to_the_other(tiny_checkpoint: Callable[..., Path]) -> None:
    """A segment whose engine dies before its first chunk runs again on the other engine, WebSocket and HTTP alike:
    nothing of it had reached the client, so its context ends with all its audio instead of an error."""
    args = ("--workers", "2", "--devices", "cpu,cpu", "--max-patches", "150")
    async with server_process(tiny_checkpoint("voxcpm2", stop=False), *args) as server:
        stalled = (await server.status())["engines"][1]
        os.kill(stalled["pid"], signal.SIGSTOP)  # it is granted segments but makes nothing of them
        clients = await sessions_on_both_workers(server, 3)
        speakers = clients[: len(clients) - 1 + len(clients) % 2]  # an odd number: engine 0 gets one more
        for client in speakers:  # one by one, so that the grants alternate (most free slots first, ties to engine 0)
            await client.send("context.create", ctx="c", text=TEXT)
            await client.send("context.end", ctx="c")
            await client.until_message("segment.started", "c")
        async with httpx.AsyncClient(base_url=server.http, timeout=120) as http:
            body = {"input": TEXT, "voice": "default", "response_format": "pcm"}
            speech = asyncio.create_task(http.post("/v1/audio/speech", json=body))

            async def all_granted() -> bool:
                return [e["generating"] for e in (await server.status())["engines"]] == [
                    (len(speakers) + 1) // 2,
                    (len(speakers) - 1) // 2 + 1,  # the speech request too: engine 1 had the most free slots
                ]

            await until(all_granted, timeout=10)
            os.kill(stalled["pid"], signal.SIGKILL)
            ended = await asyncio.gather(*(client.until_ended("c", timeout=120) for client in speakers))
            assert [e["type"] for e in ended] == ["context.done"] * len(speakers)
            assert len({e["audio_ms"] for e in ended}) == 1  # the moved contexts got all their audio
            moved = await speech
            assert moved.status_code == 200
            assert len(moved.content) == len((await http.post("/v1/audio/speech", json=body)).content) > 0
        assert [e["healthy"] for e in (await server.status())["engines"]] == [True, False]
        for client in clients:
            await client.close()


async def test_a_client_that_never_reads_is_cut_off_while_the_others_stream(
    tiny_checkpoint: Callable[..., Path],
) -> None:
    args = ("--workers", "2", "--max-patches", "60", "--stall-timeout-s", "2", "--send-buffer-bytes", "16384")
    async with server_process(tiny_checkpoint("voxcpm2", stop=False), *args) as server:
        # websockets' client stops reading its socket once max_queue messages wait unread: a client that never reads.
        stuck = await Client.connect(server.ws, max_queue=1)
        await stuck.send("context.create", ctx="s", text=TEXT * 4, output={"sample_rate": 48000})
        await stuck.send("context.end", ctx="s")
        done = await asyncio.gather(*(speak(server, f"c{i}", TEXT * 2) for i in range(4)))
        assert all(d["type"] == "context.done" for d in done)

        async def cut_off() -> bool:
            return (await server.status())["connections"]["active"] == 0

        await until(cut_off, timeout=30)
        with pytest.raises(ConnectionClosed):
            while True:
                await stuck.ws.recv()
        status = await server.status()
        assert status["contexts"]["generating"] == 0 and status["engine"]["paused"] == 0


async def test_connect_and_disconnect_cycles_leak_nothing(tiny_checkpoint: Callable[..., Path]) -> None:
    """1,000 sessions over both workers: opened and closed, half with a context cancelled or dropped mid-stream."""
    async with server_process(
        tiny_checkpoint("voxcpm2", stop=False), "--workers", "2", "--max-patches", "20"
    ) as server:
        before = await server.status()
        tree = _tree(server.process.pid)
        fds = {pid: _fds(pid) for pid in tree}

        async def cycle(i: int) -> None:
            client = await Client.connect(server.ws)
            if i % 2:
                await client.send("context.create", ctx="c", text=TEXT)
                if i % 4 == 1:
                    await client.send("context.cancel", ctx="c")
                    await client.until_ended("c")
                else:
                    await client.until_message("context.created", "c")
                    client.ws.transport.abort()  # gone without a close
                    return
            await client.close()

        for start in range(0, 1000, 50):
            await asyncio.gather(*(cycle(i) for i in range(start, start + 50)))

        statuses: list[tuple[float, dict]] = []

        async def settled() -> bool:
            # Settled for longer than the engine's idle report takes to come (every 0.25 s): a worker's view of the
            # engine is that of the last message it got from it, and an idle report whose figures were read just
            # before a step's can reach the worker after that step's items, so one settled read may precede a stale
            # one (engine.process: report() reads the stats before it queues them).
            status = await server.status()
            engine = status["engine"]
            # an abort reaches the engine process a moment after the worker lets go of its context
            idle = engine["running"] == engine["paused"] == engine["waiting"] == 0
            if not (status["connections"]["active"] == 0 and status["contexts"]["generating"] == 0 and idle):
                statuses.clear()
                return False
            statuses.append((time.monotonic(), status))
            return statuses[-1][0] - statuses[0][0] >= 0.3

        await until(settled)
        after = statuses[-1][1]
        assert after["contexts"] == {"active": 0, "generating": 0, "queued": 0, "paused": 0}
        assert after["engine"]["running"] == after["engine"]["paused"] == after["engine"]["waiting"] == 0
        assert after["engine"]["kv_blocks_free"] == before["engine"]["kv_blocks_free"]
        assert _tree(server.process.pid) == tree  # no process died, none was added
        for pid, count in fds.items():
            assert _fds(pid) <= count + 2, f"process {pid} holds {_fds(pid) - count} more file descriptors"
        assert not [name for name in os.listdir("/dev/shm") if "voxstream" in name]


def _tree(root: int) -> set[int]:
    """A process and all its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))
