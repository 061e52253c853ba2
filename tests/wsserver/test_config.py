from __future__ import annotations

from pathlib import Path

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
