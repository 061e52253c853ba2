"""End to end over the WebSocket: first text to first audio frame, starvation, throughput and the CPU of every server
process, per output format and session count.

Starts the real server (`python -m wsserver`: a supervisor, an engine process per device and front-end worker
processes; `--workers 0` keeps one process) in a child process, sized for the largest session count, on the given
checkpoint or a freshly generated tiny random one; or measures a running server (`--url`; its max connections and
engine slots must cover the sessions). `--device` is the server's `--devices`: `0,1` is one engine per GPU,
`cpu,cpu` two CPU engines. For each setting (`--format` with its `--sample-rate`) and session count it opens that
many sessions, then starts them together: each streams a few sentences word by word (one word every --word-gap-ms,
like an LLM), ends its context and reads its frames until `context.done`. The frames are not decoded: their durations
are counted from the packets (an Opus packet's TOC byte), so one client process carries 512 and more sessions.
Before the first level of a setting, twice as many sessions as the server has workers speak once, unmeasured (the
first context of a format in a worker takes paths the engine's own warm-up does not).

The sessions run in `--client-processes N` spawned processes (default 1), each on its own uvloop, session k in
process k mod N: all open their sessions, then start together (a barrier), and their results make one line. A single
client process saturates a core at several hundred xRT of Opus; then the figures would be the client's limit.
`--client-cpus 12-15` keeps the clients on those CPUs and the server this script starts off them: on one host, a
burst's clients and the server's processes otherwise share the cores, and whichever the scheduler puts together run
late (a load generator belongs on other cores than the system it measures).

`--kill-engine I --kill-after-s S` SIGKILLs engine I (its pid from /status; the server this script starts) S seconds
after the sessions of the last level (of the last setting) start, so the levels before measure every engine: the
contexts that engine held fail, the others go on, their next segments on the engines left (the supervisor does not
restart an engine). A level that ends sooner than S kills nothing.

One JSON line per setting and session count. A session that ends without `context.done` does not stop the run: it
is counted in `sessions_failed` and left out of every other figure, which are over the finished sessions only.

- `sessions`, `format`, `sample_rate` (as the server resolved it), `workers` and `engines` (processes serving; 0
  workers: the server is one process), `client_processes`; `client_cpus` and `server_cpus`: the CPUs each side's
  processes may run on (their affinity, as a list like `12-15`; null where unknown);
- `sessions_finished`; `sessions_failed`: the others by their error code (`{"internal": 37}`: contexts whose engine
  died; `cancelled`, `connection_lost`), with one message per code in `failure_messages`;
- `first_text_to_first_frame_ms`: from sending the first word to receiving the first audio frame (p50, p90, p95, p99,
  max over the sessions);
- `worst_gap_ms` (all sessions) and `worst_gap_p95_ms` (of each session's worst) between consecutive audio frames;
- `starved_sessions`: sessions whose player ran dry, i.e. some frame arrived later after the first frame than the
  audio delivered ahead of it lasts; `starved_ms_total`: how long their players waited in all (a player that
  starts at the first frame and, when it runs dry, waits for the next frame and plays on); `dry_at_audio_s`: min,
  p50 and max over the starved sessions of where in its audio each first ran dry (a burst's start: within the
  first patches; a segment boundary: at a multiple of the segment's audio);
- `server_ttfa_ms_p50`, `server_queue_ms_p50`, `server_rtf_p50`: the server's own figures from `context.done`;
- `audio_s`, `wall_s`, `xrt`: audio delivered to all sessions (counted from the frames), from the start to the last
  `context.done`, and their ratio (aggregate xRT); `audio_s_per_session`; `server_audio_s`: the audio the server
  says it sent (`context.done`'s `audio_ms`), which `audio_s` must equal; `started_monotonic_s`: when the speaking
  started on the host's monotonic clock, which the engines' step traces (`--server-args="--step-trace-dir DIR"`) use;
- `worker_connections`: each worker's sessions once all are connected, fewest first (one number for a server in one
  process); the supervisor deals a new connection to the worker with the fewest open;
- `cpu`: CPU over the measurement window (`window_s`, the same span as `wall_s`), per role: `client` (the client
  processes, each measuring its own), and from /proc/PID/stat the server's `supervisor`, `engines` and `workers` (pids
  from /status; a server in one process is `server`). Each role: `processes`, `cpu_s` (summed), `util` (cpu_s /
  window: 1.0 is one core busy), `cpu_s_max` and `util_max` (its busiest process). A role near `processes` x 1.0, or a
  single process near 1.0, is the bottleneck; the client near 1.0 means the figures are the client's limit, not the
  server's. A role is null when its processes cannot be read (a server on another host);
- `client_lag_ms`: how late the client processes' event loops woke, over ticks every 5 ms while the sessions spoke
  (p50, p99, max over all the processes' ticks). A frame that arrives while its client's loop lags is timestamped
  that late: lags near the frames' gaps mean the starvation and gap figures are partly the client's;
- `engine`: all engines' step time, batch size and running contexts (means of /status samples taken every 0.25 s
  while the server generated; the step time is the engines' mean, the others their sums);
- `engines_detail`: per engine (`index` in /status): `pid`, `segments` granted to it during the level, `healthy` at
  its end, and over the same samples its own mean `step_ms`, `batch_size` and `running` (the engine's figures) and
  `generating` (the server's: segments holding its slots); `engine_spread_pct`: (max - min) / mean of the engines'
  `segments`, in percent (null with one engine);
- `killed_engine` (null unless this level killed one): `index`, `pid`, `at_s` (after the start), its `running` and
  `generating` in /status just before (`running_at_kill`, `generating_at_kill`: at most that many contexts fail;
  a segment it had not made audio for yet moves to an engine left),
  `segments_granted_before_kill` (during the level) and `ready_after` (/ready's HTTP status after the level: 200
  while an engine serves);
- `opus_frames`: the Opus frames the server encoded during the level, by encoder complexity (`{"10": 9000, "6": 600}`:
  a busy worker lowers it, wsserver/opus_load.py), from /metrics before and after.

`--server-args='--pace-admissions off'` passes more flags to the server it starts (an A/B of one engine setting); each
line repeats them (`server_args`).

`--profile-sessions N --profile-out FILE` also records the server's processes with py-spy (collapsed stacks of every
thread of every process, `py-spy record --subprocesses --format raw`) while the level of N sessions runs.

    PYTHONPATH=. python benchmarks/ws_latency.py --sessions 1 8                 # CPU, tiny random checkpoint
    python3 benchmarks/ws_latency.py --device cuda --model CKPT                 # sessions 1 32 128 256, PCM
    python3 benchmarks/ws_latency.py --device cuda --model CKPT --max-patches 60 --sessions 1 512 \\
        --format opus pcm_s16le --sample-rate 48000 24000                       # Opus 48 kHz, then PCM 24 kHz
    python3 benchmarks/ws_latency.py --device 0,1 --model CKPT --max-patches 60 --sessions 768 --format opus \\
        --client-processes 4 --kill-engine 1 --kill-after-s 5                   # two GPUs, one engine killed
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import multiprocessing
import os
import re
import resource
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import uvloop

from wsserver.client import Cancelled, Client, ConnectionLost, ContextFailed, Done, Packet, Refused
from wsserver.config import EngineDevice, ServerConfig
from wsserver.messages import MULAW_RATE, OPUS_RATES

TEXT = (
    "Thanks for calling, I can help you with that right away. Your appointment is now booked for Tuesday "
    "afternoon, and you will get a reminder the day before. Is there anything else I can do for you today?"
)
FORMATS = ("pcm_s16le", "opus", "mulaw")
FRAME_MS = 20
START_TIMEOUT_S = 900  # loading a full-size model and capturing its CUDA graphs takes minutes
# Bounded handshakes at a time: a burst of hundreds of simultaneous TCP handshakes overflows accept backlogs (the
# in-process server listens with asyncio's default of 100), and dropped SYNs come back only a second later.
CONCURRENT_HANDSHAKES = 64
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
BARRIER_TIMEOUT_S = 600  # client processes wait this long for each other's sessions to connect
LAG_TICK_S = 0.005  # how often a client process looks at its own event loop's lateness (watch_lag)


@dataclass(frozen=True, slots=True)
class Setting:
    format: str
    sample_rate: int | None  # None: the format's default (the model's rate for PCM, 48 kHz for Opus, 8 kHz mu-law)


@dataclass(frozen=True, slots=True)
class SessionResult:
    first_frame_s: float  # first word sent -> first audio frame received
    worst_gap_s: float  # longest wait between two consecutive audio frames
    starved_s: float  # time the player's buffer was empty, 0 if it never ran dry
    dry_at_audio_s: float | None  # where in its audio the player first ran dry (None: never)
    audio_s: float  # counted from the frames
    sample_rate: int  # as the server resolved it
    done: Done


@dataclass(frozen=True, slots=True)
class Failure:
    """A session that ended without `context.done`: the protocol's error code (`internal` for a context whose
    engine died), `cancelled`, or `connection_lost`, and what the server or the client said."""

    code: str
    message: str


def check_setting(setting: Setting, hello: dict[str, Any] | None) -> None:
    """ValueError unless the server can produce `setting`: the format among `hello.formats`, a PCM rate among
    `hello.sample_rates`; Opus and mu-law rates are the protocol's (checked without a hello, before a server starts)."""
    fmt, rate = setting.format, setting.sample_rate
    if fmt == "opus" and rate is not None and rate not in OPUS_RATES:
        raise ValueError(f"opus takes --sample-rate {', '.join(map(str, OPUS_RATES))}, not {rate}")
    if fmt == "mulaw" and rate not in (None, MULAW_RATE):
        raise ValueError(f"mulaw is {MULAW_RATE} Hz only, not {rate}")
    if hello is None:
        return
    if fmt not in hello["formats"]:
        raise ValueError(f"the server offers {', '.join(hello['formats'])}, not {fmt}")
    if fmt.startswith("pcm") and rate is not None and rate not in hello["sample_rates"]:
        rates, native = ", ".join(map(str, hello["sample_rates"])), hello["model"]["sample_rate"]
        raise ValueError(f"the server's PCM rates are {rates} (the model's is {native}), not {rate}")


