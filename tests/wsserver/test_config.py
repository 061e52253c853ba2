from __future__ import annotations

from pathlib import Path

import pytest

from wsserver import config
from wsserver.config import parse_args


def test_flags_environment_and_defaults() -> None:
    config = parse_args(
        ["--port", "9000", "--max-contexts", "3"], {"TTSWS_PORT": "1", "TTSWS_MODEL": "m", "TTSWS_VOICES_DIR": "/v"}
    )
    assert (config.port, config.model, config.voices_dir, config.limits.max_contexts) == (9000, "m", Path("/v"), 3)
    assert config.bind_host == "127.0.0.1"  # no API key: loopback only


def test_api_key_opens_all_interfaces_unless_a_host_is_given() -> None:
    assert parse_args(["--api-key", "k"], {}).bind_host == "0.0.0.0"
    assert parse_args(["--api-key", "k", "--host", "10.0.0.1"], {}).bind_host == "10.0.0.1"


def test_lora_flags() -> None:
    sha = "ab" * 32
    config = parse_args(["--lora", f"calm=file:///a#sha256={sha}", "--lora", "b=/b,c=hf://o/r@v2?path=x"], {})
    assert [(s.name, s.uri, s.sha256) for s in config.loras] == [
        ("calm", "file:///a", sha),
        ("b", "/b", None),
        ("c", "hf://o/r@v2?path=x", None),
    ]
    assert config.lora_slots() == 8  # --lora without --max-loras: room to add more at run time
    assert parse_args(["--max-loras", "3"], {"TTSWS_LORA": "a=/a"}).lora_slots() == 3
    assert parse_args([], {}).lora_slots() == 0  # no LoRA: none of its cost


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lora", "nameless"], "expected NAME=URI"),
        (["--lora", "a=/a,a=/b"], "given twice"),
        (["--lora", "a=/a#sha256=00"], "bad sha256"),
        (["--lora", "a=/a,b=/b", "--max-loras", "1"], "names 2 adapters but --max-loras is 1"),
        (["--max-lora-rank", "0"], "--max-lora-rank >= 1"),
    ],
)
def test_bad_lora_flags(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv, {})
    assert message in capsys.readouterr().err


def test_pacing_flags_reach_the_engine_config() -> None:
    defaults = parse_args([], {}).engine_config("m", "cpu", ())
    assert (defaults.pace_admissions, defaults.pacing_margin_ms, defaults.pacing_max_hold_ms) == (False, 50.0, 500.0)
    argv = ["--pacing-margin-ms", "80", "--pacing-max-hold-ms", "300", "--max-loras", "2"]
    config = parse_args(argv, {"TTSWS_PACE_ADMISSIONS": "on"})
    engine = config.engine_config("m", "cuda", (("calm", "/a"),))
    assert (engine.pace_admissions, engine.pacing_margin_ms, engine.pacing_max_hold_ms) == (True, 80.0, 300.0)
    assert (engine.model, engine.device) == ("m", "cuda")
    assert (engine.max_num_seqs, engine.max_loras, engine.loras) == (config.max_num_seqs, 2, (("calm", "/a"),))
    assert not parse_args(["--pace-admissions", "off"], {"TTSWS_PACE_ADMISSIONS": "on"}).pace_admissions


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--pace-admissions", "maybe"], "'maybe' is not on or off"), (["--pacing-max-hold-ms", "-1"], "must be >= 0")],
)
def test_bad_pacing_flags(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv, {})
    assert message in capsys.readouterr().err


def test_opus_complexity_flag() -> None:
    assert parse_args([], {}).opus_complexity == 10  # libopus's own default
    assert parse_args([], {"TTSWS_OPUS_COMPLEXITY": "5"}).opus_complexity == 5
    assert parse_args(["--opus-complexity", "0"], {"TTSWS_OPUS_COMPLEXITY": "5"}).opus_complexity == 0


def test_opus_min_complexity_flag() -> None:
    assert parse_args([], {}).opus_min_complexity == 4  # a busy worker goes no lower
    assert parse_args(["--opus-min-complexity", "10"], {}).opus_min_complexity == 10  # fixed at 10


