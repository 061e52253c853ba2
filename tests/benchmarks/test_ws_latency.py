"""benchmarks/ws_latency.py against a server process tree on the tiny checkpoint, started by the script or running at
`--url`: one JSON line per format, with audio counted from the packets that matches the server's count and the PCM
run's, and the CPU of every process role; sessions spread over client processes, each engine's share of the
segments, and an engine killed mid-level. Its settings, roles and CPU accounting without a server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from asyncio.subprocess import PIPE
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from benchmarks.ws_latency import (
    Clients,
    Setting,
    check_setting,
    cpu_list,
    cpu_report,
    parse_args,
    parse_cpus,
    playback,
    process_cpu_s,
    run_level,
    server_roles,
    spread,
    spread_pct,
)
from tests.servers import server_process

REPO = Path(__file__).resolve().parents[2]
HELLO = {"formats": ["pcm_s16le", "pcm_f32le", "opus", "mulaw"], "sample_rates": [8000, 16000, 24000, 48000]}


def test_two_sessions_in_each_format_report_latency_audio_and_cpu(
    tiny_checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    checkpoint = tiny_checkpoint("voxcpm2", stop=False)  # every segment runs to its cap: lengths are known
    server_args = f"--pace-admissions off --coalesce-ms 2 --step-trace-dir {tmp_path}"
    command = [
        *(sys.executable, str(REPO / "benchmarks" / "ws_latency.py"), "--model", str(checkpoint)),
        *("--sessions", "2", "--workers", "2", "--max-patches", "8"),
        # One word, sent at once and ended: one segment per context, however the machine's load times the appends.
        *("--text", "Morning.", "--format", "pcm_s16le", "opus", "mulaw"),
        f"--server-args={server_args}",  # flags the server it starts takes
    ]
    run = subprocess.run(
        command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    lines = [orjson.loads(line) for line in run.stdout.splitlines()]
    assert [(line["format"], line["sample_rate"], line["sessions"]) for line in lines] == [
        ("pcm_s16le", 48000, 2),  # the tiny model's own rate
        ("opus", 48000, 2),
        ("mulaw", 8000, 2),
    ]
    pcm = lines[0]
    for line in lines:
        assert line["workers"] == 2 and line["engines"] == 1 and line["client_processes"] == 1
        assert line["worker_connections"] == [1, 1]  # the supervisor dealt one session to each worker
        assert line["sessions_finished"] == 2 and line["sessions_failed"] == {} and line["killed_engine"] is None
        [engine] = line["engines_detail"]
        assert engine["segments"] == 2 and engine["healthy"] and line["engine_spread_pct"] is None
        assert line["server_args"] == server_args
        latency = line["first_text_to_first_frame_ms"]
        assert 0 < latency["p50"] <= latency["p90"] <= latency["p95"] <= latency["p99"] <= latency["max"]
        # Counted from the packets (Opus: their TOC bytes), the audio is what the server sent, and as long in
        # every format: one segment of 8 patches per session, padded to whole 20 ms frames.
        assert line["audio_s"] == line["server_audio_s"] == pcm["audio_s"] > 0
        assert line["xrt"] == pytest.approx(line["audio_s"] / line["wall_s"], rel=0.05)  # of the rounded figures
        # Every Opus frame that reached the clients was counted, at the governor's start (6) or the ceiling (10).
        opus = line["opus_frames"]
        assert set(opus) <= ({"6", "10"} if line["format"] == "opus" else set())
        assert sum(opus.values()) == (round(line["audio_s"] / 0.02) if line["format"] == "opus" else 0)
        assert 0 <= line["starved_sessions"] <= 2
        lag = line["client_lag_ms"]  # the client's own event loop, ticking while the sessions spoke
        assert 0 <= lag["p50"] <= lag["p99"] <= lag["max"] < 1000 * line["wall_s"]
        cpu = line["cpu"]
        assert cpu["window_s"] == pytest.approx(line["wall_s"], abs=0.01)
        assert set(cpu) == {"window_s", "client", "supervisor", "engines", "workers"}
        assert [cpu[role]["processes"] for role in ("client", "supervisor", "engines", "workers")] == [1, 1, 1, 2]
        assert cpu["engines"]["cpu_s"] > 0  # the engine generated on the CPU meanwhile
        for role in ("client", "supervisor", "engines", "workers"):
            figures = cpu[role]
            assert 0 <= figures["cpu_s_max"] <= figures["cpu_s"] and 0 <= figures["util_max"] <= figures["util"]
        engines = cpu["engines"]
        assert engines["util"] == pytest.approx(engines["cpu_s"] / cpu["window_s"], rel=0.05)  # of rounded figures
    # The engine's step trace and the levels share a clock: each level's window holds its 2 x 8 patches' steps.
    steps = [orjson.loads(step) for step in (tmp_path / "engine-0.jsonl").read_bytes().splitlines()]
    for line in lines:
        start, end = line["started_monotonic_s"], line["started_monotonic_s"] + line["wall_s"]
        within = [step for step in steps if start <= step["t"] <= end]
        assert sum(step["batch"] for step in within) == 16 and sum(step["admitted"] for step in within) == 2


def run_script(*argv: str) -> list[dict]:
    command = [sys.executable, str(REPO / "benchmarks" / "ws_latency.py"), *argv]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    return [orjson.loads(line) for line in run.stdout.splitlines()]


def test_sessions_spread_over_client_processes_and_segments_over_two_engines(
    tiny_checkpoint: Callable[..., Path],
) -> None:
    allowed = os.sched_getaffinity(0)
    clients_on = {max(allowed)} if len(allowed) > 1 else None  # the clients keep off the server's CPUs
    lines = run_script(
        *("--model", str(tiny_checkpoint("voxcpm2", stop=False)), "--device", "cpu,cpu", "--workers", "2"),
        # One word, sent at once: one segment per session, of 40 patches: the per-engine means come from /status
        # samples every 0.25 s while segments generate, and a level of 8-patch segments could end between two.
        *("--client-processes", "2", "--sessions", "1", "4", "--max-patches", "40", "--text", "Morning."),
        *(("--client-cpus", cpu_list(clients_on)) if clients_on else ()),
    )
    assert [(line["sessions"], line["sessions_finished"], line["sessions_failed"]) for line in lines] == [
        (1, 1, {}),
        (4, 4, {}),
    ]
    for line in lines:
        # both processes' sessions in one line: a level of one leaves a process idle, but it is counted
        assert line["client_processes"] == 2 and line["cpu"]["client"]["processes"] == 2
        assert line["audio_s"] == line["server_audio_s"] == line["sessions"] * lines[0]["audio_s"] > 0
        assert line["cpu"]["engines"]["processes"] == line["engines"] == 2
        detail = line["engines_detail"]
        assert [engine["index"] for engine in detail] == [0, 1] and len({engine["pid"] for engine in detail}) == 2
        assert sum(engine["segments"] for engine in detail) == line["sessions"]  # the level's segments only
        assert line["engine_spread_pct"] == spread_pct([engine["segments"] for engine in detail])
        if clients_on:  # every server process (supervisor, engines, workers) on the others
            assert (line["client_cpus"], line["server_cpus"]) == (cpu_list(clients_on), cpu_list(allowed - clients_on))
        else:
            assert line["client_cpus"] == line["server_cpus"] == cpu_list(allowed)
    busiest = lines[1]["engines_detail"]
    assert all(engine["segments"] > 0 and engine["generating"] > 0 for engine in busiest)  # most free slots first


def test_cpu_lists_read_and_write_as_taskset_does() -> None:
    assert parse_cpus("12-15") == {12, 13, 14, 15} and parse_cpus("0,2-3,7") == {0, 2, 3, 7}
    assert cpu_list({0, 2, 3, 7}) == "0,2-3,7" and cpu_list({5}) == "5" and cpu_list(set()) is None
    assert parse_cpus(cpu_list({1, 4, 5, 6, 9, 10})) == {1, 4, 5, 6, 9, 10}


def test_a_player_that_runs_dry_waits_and_says_where_in_its_audio() -> None:
    # 1 kHz, 160-sample frames: the third is due at 0.32 s and comes at 0.5 s; the fourth is due 0.18 s later than
    # without that wait, at 0.66 s, and comes at 0.6 s.
    frames = [(0.0, 160), (0.1, 160), (0.5, 160), (0.6, 160)]
    worst, starved, dry_at = playback(frames, 1000)
    assert (round(worst, 6), round(starved, 6), dry_at) == (0.4, 0.18, 0.32)
    assert playback([(0.0, 160), (0.15, 160), (0.3, 160)], 1000)[1:] == (0.0, None)
    assert spread([0.16, 9.6, 0.32]) == {"min": 0.16, "p50": 0.32, "max": 9.6} and spread([]) is None


def test_an_engine_killed_mid_level_fails_only_its_sessions_and_the_other_serves_on(
    tiny_checkpoint: Callable[..., Path],
) -> None:
    whole, cut = run_script(
        *("--model", str(tiny_checkpoint("voxcpm2", stop=False)), "--device", "cpu,cpu", "--workers", "2"),
        *("--client-processes", "2", "--sessions", "4", "4", "--max-patches", "40", "--text", "Morning."),
        *("--kill-engine", "1", "--kill-after-s", "0.5"),  # in the last level only
    )
    assert whole["killed_engine"] is None and (whole["sessions_finished"], whole["sessions_failed"]) == (4, {})
    killed = cut["killed_engine"]
    victim = cut["engines_detail"][1]
    assert killed["index"] == 1 and killed["pid"] == victim["pid"] and not victim["healthy"]
    assert killed["at_s"] >= 0.5 and killed["ready_after"] == 200
    assert killed["generating_at_kill"] == killed["segments_granted_before_kill"] == victim["segments"] > 0
    # One segment per session: of the victim's contexts, those that had audio fail (the others move to engine 0:
    # tests/e2e/test_processes.py), and no other context does.
    assert set(cut["sessions_failed"]) <= {"internal"}
    assert all("engine" in message for message in cut["failure_messages"].values())
    failed = sum(cut["sessions_failed"].values())
    assert failed <= killed["generating_at_kill"]
    assert cut["sessions_finished"] == 4 - failed
    # The sessions that finished got all their audio: as much as each session of the level before, with no kill.
    assert cut["audio_s"] == cut["server_audio_s"] == cut["sessions_finished"] * whole["audio_s_per_session"]


async def test_a_running_server_is_measured_at_its_url_and_a_rate_it_cannot_make_stops_the_run(
    tiny_checkpoint: Callable[..., Path],
) -> None:
    async with server_process(tiny_checkpoint("voxcpm2", stop=False), "--workers", "2", "--max-patches", "4") as server:
        script = (sys.executable, str(REPO / "benchmarks" / "ws_latency.py"), "--url", server.http, "--sessions", "1")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        refused = await asyncio.create_subprocess_exec(
            *script, "--sample-rate", "22050", cwd=REPO, env=env, stdout=PIPE, stderr=PIPE
        )
        out, err = await refused.communicate()
        assert refused.returncode == 1 and not out
        assert (
            err.decode().strip()
            == "ws_latency: the server's PCM rates are 8000, 16000, 24000, 48000 (the model's is 48000), not 22050"
        )
        measured = await asyncio.create_subprocess_exec(
            *script, "--text", "Morning.", cwd=REPO, env=env, stdout=PIPE, stderr=PIPE
        )
        out, err = await measured.communicate()
        assert measured.returncode == 0, err.decode()[-3000:]
    [line] = [orjson.loads(text) for text in out.splitlines()]
    assert line["device"] is None and line["max_patches"] is None and line["audio_s"] == line["server_audio_s"] > 0
    # the supervisor is found as the workers' and the engine's parent
    assert [line["cpu"][role]["processes"] for role in ("supervisor", "engines", "workers")] == [1, 1, 2]


def test_settings_pair_rates_with_formats_and_refuse_what_the_server_cannot_make(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = parse_args(["--format", "opus", "pcm_s16le", "--sample-rate", "48000", "24000", "--sessions", "1", "512"])
    assert args.settings == [Setting("opus", 48000), Setting("pcm_s16le", 24000)] and args.sessions == [1, 512]
    assert parse_args(["--format", "mulaw", "opus"]).settings == [Setting("mulaw", None), Setting("opus", None)]
    assert parse_args(["--device", "cuda"]).sessions == [1, 32, 128, 256]  # as before: PCM at the model's rate
    assert parse_args(["--device", "0,1"]).sessions == [1, 32, 128, 256]  # GPUs by number, one engine each
    assert parse_args(["--device", "cpu,cpu"]).sessions == [1, 8]
    refused = {
        ("--format", "mulaw", "--sample-rate", "16000"): "mulaw is 8000 Hz only",
        ("--format", "opus", "pcm_s16le", "--sample-rate", "44100"): "opus takes --sample-rate",
        ("--format", "opus", "pcm_s16le", "mulaw", "--sample-rate", "48000", "24000"): "one per --format",
        ("--format", "flac"): "invalid choice",
        ("--sessions", "0"): "at least 1",
        ("--url", "http://127.0.0.1:1", "--profile-sessions", "8"): "not one at --url",
        ("--url", "http://127.0.0.1:1", "--server-args=--workers 1"): "--server-args are for the server",
        ("--client-processes", "0"): "at least 1",
        ("--client-cpus", "100000"): "--client-cpus 100000: this process may use",
        ("--client-cpus", cpu_list(os.sched_getaffinity(0))): "leaves no CPU for the server",
        ("--client-cpus", "two"): "invalid parse_cpus value",
        ("--kill-engine", "1"): "go together",
        ("--kill-engine", "-1", "--kill-after-s", "2"): "must be >= 0",
        ("--url", "http://127.0.0.1:1", "--kill-engine", "1", "--kill-after-s", "2"): "not one at --url",
        ("--kill-engine", "0", "--kill-after-s", "2", "--workers", "0"): "not with --workers 0",
        ("--device", "cpu,cpu", "--kill-engine", "2", "--kill-after-s", "2"): "--device cpu,cpu starts 2 engine(s)",
        ("--device", "gpu0"): "--device: bad device 'gpu0'",
    }
    for argv, message in refused.items():
        with pytest.raises(SystemExit):
            parse_args(list(argv))
        assert message in capsys.readouterr().err
    # What only the server's hello tells: its formats and PCM rates.
    check_setting(Setting("pcm_s16le", 24000), {**HELLO, "model": {"sample_rate": 48000}})
    with pytest.raises(ValueError, match="PCM rates are 8000, 16000, 24000, 48000"):
        check_setting(Setting("pcm_s16le", 22050), {**HELLO, "model": {"sample_rate": 48000}})
    with pytest.raises(ValueError, match="the server offers pcm_s16le, not opus"):
        check_setting(Setting("opus", None), {**HELLO, "formats": ["pcm_s16le"], "model": {"sample_rate": 48000}})


@pytest.fixture
def two_children() -> Iterator[list[int]]:
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2)]
    yield [child.pid for child in children]
    for child in children:
        child.kill()
        child.wait()


def test_roles_come_from_status_and_the_supervisor_is_the_workers_parent(two_children: list[int]) -> None:
    engine, worker = two_children
    status = {"engines": [{"pid": engine}], "worker_processes": [{"pid": worker}]}
    assert server_roles(status, 1234) == {"supervisor": [1234], "engines": [engine], "workers": [worker]}
    # --url: the supervisor is found as the common parent of the engines and workers
    assert server_roles(status, None) == {"supervisor": [os.getpid()], "engines": [engine], "workers": [worker]}
    # --workers 0: one process is engine and worker
    single = {"engines": [{"pid": engine}], "worker_processes": [{"pid": engine}]}
    assert server_roles(single, engine) == {"server": [engine]}


def test_a_role_with_a_process_that_cannot_be_read_is_null() -> None:
    assert process_cpu_s(os.getpid()) is not None and process_cpu_s(2**22 + 1) is None  # above Linux's pid_max
    roles = {"engines": [10], "workers": [11, 12]}
    before = {10: 1.0, 11: 2.0, 12: 3.0}
    after = {10: 3.0, 11: 2.5, 12: None}  # worker 12 died during the window
    report = cpu_report(roles, before, after, client_cpu_s=[0.5], window_s=2.0)
    assert report["engines"] == {"processes": 1, "cpu_s": 2.0, "util": 1.0, "cpu_s_max": 2.0, "util_max": 1.0}
    assert report["workers"] is None and report["client"]["util"] == 0.25


def test_spread_is_the_gap_between_the_busiest_and_idlest_engine_over_the_mean() -> None:
    assert spread_pct([90, 110]) == 20.0 and spread_pct([4, 0]) == 200.0 and spread_pct([3, 3, 3]) == 0.0
    assert spread_pct([7]) is None and spread_pct([0, 0]) is None  # one engine, or nothing granted


async def test_a_client_process_that_cannot_connect_stops_the_level_with_its_own_error() -> None:
    async def not_found(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(not_found, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    clients = Clients(2)
    try:
        # One session, in the first process: its error, not a broken pool (the client's Rejected does not unpickle),
        # and the other process, which waits for it at the barrier, is let go.
        with pytest.raises(RuntimeError, match="a client process: Rejected: HTTP 404"):
            url = f"ws://127.0.0.1:{port}/v1/tts/ws"
            await run_level(clients, url, 1, parse_args([]), Setting("opus", None), lambda: {})
    finally:
        clients.close()
        server.close()