def settings_from(formats: list[str], rates: list[int] | None) -> list[Setting]:
    """`--format` and `--sample-rate`: one rate for every format, or one per format."""
    if rates is None:
        return [Setting(fmt, None) for fmt in formats]
    if len(rates) == 1:
        rates = rates * len(formats)
    if len(rates) != len(formats):
        raise ValueError(f"give one --sample-rate, or one per --format ({len(formats)}), not {len(rates)}")
    settings = [Setting(fmt, rate) for fmt, rate in zip(formats, rates, strict=True)]
    for setting in settings:
        check_setting(setting, None)
    return settings


def spread(values: list[float]) -> dict[str, float] | None:
    """min, p50 and max of `values` (None when there are none)."""
    if not values:
        return None
    return {"min": round(min(values), 3), "p50": round(statistics.median(values), 3), "max": round(max(values), 3)}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def server_p50(results: list[SessionResult], key: str) -> float | None:
    """Median of a `context.done` metric over the sessions that have it (ttfa_ms is null without audio)."""
    values = [r.done.metrics[key] for r in results if r.done.metrics[key] is not None]
    return round(statistics.median(values), 3) if values else None


def playback(arrivals: list[tuple[float, int]], sample_rate: int) -> tuple[float, float, float | None]:
    """(worst gap, starved time, audio position of the first rebuffering or None) in seconds, for audio frames given
    as (arrival time, samples).

    The player starts with the first frame. Frame k is due when the audio before it has played, i.e. `delivered /
    sample_rate` after the start plus the time the player already spent waiting; arriving later than that, the
    player waits for it (rebuffers) and plays on from there. Where it first does tells a burst's start (within the
    first patches) from a segment boundary."""
    start = previous = arrivals[0][0]
    worst = starved = 0.0
    dry_at = None
    delivered = 0
    for arrival, samples in arrivals:
        worst = max(worst, arrival - previous)
        wait = arrival - (start + starved + delivered / sample_rate)
        if wait > 0:
            starved += wait
            dry_at = delivered / sample_rate if dry_at is None else dry_at
        delivered += samples
        previous = arrival
    return worst, starved, dry_at


