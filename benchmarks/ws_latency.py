"""End to end over the WebSocket: first text to first audio frame, starvation, throughput and the CPU of every server
process, per output format and session count.

Starts the real server (`python -m wsserver`: a supervisor, an engine process per device and front-end worker
processes; `--workers 0` keeps one process) in a child process, sized for the largest session count, on the given
checkpoint or a freshly generated tiny random one; or measures a running server (`--url`; its max connections and
engine slots must cover the sessions). For each setting (`--format` with its `--sample-rate`) and session count it
opens that many sessions, then starts them together: each streams a few sentences word by word (one word every
--word-gap-ms, like an LLM), ends its context and reads its frames until `context.done`. The frames are not decoded:
their durations are counted from the packets (an Opus packet's TOC byte), so one client process carries 512 and more
sessions. Before the first level of a setting, twice as many sessions as the server has workers speak once, unmeasured
(the first context of a format in a worker takes paths the engine's own warm-up does not).

One JSON line per setting and session count:

- `sessions`, `format`, `sample_rate` (as the server resolved it), `workers` and `engines` (processes serving; 0
  workers: the server is one process);
- `first_text_to_first_frame_ms`: from sending the first word to receiving the first audio frame (p50, p90, p95, p99,
  max over the sessions);
- `worst_gap_ms` (all sessions) and `worst_gap_p95_ms` (of each session's worst) between consecutive audio frames;
- `starved_sessions`: sessions whose player ran dry, i.e. some frame arrived later after the first frame than the
  audio delivered ahead of it lasts; `starved_ms_total`: how long their players waited in all (a player that
  starts at the first frame and, when it runs dry, waits for the next frame and plays on);
- `server_ttfa_ms_p50`, `server_queue_ms_p50`, `server_rtf_p50`: the server's own figures from `context.done`;
- `audio_s`, `wall_s`, `xrt`: audio delivered to all sessions (counted from the frames), from the start to the last
  `context.done`, and their ratio (aggregate xRT); `audio_s_per_session`; `server_audio_s`: the audio the server
  says it sent (`context.done`'s `audio_ms`), which `audio_s` must equal;
- `cpu`: CPU over the measurement window (`window_s`, the same span as `wall_s`), per role: `client` (this process),
  and from /proc/PID/stat the server's `supervisor`, `engines` and `workers` (pids from /status; a server in one
  process is `server`). Each role: `processes`, `cpu_s` (summed), `util` (cpu_s / window: 1.0 is one core busy),
  `cpu_s_max` and `util_max` (its busiest process). A role near `processes` x 1.0, or a single process near 1.0, is
  the bottleneck; the client near 1.0 means the figures are the client's limit, not the server's. A role is null
  when its processes cannot be read (a server on another host);
- `engine`: the engine's step time and batch size (means of /status samples taken every 0.25 s).

`--server-args='--pace-admissions off'` passes more flags to the server it starts (an A/B of one engine setting); each
line repeats them (`server_args`).

`--profile-sessions N --profile-out FILE` also records the server's processes with py-spy (collapsed stacks of every
thread of every process, `py-spy record --subprocesses --format raw`) while the level of N sessions runs.

    PYTHONPATH=. python benchmarks/ws_latency.py --sessions 1 8                 # CPU, tiny random checkpoint
    python3 benchmarks/ws_latency.py --device cuda --model CKPT                 # sessions 1 32 128 256, PCM
    python3 benchmarks/ws_latency.py --device cuda --model CKPT --max-patches 60 --sessions 1 512 \\
        --format opus pcm_s16le --sample-rate 48000 24000                       # Opus 48 kHz, then PCM 24 kHz
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import resource
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import uvloop

from wsserver.client import Cancelled, Client, Done, Packet, Refused
from wsserver.config import ServerConfig
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


@dataclass(frozen=True, slots=True)
class Setting:
    format: str
    sample_rate: int | None  # None: the format's default (the model's rate for PCM, 48 kHz for Opus, 8 kHz mu-law)


@dataclass(frozen=True, slots=True)
class SessionResult:
    first_frame_s: float  # first word sent -> first audio frame received
    worst_gap_s: float  # longest wait between two consecutive audio frames
    starved_s: float  # time the player's buffer was empty, 0 if it never ran dry
    audio_s: float  # counted from the frames
    sample_rate: int  # as the server resolved it
    done: Done


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


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def server_p50(results: list[SessionResult], key: str) -> float | None:
    """Median of a `context.done` metric over the sessions that have it (ttfa_ms is null without audio)."""
    values = [r.done.metrics[key] for r in results if r.done.metrics[key] is not None]
    return round(statistics.median(values), 3) if values else None


def playback(arrivals: list[tuple[float, int]], sample_rate: int) -> tuple[float, float]:
    """(worst gap, starved time) in seconds, for audio frames given as (arrival time, samples).

    The player starts with the first frame. Frame k is due when the audio before it has played, i.e. `delivered /
    sample_rate` after the start plus the time the player already spent waiting; arriving later than that, the
    player waits for it (rebuffers) and plays on from there."""
    start = previous = arrivals[0][0]
    worst = starved = 0.0
    delivered = 0
    for arrival, samples in arrivals:
        worst = max(worst, arrival - previous)
        starved += max(0.0, arrival - (start + starved + delivered / sample_rate))
        delivered += samples
        previous = arrival
    return worst, starved


async def open_session(url: str, handshakes: asyncio.Semaphore) -> Client:
    client = Client(url, open_timeout_s=60)
    async with handshakes:
        await client.connect()
    return client


async def speak(client: Client, seed: int, text: str, word_gap_s: float, setting: Setting) -> SessionResult:
    """One context on an open session: stream `text` word by word, end it, and time every audio frame."""
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
                worst_gap, starved = playback(arrivals, ctx.sample_rate)
                audio_s = sum(samples for _, samples in arrivals) / ctx.sample_rate
                return SessionResult(arrivals[0][0] - started, worst_gap, starved, audio_s, ctx.sample_rate, event)
            elif isinstance(event, Refused | Cancelled):
                raise RuntimeError(event)
    finally:
        feeder.cancel()
    raise RuntimeError("connection closed before context.done")


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
    client_cpu_s: float,
    window_s: float,
) -> dict[str, Any]:
    """Per role, the CPU its processes spent between the two snapshots; null for a role with a process that could
    not be read at either end (a worker restarted meanwhile, a server on another host)."""
    report: dict[str, Any] = {"window_s": round(window_s, 3), "client": role_cpu([client_cpu_s], window_s)}
    for role, pids in roles.items():
        spent = [after[pid] - before[pid] for pid in pids if before[pid] is not None and after[pid] is not None]
        report[role] = role_cpu(spent, window_s) if len(spent) == len(pids) else None
    return report


@dataclass(frozen=True, slots=True)
class Level:
    results: list[SessionResult]
    wall_s: float  # from the start of the speaking to the last context.done
    client_cpu_s: float  # this process's CPU time meanwhile: near wall_s, the clients would be the bottleneck
    server_cpu: tuple[dict[int, float | None], dict[int, float | None]]  # per process, at the start and the end
    model: str


async def run_level(
    url: str,
    sessions: int,
    args: argparse.Namespace,
    setting: Setting,
    snapshot: Callable[[], dict[int, float | None]],
) -> Level:
    """All sessions connect first, then speak at once."""
    handshakes = asyncio.Semaphore(CONCURRENT_HANDSHAKES)
    opened = await asyncio.gather(*(open_session(url, handshakes) for _ in range(sessions)), return_exceptions=True)
    try:
        for item in opened:
            if isinstance(item, BaseException):
                raise item
        server_before = snapshot()
        started, cpu = time.perf_counter(), time.process_time()
        word_gap_s = args.word_gap_ms / 1000
        speaking = (speak(client, i, args.text, word_gap_s, setting) for i, client in enumerate(opened))
        results = await asyncio.gather(*speaking)
        wall_s, client_cpu_s = time.perf_counter() - started, time.process_time() - cpu
        server_cpu = (server_before, snapshot())
        return Level(results, wall_s, client_cpu_s, server_cpu, opened[0].hello["model"]["name"])
    finally:
        await asyncio.gather(*(item.close() for item in opened if not isinstance(item, BaseException)))


def get_json(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, orjson.loads(reply.read())
    except urllib.error.HTTPError as error:  # /ready answers 503 while the model loads
        return error.code, None


def wait_ready(base: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before it was ready")
        with contextlib.suppress(OSError):  # not listening yet
            if get_json(base + "/ready")[0] == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the server was not ready after {START_TIMEOUT_S} s")


async def server_status(base: str) -> dict[str, Any]:
    return (await asyncio.to_thread(get_json, base + "/status"))[1]


async def wait_disconnected(base: str) -> dict[str, Any]:
    """Sessions of the previous level must be gone from the server before the next level counts against
    max_connections; the status that says so."""
    while (status := await server_status(base))["connections"]["active"]:
        await asyncio.sleep(0.05)
    return status


async def sample_engine(base: str, samples: list[dict[str, Any]]) -> None:
    """/status's engine figures every 0.25 s, while the sessions speak (cancel to stop)."""
    while True:
        status = (await asyncio.to_thread(get_json, base + "/status"))[1]
        if status and status.get("engine"):
            samples.append(status["engine"])
        await asyncio.sleep(0.25)