@pytest.mark.parametrize("flag", ["--opus-complexity", "--opus-min-complexity"])
@pytest.mark.parametrize("value", ["11", "-1"])
def test_bad_opus_complexity(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args([flag, value], {})
    assert f"{flag} must be 0-10, not {value}" in capsys.readouterr().err


def test_coalesce_flags_reach_the_engine() -> None:
    config = parse_args(["--coalesce-ms", "4", "--coalesce-max-ms", "60"], {})
    engine = config.engine_config("m", "cpu", ())
    assert (engine.coalesce_ms, engine.coalesce_max_ms) == (4.0, 60.0)


@pytest.mark.parametrize(
    "argv", [["--coalesce-ms", "200"], ["--coalesce-ms", "9", "--coalesce-max-ms", "8"], ["--coalesce-ms", "-1"]]
)
def test_bad_coalesce_flags(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv, {})
    assert "--coalesce-ms must be >= 0 and at most --coalesce-max-ms" in capsys.readouterr().err


def test_prefill_ahead_flag_reaches_the_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args([], {}).engine_config("m", "cpu", ()).prefill_ahead_tokens == 8192
    assert parse_args(["--prefill-ahead-tokens", "0"], {}).engine_config("m", "cpu", ()).prefill_ahead_tokens == 0
    with pytest.raises(SystemExit):
        parse_args(["--prefill-ahead-tokens", "-1"], {})
    assert "--prefill-ahead-tokens must be >= 0" in capsys.readouterr().err


def test_fp8_gemms_flag_reaches_the_engine() -> None:
    assert not parse_args([], {}).engine_config("m", "cpu", ()).fp8_gemms
    assert parse_args(["--fp8-gemms", "on"], {}).engine_config("m", "cpu", ()).fp8_gemms
    assert parse_args([], {"TTSWS_FP8_GEMMS": "on"}).fp8_gemms


def test_fp8_backbone_flag_reaches_the_engine() -> None:
    assert not parse_args([], {}).engine_config("m", "cpu", ()).fp8_backbone
    config = parse_args(["--fp8-backbone", "on"], {}).engine_config("m", "cpu", ())
    assert config.fp8_backbone and not config.fp8_gemms
    assert parse_args([], {"TTSWS_FP8_BACKBONE": "on"}).fp8_backbone
    assert parse_args([], {}).engine_config("m", "cpu", ()).fp8_backbone_min_rows == 0
    rows = parse_args(["--fp8-backbone-min-rows", "8192"], {}).engine_config("m", "cpu", ()).fp8_backbone_min_rows
    assert rows == 8192 and parse_args([], {"TTSWS_FP8_BACKBONE_MIN_ROWS": "4096"}).fp8_backbone_min_rows == 4096


def test_step_trace_dir_gives_each_engine_its_file(tmp_path: Path) -> None:
    assert parse_args([], {}).engine_config("m", "cpu", ()).step_trace == ""
    config = parse_args(["--step-trace-dir", str(tmp_path)], {})
    assert config.engine_config("m", "cuda", (), index=1).step_trace == str(tmp_path / "engine-1.jsonl")
    assert config.engine_config("m", "cuda", ()).step_trace == str(tmp_path / "engine-0.jsonl")


def test_max_prefill_tokens_flag_reaches_the_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args([], {}).engine_config("m", "cpu", ()).max_prefill_tokens == 8192
    assert parse_args(["--max-prefill-tokens", "16384"], {}).engine_config("m", "cpu", ()).max_prefill_tokens == 16384
    with pytest.raises(SystemExit):
        parse_args(["--max-prefill-tokens", "0"], {})
    assert "--max-prefill-tokens must be >= 1" in capsys.readouterr().err


def test_idle_prefill_tokens_flag_reaches_the_engine(capsys: pytest.CaptureFixture[str]) -> None:
    default = parse_args([], {}).engine_config("m", "cpu", ())
    assert default.idle_prefill_tokens is None and default.idle_prefill_budget == 16384  # 64 slots: the floor
    assert parse_args(["--max-num-seqs", "1024"], {}).engine_config("m", "cpu", ()).idle_prefill_budget == 96 * 1024
    assert parse_args(["--idle-prefill-tokens", "0"], {}).engine_config("m", "cpu", ()).idle_prefill_tokens == 0
    with pytest.raises(SystemExit):
        parse_args(["--idle-prefill-tokens", "-1"], {})
    assert "--idle-prefill-tokens must be >= 0" in capsys.readouterr().err


def test_a_step_trace_dir_that_cannot_be_made_is_refused_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit):
        parse_args(["--step-trace-dir", str(tmp_path / "file" / "trace")], {})
    assert "--step-trace-dir" in capsys.readouterr().err
    parse_args(["--step-trace-dir", str(tmp_path / "new" / "trace")], {})
    assert (tmp_path / "new" / "trace").is_dir()  # made at start, parents too


def test_first_chunk_hold_flag() -> None:
    assert parse_args([], {}).engine_config("m", "cpu", ()).first_chunk_hold_positions == 1024
    config = parse_args(["--first-chunk-hold-positions", "0"], {})
    assert config.engine_config("m", "cpu", ()).first_chunk_hold_positions == 0
    with pytest.raises(SystemExit):
        parse_args(["--first-chunk-hold-positions", "-1"], {})


@pytest.mark.parametrize(
    ("devices", "cores", "workers"),
    [
        ("0", 16, 14),  # one GPU: a core each for the engine and the supervisor
        ("0", 64, 16),  # at most WORKERS_PER_ENGINE for one engine
        ("0,1,2,3", 64, 59),  # four GPUs on a 64-core host: all the cores left, not one engine's share
        ("0,1", 2, 1),  # never none
    ],
)
def test_default_workers_scale_with_the_engines(
    devices: str, cores: int, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "available_cores", lambda: cores)
    assert parse_args(["--devices", devices]).worker_count() == workers
    assert parse_args(["--devices", devices, "--workers", "3"]).worker_count() == 3


def test_a_missing_static_dir_is_refused_at_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--static-dir", str(tmp_path / "nowhere")])
    assert f"--static-dir {tmp_path / 'nowhere'} is not a directory" in capsys.readouterr().err
    assert parse_args(["--static-dir", str(tmp_path)]).static_dir == tmp_path