async def open_session(url: str, handshakes: asyncio.Semaphore) -> Client:
    client = Client(url, open_timeout_s=60)
    async with handshakes:
        await client.connect()
    return client


async def speak(client: Client, seed: int, text: str, word_gap_s: float, setting: Setting) -> SessionResult | Failure:
    """One context on an open session: stream `text` word by word, end it, and time every audio frame; or how it
    failed."""
    output: dict[str, Any] = {"format": setting.format, "frame_ms": FRAME_MS}
    if setting.sample_rate is not None:
        output["sample_rate"] = setting.sample_rate
    # Frames as sent: their samples are counted from the packets, nothing is decoded.
    ctx = await client.context("b", output=output, generation={"seed": seed}, decode=False)
    first, *rest = (word + " " for word in text.split())

    async def feed() -> None:
        for word in rest:
            await asyncio.sleep(word_gap_s)
            await ctx.append(word)
        await ctx.end()

    started = time.perf_counter()
    await ctx.append(first)
    feeder = asyncio.create_task(feed())
    arrivals: list[tuple[float, int]] = []  # audio frames with samples
    try:
        async for event in ctx:
            if isinstance(event, Packet):
                arrivals.append((time.perf_counter(), event.samples))
            elif isinstance(event, Done):
                await feeder
                worst_gap, starved, dry_at = playback(arrivals, ctx.sample_rate)
                audio_s = sum(samples for _, samples in arrivals) / ctx.sample_rate
                first_frame = arrivals[0][0] - started
                return SessionResult(first_frame, worst_gap, starved, dry_at, audio_s, ctx.sample_rate, event)
            elif isinstance(event, Refused):
                return Failure(event.code, event.message)
            elif isinstance(event, Cancelled):
                return Failure("cancelled", f"cancelled by the server after frame {event.last_seq}")
    except ContextFailed as failed:
        return Failure(failed.code, failed.message)
    except ConnectionLost as lost:
        return Failure("connection_lost", str(lost))
    finally:
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError, ContextFailed, ConnectionLost):
            await feeder  # appends to a context that failed may fail too
    return Failure("connection_lost", "connection closed before context.done")


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, all its threads) of process `pid` so far; None if it cannot be read (it ended, or
    it runs on another host)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def parent_pid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def worker_connections(samples: list[dict[str, Any]]) -> list[int] | None:
    """Each worker's sessions, fewest first, in the first /status sample of the level (every session connected)."""
    if not samples or "worker_processes" not in samples[0]:
        return None
    return sorted(worker["connections"] for worker in samples[0]["worker_processes"])


def server_roles(status: dict[str, Any], supervisor: int | None) -> dict[str, list[int]]:
    """The server's processes by role, from /status: the engines, the workers and their supervisor (the server this
    script started, or the workers' common parent); a server in one process (`--workers 0`) is one role, `server`."""
    engines = [engine["pid"] for engine in status["engines"] if engine["pid"] is not None]
    workers = [worker["pid"] for worker in status["worker_processes"]]
    if set(engines) == set(workers):
        return {"server": workers}
    if supervisor is None:
        parents = {parent_pid(pid) for pid in engines + workers}
        supervisor = parents.pop() if len(parents) == 1 else None
    roles = {"engines": engines, "workers": workers}
    return {"supervisor": [supervisor], **roles} if supervisor is not None else roles


def allowed_cpus(pid: int) -> set[int]:
    """The CPUs process `pid` may run on (empty if it cannot be read: gone, or on another host)."""
    try:
        return os.sched_getaffinity(pid)
    except OSError:
        return set()