def engine_means(samples: list[dict[str, Any]]) -> dict[str, float] | None:
    busy = [s for s in samples if s["running"]]
    if not busy:
        return None
    return {key: round(statistics.mean(s[key] for s in busy), 2) for key in ("step_ms", "batch_size", "running")}


def result_line(
    args: argparse.Namespace,
    setting: Setting,
    sessions: int,
    level: Level,
    roles: dict[str, list[int]],
    engine_samples: list[dict[str, Any]],
) -> dict[str, Any]:
    results = level.results
    first = [1000 * r.first_frame_s for r in results]
    worst = [1000 * r.worst_gap_s for r in results]
    audio = sum(r.audio_s for r in results)
    return {
        "sessions": sessions,
        "format": setting.format,
        "sample_rate": results[0].sample_rate,
        "device": None if args.url else args.device,
        "model": level.model,
        "max_patches": args.max_patches,
        "word_gap_ms": args.word_gap_ms,
        "server_args": args.server_args,
        "workers": len(roles.get("workers", [])),
        "engines": len(roles["engines"]) if "engines" in roles else 1,  # a server in one process serves one engine
        "first_text_to_first_frame_ms": {
            "p50": round(statistics.median(first), 1),
            **{f"p{q}": round(percentile(first, q / 100), 1) for q in (90, 95, 99)},
            "max": round(max(first), 1),
        },
        "worst_gap_ms": round(max(worst), 1),
        "worst_gap_p95_ms": round(percentile(worst, 0.95), 1),
        "starved_sessions": sum(r.starved_s > 0 for r in results),
        "starved_ms_total": round(1000 * sum(r.starved_s for r in results), 1),
        "server_ttfa_ms_p50": server_p50(results, "ttfa_ms"),
        "server_queue_ms_p50": server_p50(results, "queue_ms"),
        "server_rtf_p50": server_p50(results, "rtf"),
        "audio_s": round(audio, 2),
        "audio_s_per_session": round(audio / sessions, 2),
        "server_audio_s": round(sum(r.done.audio_ms for r in results) / 1000, 2),
        "wall_s": round(level.wall_s, 2),
        "xrt": round(audio / level.wall_s, 2),
        "client_cpu_s": round(level.client_cpu_s, 2),
        "cpu": cpu_report(roles, *level.server_cpu, level.client_cpu_s, level.wall_s),
        "engine": engine_means(engine_samples),
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
    for setting in args.settings:
        status = await wait_disconnected(base)
        # Warm-up, unmeasured: a few sessions for every worker, so that each has served this format once.
        warmup = min(max(args.sessions), 2 * len(status["worker_processes"]))
        await run_level(url, warmup, args, setting, lambda: {})
        for sessions in args.sessions:
            status = await wait_disconnected(base)
            roles = server_roles(status, supervisor)  # a worker that died meanwhile came back with another pid
            pids = sorted({pid for members in roles.values() for pid in members})
            samples: list[dict[str, Any]] = []
            sampler = asyncio.create_task(sample_engine(base, samples))
            profiler = None
            if sessions == args.profile_sessions:
                profiler = subprocess.Popen(
                    [
                        *("py-spy", "record", "--pid", str(supervisor), "--subprocesses", "--format", "raw"),
                        *("--threads", "--rate", "50", "--output", args.profile_out, "--nonblocking"),
                    ],
                    stdout=subprocess.DEVNULL,
                )
            level = await run_level(url, sessions, args, setting, functools.partial(cpu_snapshot, pids))
            sampler.cancel()
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
                profiler.wait()
            print(orjson.dumps(result_line(args, setting, sessions, level, roles, samples)).decode(), flush=True)


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
    cuda = args.device.startswith("cuda")
    if args.max_patches is None:
        # The reference's text-length cap on the GPU; a few patches per segment keep the CPU run short.
        args.max_patches = ServerConfig().max_patches if cuda else 8
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            from engine.models.voxcpm.make_checkpoint import make_checkpoint

            model = str(make_checkpoint("voxcpm2", "tiny", Path(scratch) / "tiny"))
        port = free_port()
        most = str(max(args.sessions))
        command = [sys.executable, "-m", "wsserver", "--model", model, "--device", args.device, "--port", str(port)]
        # Every session gets an engine slot and a connection: the benchmark measures the engine under that load, not
        # the server's FIFO in front of a smaller engine.
        command += ["--max-num-seqs", most, "--max-connections", most, "--max-patches", str(args.max_patches)]
        if args.workers is not None:
            command += ["--workers", str(args.workers)]
        command += shlex.split(args.server_args)
        # A separate process tree, as in production: the clients' own work must not share the server's cores' GIL.
        server = subprocess.Popen(command, stdout=sys.stderr)
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, nargs="+", help="default 1 32 128 256 on cuda, else 1 8")
    parser.add_argument("--model", default=None, help="checkpoint; default: a freshly generated tiny random one")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    parser.add_argument("--workers", type=int, help="the server's front-end processes (default: its own, from cores)")
    parser.add_argument("--url", help="measure the server at this base URL (http://host:port) instead of starting one")
    parser.add_argument("--max-patches", type=int, help="cap per segment; default the server's on cuda, else 8")
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
    args.sessions = args.sessions or ([1, 32, 128, 256] if args.device.startswith("cuda") else [1, 8])
    return args


if __name__ == "__main__":
    main(parse_args())
