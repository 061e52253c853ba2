"""Soak: do sessions that end every way a client can end one leave anything behind in a server process?

Starts the real server (`python -m wsserver`) on the given checkpoint or a freshly generated tiny random one, and runs
--sessions WebSocket sessions through it, --concurrency at a time, in rounds of --round. Each session opens one
context of one to three sentences and ends in one of these ways, drawn at random (seeded):

- `finish`: reads everything up to `context.done`, closes;
- `cancel`: cancels after its first audio frame, reads up to `context.cancelled`, closes;
- `drop_fin` / `drop_rst`: the client goes without a close handshake (FIN: it closes its socket; RST: its process
  dies with unread data) at a random moment in the first second;
- `slow_reader`: reads one message every --slow-read-ms (its segment pauses in the engine, back-pressure), to the end.

Before the first round and after each round, once the server is idle again (no session, context, queued segment or
engine request left, waited for up to --settle-s) and has rested --rest-s more (an engine gives its freed heap back
to the OS after idling a second: engine.heap), it samples the server's whole process tree (the supervisor, its
engine and worker processes): RSS, processes, threads and open file descriptors (/proc); and from /status the
engine's free KV blocks and the queue (contexts generating and queued). One JSON line per sample. Then SIGTERM, and
the server must exit 0 within its drain timeout.

The run fails (exit 1) unless every resource returns to its plateau: the session, context, queue and engine counts to
0 and the free KV blocks to the pool size after every round; processes, threads and fds after the last round no
higher than the most they reached in the first half of the rounds (after the first round: pools of threads fill on
first use); RSS after the last round within --rss-tolerance of its first-half plateau. The summary line gives
`before` (no session yet), `plateau` (most after the first half) and `after` (last round) for each resource, and
`ok`.

    PYTHONPATH=. python benchmarks/soak.py --sessions 2000                       # CPU, tiny random checkpoint
    python3 benchmarks/soak.py --device cuda --model CKPT --sessions 10000 --concurrency 64 --round 500

Server flags go after `--` (e.g. `-- --max-num-seqs 32`). `--env MALLOC_ARENA_MAX=2` runs the server with that
environment variable (how the RSS plateau depends on glibc's per-thread malloc arenas).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Your order has shipped and should arrive on Thursday.",
    "Could you tell me a little more about what happened?",
    "Sure.",
    "I have moved your meeting to three in the afternoon and sent everyone an updated invitation.",
)
ENDINGS = ("finish", "cancel", "drop_fin", "drop_rst", "slow_reader")
SESSION_TIMEOUT_S = 120.0
START_TIMEOUT_S = 900  # loading a full-size model and capturing its CUDA graphs takes minutes
MIB = 2**20


@dataclass(frozen=True, slots=True)
class Plan:
    text: str
    ending: str
    drop_after_s: float
    seed: int


def make_plan(rng: random.Random) -> Plan:
    text = " ".join(rng.choices(SENTENCES, k=rng.randint(1, 3))) + " "
    return Plan(text, rng.choice(ENDINGS), rng.uniform(0, 1.0), rng.randrange(2**31))


async def until(ws: ClientConnection, types: tuple[str, ...], pause_s: float = 0.0) -> dict[str, Any]:
    """Read until a message of one of `types` (audio frames included in what is read), pausing between reads."""
    while True:
        if pause_s:
            await asyncio.sleep(pause_s)
        data = await ws.recv()
        if isinstance(data, str) and (message := orjson.loads(data))["type"] in types:
            return message


async def run_session(url: str, plan: Plan, slow_read_s: float) -> None:
    ws = await connect(url, open_timeout=60, max_queue=4)
    try:
        await ws.recv()  # hello
        create = {"type": "context.create", "ctx": "c", "text": plan.text, "generation": {"seed": plan.seed}}
        await ws.send(orjson.dumps(create).decode())
        await ws.send('{"type": "context.end", "ctx": "c"}')
        if plan.ending in ("drop_fin", "drop_rst"):
            await asyncio.sleep(plan.drop_after_s)  # reading nothing meanwhile
            ws.transport.close() if plan.ending == "drop_fin" else ws.transport.abort()
            return
        if plan.ending == "cancel":
            while isinstance(first := await ws.recv(), str) and orjson.loads(first)["type"] != "context.done":
                pass
            await ws.send('{"type": "context.cancel", "ctx": "c"}')
            await until(ws, ("context.cancelled", "context.done"))
        else:
            ended = await until(ws, ("context.done", "error"), slow_read_s if plan.ending == "slow_reader" else 0.0)
            if ended["type"] == "error":
                raise RuntimeError(f"session error: {ended}")
        await ws.close()
    finally:
        ws.transport.abort()  # after a clean close this does nothing; after a failure it frees the socket


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return orjson.loads(reply.read())


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it (the server's engine and worker processes)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # a process that ended meanwhile
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


def proc_sample(pid: int) -> dict[str, Any]:
    """RSS, threads and open fds of the server, all its processes together; RSS per process (by pid, the same
    processes from sample to sample), which names the process when RSS moves; and its threads counted by name (digits
    dropped: `asyncio_0` and `asyncio_1` are one pool), which names the pool when the thread count moves."""
    fds = 0
    rss_kb: dict[int, int] = {}
    names: Counter[str] = Counter()
    tree = process_tree(pid)
    for member in tree:
        status = Path(f"/proc/{member}/status").read_text()
        rss_kb[member] = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        for task in Path(f"/proc/{member}/task").iterdir():
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                names[(task / "comm").read_text().strip().rstrip("0123456789")] += 1
        fds += len(os.listdir(f"/proc/{member}/fd"))
    return {
        "rss_mib": round(sum(rss_kb.values()) / 1024, 1),
        "rss_mib_by_pid": {str(member): round(kb / 1024, 1) for member, kb in sorted(rss_kb.items())},
        "processes": len(tree),
        "threads": names.total(),
        "fds": fds,
        "thread_names": dict(sorted(names.items())),
    }


def idle(status: dict[str, Any]) -> bool:
    contexts, engine = status["contexts"], status["engine"]
    return (
        status["connections"]["active"] == 0
        and not any(contexts.values())
        and engine["running"] == engine["waiting"] == engine["paused"] == 0
    )


async def sample(base: str, pid: int, settle_s: float, rest_s: float, sessions: int) -> dict[str, Any]:
    """The server's figures once it is idle and has rested `rest_s` (or after `settle_s`, idle or not: then the run
    fails)."""
    deadline = time.monotonic() + settle_s
    while not idle(status := await asyncio.to_thread(get_json, base + "/status")) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await asyncio.sleep(rest_s)
    return {
        "sessions": sessions,
        "idle": idle(status),
        **proc_sample(pid),
        "kv_blocks_free": status["engine"]["kv_blocks_free"],
        "connections": status["connections"]["active"],
        "contexts_active": status["contexts"]["active"],
        "generating": status["contexts"]["generating"],
        "queued": status["contexts"]["queued"],
    }


def verdict(samples: list[dict[str, Any]], rss_tolerance: float) -> dict[str, Any]:
    """before / plateau / after per resource, and whether each returned to its plateau (module docstring)."""
    before, rounds = samples[0], samples[1:]
    first_half = rounds[: max(1, len(rounds) // 2)]
    after = rounds[-1]
    summary: dict[str, Any] = {}
    for key in ("rss_mib", "processes", "threads", "fds"):
        plateau = max(s[key] for s in first_half)
        limit = plateau * (1 + rss_tolerance) if key == "rss_mib" else plateau
        summary[key] = {"before": before[key], "plateau": plateau, "after": after[key], "ok": after[key] <= limit}
    top = max(first_half, key=lambda s: s["threads"])["thread_names"]
    summary["threads"]["grew"] = {
        name: [top.get(name, 0), count] for name, count in after["thread_names"].items() if count > top.get(name, 0)
    }
    # Which processes' RSS rose from the end of the first round (warm) to the last, in MiB, largest first.
    warm = rounds[0]["rss_mib_by_pid"]
    rose = {pid: round(mib - warm[pid], 1) for pid, mib in after["rss_mib_by_pid"].items() if pid in warm}
    summary["rss_mib"]["rose"] = dict(sorted(rose.items(), key=lambda item: -item[1])[:4])
    pool = before["kv_blocks_free"]
    summary["kv_blocks_free"] = {
        "before": pool,
        "plateau": min(s["kv_blocks_free"] for s in rounds),
        "after": after["kv_blocks_free"],
        "ok": all(s["kv_blocks_free"] == pool for s in rounds),
    }
    for key in ("connections", "contexts_active", "generating", "queued"):
        summary[key] = {
            "before": before[key],
            "plateau": max(s[key] for s in rounds),
            "after": after[key],
            "ok": all(s[key] == 0 for s in rounds),
        }
    summary["ok"] = all(s["idle"] for s in rounds) and all(v["ok"] for v in summary.values() if isinstance(v, dict))
    return summary


async def soak(args: argparse.Namespace, base: str, pid: int) -> list[dict[str, Any]]:
    url = base.replace("http://", "ws://") + "/v1/tts/ws"
    rng = random.Random(args.seed)
    at_once = asyncio.Semaphore(args.concurrency)
    failures: dict[str, int] = {}
    endings: dict[str, int] = {}

    async def one(plan: Plan) -> None:
        async with at_once:
            endings[plan.ending] = endings.get(plan.ending, 0) + 1
            try:
                async with asyncio.timeout(SESSION_TIMEOUT_S):
                    await run_session(url, plan, args.slow_read_ms / 1000)
            except (OSError, ConnectionClosed, RuntimeError, TimeoutError) as exc:
                failures[type(exc).__name__] = failures.get(type(exc).__name__, 0) + 1

    samples = [await sample(base, pid, args.settle_s, args.rest_s, 0)]
    print(orjson.dumps(samples[-1]).decode(), flush=True)
    done = 0
    while done < args.sessions:
        count = min(args.round, args.sessions - done)
        started = time.monotonic()
        await asyncio.gather(*(one(make_plan(rng)) for _ in range(count)))
        done += count
        samples.append(await sample(base, pid, args.settle_s, args.rest_s, done))
        line = samples[-1] | {"round_s": round(time.monotonic() - started, 1), "failures": failures, "endings": endings}
        print(orjson.dumps(line).decode(), flush=True)
    return samples


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_ready(base: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before it was ready")
        with contextlib.suppress(OSError, urllib.error.HTTPError):  # not listening, or 503 while loading
            get_json(base + "/ready")
            return
        time.sleep(0.5)
    raise RuntimeError(f"the server was not ready after {START_TIMEOUT_S} s")


def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            from engine.models.voxcpm.make_checkpoint import make_checkpoint

            # No stop head: every segment runs to its patch cap, so sessions last long enough to be dropped mid-way.
            model = str(make_checkpoint("voxcpm2", "tiny", Path(scratch) / "tiny", no_stop=True))
        port = free_port()
        command = [sys.executable, "-m", "wsserver", "--model", model, "--device", args.device, "--port", str(port)]
        command += ["--drain-timeout-s", str(args.drain_timeout_s), *args.server_args]
        env = os.environ | dict(item.split("=", 1) for item in args.env)
        server = subprocess.Popen(command, stdout=sys.stderr, env=env)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_ready(base, server)
            samples = asyncio.run(soak(args, base, server.pid))
            summary = verdict(samples, args.rss_tolerance)
            stopped = time.monotonic()
            server.send_signal(signal.SIGTERM)
            try:
                exit_code = server.wait(timeout=args.drain_timeout_s)
            except subprocess.TimeoutExpired:
                exit_code = None
            summary["sigterm"] = {
                "exit_code": exit_code,
                "seconds": round(time.monotonic() - stopped, 2),
                "ok": exit_code == 0,
            }
            summary["ok"] = summary["ok"] and summary["sigterm"]["ok"]
            print(orjson.dumps({"summary": summary}).decode(), flush=True)
            return 0 if summary["ok"] else 1
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=10000)
    parser.add_argument("--concurrency", type=int, default=30, help="sessions open at once")
    parser.add_argument("--round", type=int, default=500, help="sessions between two samples")
    parser.add_argument("--model", default=None, help="checkpoint; default: a freshly generated tiny random one")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--slow-read-ms", type=float, default=50.0, help="a slow reader's pause between messages")
    parser.add_argument("--settle-s", type=float, default=30.0, help="how long a round may take to go idle")
    parser.add_argument("--rest-s", type=float, default=2.0, help="idle this long before a sample (engine.heap)")
    parser.add_argument("--rss-tolerance", type=float, default=0.05, help="RSS after / first-half plateau - 1")
    parser.add_argument("--drain-timeout-s", type=float, default=10.0, help="the server's; SIGTERM must end it")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="for the server process")
    parser.add_argument("server_args", nargs="*", help="after --: flags for python -m wsserver")
    sys.exit(main(parser.parse_args()))