def parse_cpus(text: str) -> set[int]:
    """A CPU list as taskset and /proc write it: "12-15", "0,2-3"."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def cpu_list(cpus: set[int]) -> str | None:
    """`parse_cpus`'s inverse ("0-11,14"); None for no CPUs."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs) or None


def cpu_snapshot(pids: list[int]) -> dict[int, float | None]:
    return {pid: process_cpu_s(pid) for pid in pids}


def role_cpu(cpu_s: list[float], window_s: float) -> dict[str, Any]:
    return {
        "processes": len(cpu_s),
        "cpu_s": round(sum(cpu_s), 3),
        "util": round(sum(cpu_s) / window_s, 3),
        "cpu_s_max": round(max(cpu_s), 3),
        "util_max": round(max(cpu_s) / window_s, 3),
    }


def cpu_report(
    roles: dict[str, list[int]],
    before: dict[int, float | None],
    after: dict[int, float | None],
    client_cpu_s: list[float],
    window_s: float,
) -> dict[str, Any]:
    """Per role, the CPU its processes spent between the two snapshots; null for a role with a process that could
    not be read at either end (a worker restarted meanwhile, a server on another host). `client_cpu_s`: each client
    process's, measured by itself."""
    report: dict[str, Any] = {"window_s": round(window_s, 3), "client": role_cpu(client_cpu_s, window_s)}
    for role, pids in roles.items():
        spent = [after[pid] - before[pid] for pid in pids if before[pid] is not None and after[pid] is not None]
        report[role] = role_cpu(spent, window_s) if len(spent) == len(pids) else None
    return report


@dataclass(frozen=True, slots=True)
class Share:
    """What one client process did in a level: its sessions' outcomes, when they started speaking and when the last
    ended (time.monotonic(), one clock for every process of the host), and its CPU time meanwhile."""

    outcomes: list[SessionResult | Failure]
    started: float
    ended: float
    cpu_s: float
    lags_s: list[float]  # how late its event loop woke for each LAG_TICK_S tick meanwhile
    cpus: set[int]  # the CPUs it may run on


_barrier: threading.Barrier | None = None  # a client process's: shared with the others and the parent


def _join(barrier: threading.Barrier, cpus: set[int] | None) -> None:
    global _barrier
    _barrier = barrier
    if cpus is not None:
        os.sched_setaffinity(0, cpus)


def client_share(url: str, seeds: list[int], text: str, word_gap_s: float, setting: Setting, handshakes: int) -> Share:
    """A client process's part of a level (its own uvloop): open a session per seed, wait for every process's
    sessions to be open, wait for the go (the parent's CPU snapshot comes between), then speak all at once."""
    try:
        return uvloop.run(_client_share(url, seeds, text, word_gap_s, setting, handshakes))
    except threading.BrokenBarrierError:
        raise  # another process failed: the parent reports that one's error
    except Exception as error:
        # As text: the parent unpickles what a process raises, and an exception taking other arguments than its
        # message (the client's Rejected, websockets' own) would reach it as a broken pool instead.
        raise RuntimeError(f"a client process: {type(error).__name__}: {error}") from None


async def _client_share(
    url: str, seeds: list[int], text: str, word_gap_s: float, setting: Setting, handshakes: int
) -> Share:
    assert _barrier is not None, "client processes start with the level's barrier"
    limit = asyncio.Semaphore(handshakes)
    opened = await asyncio.gather(*(open_session(url, limit) for _ in seeds), return_exceptions=True)
    try:
        for item in opened:
            if isinstance(item, BaseException):
                raise item
        await asyncio.to_thread(_barrier.wait, BARRIER_TIMEOUT_S)  # every process's sessions are open
        await asyncio.to_thread(_barrier.wait, BARRIER_TIMEOUT_S)  # go
        started, cpu = time.monotonic(), time.process_time()
        lags: list[float] = []
        watch = asyncio.create_task(watch_lag(lags))
        speaking = (speak(client, seed, text, word_gap_s, setting) for seed, client in zip(seeds, opened, strict=True))
        outcomes = await asyncio.gather(*speaking)
        watch.cancel()
        return Share(outcomes, started, time.monotonic(), time.process_time() - cpu, lags, os.sched_getaffinity(0))
    except BaseException:
        _barrier.abort()  # the others stop waiting for this process
        raise
    finally:
        await asyncio.gather(*(item.close() for item in opened if not isinstance(item, BaseException)))


async def watch_lag(lags: list[float]) -> None:
    """How late this process's event loop wakes, tick after tick: every frame it timestamps meanwhile is that late,
    so a lagging client reads as a server whose frames come late (and players that run dry)."""
    while True:
        due = time.monotonic() + LAG_TICK_S
        await asyncio.sleep(LAG_TICK_S)
        # uvloop's timers count whole milliseconds from the start of the loop's turn: a tick may come a little early.
        lags.append(max(0.0, time.monotonic() - due))


class Clients:
    """The client processes (spawned once, reused by every level) and the barrier they start each level on."""

    def __init__(self, processes: int, cpus: set[int] | None = None) -> None:
        self.processes = processes
        spawn = multiprocessing.get_context("spawn")  # no fork of this process's event loop and threads
        self.barrier = spawn.Barrier(processes + 1)  # the client processes and this one
        self.pool = ProcessPoolExecutor(processes, mp_context=spawn, initializer=_join, initargs=(self.barrier, cpus))

    def close(self) -> None:
        self.barrier.abort()  # a process still waiting for a level that will not start
        self.pool.shutdown(cancel_futures=True)


@dataclass(frozen=True, slots=True)
class Level:
    results: list[SessionResult]  # the sessions that finished (context.done)
    failures: list[Failure]  # the others
    started: float  # when the first session started to speak (time.monotonic(), the clock of engine step traces)
    wall_s: float  # from the start of the speaking to the last session's end
    client_cpu_s: list[float]  # per client process, meanwhile: one near wall_s, the clients would be the bottleneck
    client_lags_s: list[float]  # every client process's event-loop lateness samples (watch_lag), together
    client_cpus: set[int]  # the CPUs the client processes may run on (their affinity)
    server_cpu: tuple[dict[int, float | None], dict[int, float | None]]  # per process, at the start and the end


async def run_level(
    clients: Clients,
    url: str,
    sessions: int,
    args: argparse.Namespace,
    setting: Setting,
    snapshot: Callable[[], dict[int, float | None]],
    start: asyncio.Future[float] | None = None,
) -> Level:
    """All sessions connect first (spread over the client processes), then speak at once; `start` is given the
    moment they start (time.monotonic())."""
    loop, n = asyncio.get_running_loop(), clients.processes
    handshakes = max(1, CONCURRENT_HANDSHAKES // n)  # at most as many handshakes at a time as one process made
    word_gap_s = args.word_gap_ms / 1000
    shares = [
        loop.run_in_executor(
            clients.pool, client_share, url, list(range(i, sessions, n)), args.text, word_gap_s, setting, handshakes
        )
        for i in range(n)
    ]
    try:
        await asyncio.to_thread(clients.barrier.wait, BARRIER_TIMEOUT_S)  # every session is open
        server_before = snapshot()
        await asyncio.to_thread(clients.barrier.wait, BARRIER_TIMEOUT_S)
        if start is not None:
            start.set_result(time.monotonic())
        done: list[Share] = await asyncio.gather(*shares)
    except BaseException as error:
        clients.barrier.abort()
        # A client process's own error says more than the broken barrier the others saw.
        errors = [e for e in await asyncio.gather(*shares, return_exceptions=True) if isinstance(e, BaseException)]
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), error) from None
    server_cpu = (server_before, snapshot())
    outcomes = [outcome for share in done for outcome in share.outcomes]
    return Level(
        results=[o for o in outcomes if isinstance(o, SessionResult)],
        failures=[o for o in outcomes if isinstance(o, Failure)],
        started=min(share.started for share in done),
        wall_s=max(share.ended for share in done) - min(share.started for share in done),
        client_cpu_s=[share.cpu_s for share in done],
        client_lags_s=[lag for share in done for lag in share.lags_s],
        client_cpus=set().union(*(share.cpus for share in done)),
        server_cpu=server_cpu,
    )


def get_json(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, orjson.loads(reply.read())
    except urllib.error.HTTPError as error:  # /ready answers 503 while the model loads
        return error.code, None


def wait_ready(base: str, server: subprocess.Popen[bytes]) -> None:
    """Until every engine serves: /ready answers 200 as soon as one does, and a level started then would measure the
    others' share on it."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before it was ready")
        with contextlib.suppress(OSError):  # not listening yet
            code, status = get_json(base + "/status")
            if code == 200 and status["ready"] and all(engine["healthy"] for engine in status["engines"]):
                return
        time.sleep(0.5)
    raise RuntimeError(f"the server was not ready after {START_TIMEOUT_S} s")


async def server_status(base: str) -> dict[str, Any]:
    return (await asyncio.to_thread(get_json, base + "/status"))[1]


OPUS_FRAMES = re.compile(r'^ttsws_opus_frames_total\{complexity="(\d+)"\} (\S+)$', re.MULTILINE)


def get_opus_frames(base: str) -> Counter[str]:
    """The server's Opus frames encoded so far, by complexity (/metrics)."""
    with urllib.request.urlopen(base + "/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return Counter({level: int(float(n)) for level, n in OPUS_FRAMES.findall(text)})


async def wait_disconnected(base: str) -> dict[str, Any]:
    """Sessions of the previous level must be gone from the server before the next level counts against
    max_connections; the status that says so."""
    while (status := await server_status(base))["connections"]["active"]:
        await asyncio.sleep(0.05)
    return status


async def sample_status(base: str, start: asyncio.Future[float], samples: list[dict[str, Any]]) -> None:
    """/status every 0.25 s once the sessions `start` to speak (cancel to stop)."""
    await start
    while True:
        status = await server_status(base)
        if status and status.get("engine"):
            samples.append(status)
        await asyncio.sleep(0.25)


def busy(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The samples taken while the server generated (idle moments would dilute the means)."""
    return [s for s in samples if s["engine"]["running"]]


ENGINE_MEANS = ("step_ms", "batch_size", "running")


def means(figures: list[dict[str, Any]], keys: tuple[str, ...] = ENGINE_MEANS) -> dict[str, float | None]:
    """The mean of each of `keys` over `figures` (null without any)."""
    return {key: round(statistics.mean(f[key] for f in figures), 2) if figures else None for key in keys}


def engines_detail(
    before: dict[str, Any], after: dict[str, Any], sampled: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per engine: its pid, the segments the server granted it between the two statuses, whether it still serves,
    and over the busy samples its mean step time, batch size and running contexts (the engine's figures) and
    generating segments (the server's: those holding its slots)."""
    return [
        {
            "index": index,
            "pid": end["pid"],
            "healthy": end["healthy"],
            "segments": end["segments"] - start["segments"],
            **means([s["engines"][index] for s in sampled], (*ENGINE_MEANS, "generating")),
        }
        for index, (start, end) in enumerate(zip(before["engines"], after["engines"], strict=True))
    ]


def spread_pct(segments: list[int]) -> float | None:
    """(max - min) / mean of the engines' segments, in percent; null with one engine or none granted."""
    if len(segments) < 2 or not sum(segments):
        return None
    return round(100 * (max(segments) - min(segments)) / statistics.mean(segments), 1)


async def kill_engine(
    base: str, index: int, delay_s: float, start: asyncio.Future[float], before: dict[str, Any], killed: dict[str, Any]
) -> None:
    """SIGKILL engine `index` (its pid from /status: the server runs on this host) `delay_s` after the sessions
    `start` to speak, and fill `killed` with what it was doing then; `before`: the status at the start of the level."""
    started = await start
    await asyncio.sleep(max(0.0, started + delay_s - time.monotonic()))
    engine = (await server_status(base))["engines"][index]  # the last sample before the kill
    os.kill(engine["pid"], signal.SIGKILL)
    killed.update(
        index=index,
        pid=engine["pid"],
        at_s=round(time.monotonic() - started, 3),
        running_at_kill=engine["running"],
        generating_at_kill=engine["generating"],
        segments_granted_before_kill=engine["segments"] - before["engines"][index]["segments"],
    )


def result_line(
    args: argparse.Namespace,
    setting: Setting,
    sessions: int,
    level: Level,
    server: dict[str, Any],
) -> dict[str, Any]:
    """`server`: what was seen of the server during the level: its `model`, process `roles`, the /status `before`
    and `after` it, its `samples`, what was `killed` (None) and the `opus_frames` encoded, by complexity."""
    results = level.results
    first = [1000 * r.first_frame_s for r in results]
    worst = [1000 * r.worst_gap_s for r in results]
    audio = sum(r.audio_s for r in results)
    roles = server["roles"]
    sampled = busy(server["samples"])
    detail = engines_detail(server["before"], server["after"], sampled)
    failed = Counter(f.code for f in level.failures)
    return {
        "sessions": sessions,
        "format": setting.format,
        "sample_rate": results[0].sample_rate if results else None,
        "device": None if args.url else args.device,
        "model": server["model"],
        "max_patches": args.max_patches,
        "word_gap_ms": args.word_gap_ms,
        "server_args": args.server_args,
        "workers": len(roles.get("workers", [])),
        "worker_connections": worker_connections(server["samples"]),
        "engines": len(roles["engines"]) if "engines" in roles else 1,  # a server in one process serves one engine
        "client_processes": args.client_processes,
        "client_cpus": cpu_list(level.client_cpus),
        "server_cpus": cpu_list(set().union(*(allowed_cpus(pid) for pids in roles.values() for pid in pids))),
        "sessions_finished": len(results),
        "sessions_failed": dict(failed),
        "failure_messages": {f.code: f.message for f in reversed(level.failures)},  # the first of each code
        "first_text_to_first_frame_ms": {
            "p50": round(statistics.median(first), 1),
            **{f"p{q}": round(percentile(first, q / 100), 1) for q in (90, 95, 99)},
            "max": round(max(first), 1),
        }
        if results
        else None,
        "worst_gap_ms": round(max(worst), 1) if results else None,
        "worst_gap_p95_ms": round(percentile(worst, 0.95), 1) if results else None,
        "starved_sessions": sum(r.starved_s > 0 for r in results),
        "starved_ms_total": round(1000 * sum(r.starved_s for r in results), 1),
        "dry_at_audio_s": spread([r.dry_at_audio_s for r in results if r.dry_at_audio_s is not None]),
        "server_ttfa_ms_p50": server_p50(results, "ttfa_ms"),
        "server_queue_ms_p50": server_p50(results, "queue_ms"),
        "server_rtf_p50": server_p50(results, "rtf"),
        "audio_s": round(audio, 2),
        "audio_s_per_session": round(audio / len(results), 2) if results else None,
        "server_audio_s": round(sum(r.done.audio_ms for r in results) / 1000, 2),
        "started_monotonic_s": round(level.started, 3),
        "wall_s": round(level.wall_s, 2),
        "xrt": round(audio / level.wall_s, 2),
        "client_cpu_s": round(sum(level.client_cpu_s), 2),
        "client_lag_ms": {
            "p50": round(1000 * statistics.median(level.client_lags_s), 1),
            "p99": round(1000 * percentile(level.client_lags_s, 0.99), 1),
            "max": round(1000 * max(level.client_lags_s), 1),
        }
        if level.client_lags_s
        else None,
        "cpu": cpu_report(roles, *level.server_cpu, level.client_cpu_s, level.wall_s),
        "engine": means([s["engine"] for s in sampled]) if sampled else None,
        "engines_detail": detail,
        "engine_spread_pct": spread_pct([engine["segments"] for engine in detail]),
        "killed_engine": server["killed"],
        "opus_frames": server["opus_frames"],
    }


async def measure(args: argparse.Namespace, base: str, supervisor: int | None) -> None:
    """Every setting at every session count; `supervisor`: the server's top process, if this script started it."""
    url = base.replace("http://", "ws://") + "/v1/tts/ws"
    async with Client(url, open_timeout_s=60) as probe:
        hello = probe.hello
    try:
        for setting in args.settings:
            check_setting(setting, hello)
    except ValueError as bad:
        raise SystemExit(f"ws_latency: {bad}") from None
    clients = Clients(args.client_processes, args.client_cpus)
    try:
        await measure_settings(args, base, url, supervisor, hello["model"]["name"], clients)
    finally:
        clients.close()


async def measure_settings(
    args: argparse.Namespace, base: str, url: str, supervisor: int | None, model: str, clients: Clients
) -> None:
    for s, setting in enumerate(args.settings):
        status = await wait_disconnected(base)
        # Warm-up, unmeasured: a few sessions for every worker, so that each has served this format once.
        warmup = min(max(args.sessions), 2 * len(status["worker_processes"]))
        await run_level(clients, url, warmup, args, setting, lambda: {})
        for i, sessions in enumerate(args.sessions):
            last = s == len(args.settings) - 1 and i == len(args.sessions) - 1
            kill = args.kill_engine is not None and last  # the levels before measure all the engines
            line = await measure_level(args, base, url, supervisor, model, clients, setting, sessions, kill)
            print(orjson.dumps(line).decode(), flush=True)


async def measure_level(
    args: argparse.Namespace,
    base: str,
    url: str,
    supervisor: int | None,
    model: str,
    clients: Clients,
    setting: Setting,
    sessions: int,
    kill: bool,
) -> dict[str, Any]:
    """One level's line; `kill`: this level kills engine --kill-engine."""
    await wait_disconnected(base)
    # The workers tell the supervisor of closed connections every 0.1 s (wsserver/handoff.py): let it learn of the
    # last level's and of these /status requests before the burst, as it would after a moment without traffic.
    await asyncio.sleep(0.3)
    before = await server_status(base)
    opus_before = await asyncio.to_thread(get_opus_frames, base)
    roles = server_roles(before, supervisor)  # a worker that died meanwhile came back with another pid
    pids = sorted({pid for members in roles.values() for pid in members})
    start: asyncio.Future[float] = asyncio.get_running_loop().create_future()
    samples: list[dict[str, Any]] = []
    sampler = asyncio.create_task(sample_status(base, start, samples))
    killed: dict[str, Any] = {}
    killer = None
    if kill:
        killer = asyncio.create_task(kill_engine(base, args.kill_engine, args.kill_after_s, start, before, killed))
    profiler = None
    if sessions == args.profile_sessions:
        profiler = subprocess.Popen(
            [
                *("py-spy", "record", "--pid", str(supervisor), "--subprocesses", "--format", "raw"),
                *("--threads", "--rate", "50", "--output", args.profile_out, "--nonblocking"),
            ],
            stdout=subprocess.DEVNULL,
        )
    try:
        level = await run_level(clients, url, sessions, args, setting, functools.partial(cpu_snapshot, pids), start)
    finally:
        sampler.cancel()
        if killer is not None:
            killer.cancel()  # unless done: the level ended before the kill was due, nothing was killed
            with contextlib.suppress(asyncio.CancelledError):
                await killer
    if profiler is not None:
        profiler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        profiler.wait()
    if killed:
        killed["ready_after"] = (await asyncio.to_thread(get_json, base + "/ready"))[0]
    after = await server_status(base)
    opus_frames = await asyncio.to_thread(get_opus_frames, base) - opus_before
    server = {"model": model, "roles": roles, "before": before, "after": after, "samples": samples}
    server["opus_frames"] = dict(sorted(opus_frames.items(), key=lambda item: -int(item[0])))
    server["killed"] = killed or None
    return result_line(args, setting, sessions, level, server)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def raise_open_files_limit() -> None:
    """Every session is a socket: lift the soft limit on open files (often 1024) to the hard one, for this process
    and the server it starts (children inherit it)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(args: argparse.Namespace) -> None:
    raise_open_files_limit()
    if args.url is not None:
        uvloop.run(measure(args, args.url.rstrip("/"), None))
        return
    if args.max_patches is None:
        # The reference's text-length cap on the GPU; a few patches per segment keep the CPU run short.
        args.max_patches = ServerConfig().max_patches if on_gpu(args.device) else 8
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            from engine.models.voxcpm.make_checkpoint import make_checkpoint

            model = str(make_checkpoint("voxcpm2", "tiny", Path(scratch) / "tiny"))
        port = free_port()
        most = max(args.sessions)
        engines = len(engine_devices(args.device))
        command = [sys.executable, "-m", "wsserver", "--model", model, "--device", args.device, "--port", str(port)]
        # Every session gets an engine slot and a connection: the benchmark measures the engines under that load, not
        # the server's FIFO in front of smaller engines. Each engine has its share of the slots, as many as one engine
        # serving that share alone would have.
        command += ["--max-num-seqs", str(-(-most // engines)), "--max-connections", str(most)]
        command += ["--max-patches", str(args.max_patches)]
        if args.workers is not None:
            command += ["--workers", str(args.workers)]
        command += shlex.split(args.server_args)
        # A separate process tree, as in production: the clients' own work must not share the server's cores' GIL.
        # With --client-cpus the server and everything it starts keep off the clients' CPUs (its default worker count
        # follows the CPUs it has).
        server_cpus = os.sched_getaffinity(0) - args.client_cpus if args.client_cpus else None
        pin = None if server_cpus is None else functools.partial(os.sched_setaffinity, 0, server_cpus)
        server = subprocess.Popen(command, stdout=sys.stderr, preexec_fn=pin)
        if args.client_cpus:
            os.sched_setaffinity(0, args.client_cpus)  # this process's polling too
        try:
            base = f"http://127.0.0.1:{port}"
            wait_ready(base, server)
            uvloop.run(measure(args, base, server.pid))
        finally:
            server.send_signal(signal.SIGTERM)  # drains: no session is open by now
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def engine_devices(device: str) -> list[EngineDevice]:
    """The engines the server starts for `--device` (ValueError for what it would refuse)."""
    return ServerConfig(devices=device).engine_devices()


def on_gpu(device: str) -> bool:
    """Whether `--device` names GPUs: "cuda", "cuda:1", "0,1"."""
    return any(engine.device == "cuda" for engine in engine_devices(device))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, nargs="+", help="default 1 32 128 256 on GPUs, else 1 8")
    parser.add_argument("--model", default=None, help="checkpoint; default: a freshly generated tiny random one")
    device_help = "the server's --devices: cpu, cuda, cuda:N, or one engine per entry: 0,1 (GPUs), cpu,cpu"
    parser.add_argument("--device", default="cpu", help=device_help)
    parser.add_argument("--workers", type=int, help="the server's front-end processes (default: its own, from cores)")
    parser.add_argument("--url", help="measure the server at this base URL (http://host:port) instead of starting one")
    parser.add_argument("--max-patches", type=int, help="cap per segment; default the server's on GPUs, else 8")
    parser.add_argument("--word-gap-ms", type=float, default=20.0, help="pause between streamed words (LLM pace)")
    parser.add_argument("--text", default=TEXT, help="what each session says (default: three sentences)")
    parser.add_argument("--format", nargs="+", choices=FORMATS, default=["pcm_s16le"], help="one setting per format")
    parser.add_argument(
        "--sample-rate",
        type=int,
        nargs="+",
        help="one rate for every format, or one per format (default: the model's for PCM, 48000 Opus, 8000 mu-law)",
    )
    server_args_help = "more flags for the server it starts: --server-args='--pace-admissions off'"
    parser.add_argument("--server-args", default="", help=server_args_help)
    parser.add_argument("--profile-sessions", type=int, help="record the server with py-spy during this level")
    parser.add_argument("--profile-out", default="artifacts/ws-profile.txt", help="py-spy's collapsed stacks")
    clients_help = "client processes the sessions of a level are spread over (default 1)"
    parser.add_argument("--client-processes", type=int, default=1, help=clients_help)
    cpus_help = "CPUs for the client processes (taskset's list: 12-15); the server this script starts gets the others"
    parser.add_argument("--client-cpus", type=parse_cpus, help=cpus_help)
    parser.add_argument("--kill-engine", type=int, help="SIGKILL this engine (index in /status) in the last level")
    parser.add_argument("--kill-after-s", type=float, help="...this long after its sessions start to speak")
    args = parser.parse_args(argv)
    try:
        args.settings = settings_from(args.format, args.sample_rate)
    except ValueError as bad:
        parser.error(str(bad))
    if any(count < 1 for count in args.sessions or ()):
        parser.error("--sessions counts must be at least 1")
    if args.url is not None and args.server_args:
        parser.error("--server-args are for the server this script starts, not one at --url")
    if args.url is not None and args.profile_sessions is not None:
        parser.error("--profile-sessions records the server this script starts, not one at --url")
    if args.client_processes < 1:
        parser.error("--client-processes must be at least 1")
    if args.client_cpus is not None:
        if not args.client_cpus <= os.sched_getaffinity(0):
            parser.error(
                f"--client-cpus {cpu_list(args.client_cpus)}: this process may use {cpu_list(os.sched_getaffinity(0))}"
            )
        if args.url is None and not os.sched_getaffinity(0) - args.client_cpus:
            parser.error("--client-cpus leaves no CPU for the server")
    if (args.kill_engine is None) != (args.kill_after_s is None):
        parser.error("--kill-engine and --kill-after-s go together")
    if args.kill_engine is not None and (args.kill_engine < 0 or args.kill_after_s < 0):
        parser.error("--kill-engine and --kill-after-s must be >= 0")
    try:
        engines = engine_devices(args.device)
    except ValueError as bad:
        parser.error(f"--device: {bad}")
    if args.kill_engine is not None:
        if args.url is not None:
            parser.error("--kill-engine kills an engine of the server this script starts, not one at --url")
        if args.workers == 0:
            parser.error("--kill-engine kills an engine process: not with --workers 0 (the engine is the server)")
        if args.kill_engine >= len(engines):
            parser.error(f"--kill-engine {args.kill_engine}: --device {args.device} starts {len(engines)} engine(s)")
    gpu = on_gpu(args.device)
    args.sessions = args.sessions or ([1, 32, 128, 256] if gpu else [1, 8])
    return args


if __name__ == "__main__":
    main(parse_args())
