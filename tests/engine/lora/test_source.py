"""Adapter sources: specs, file:// and http(s):// against a local HTTP server (checksums, caching, errors)."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine.lora.format import WEIGHTS_FILE
from engine.lora.make_adapter import make_adapter
from engine.lora.source import AdapterSource, SourceError, fetch, file_sha256, parse_spec, parse_specs


@pytest.fixture(scope="module")
def adapter(tiny_checkpoint: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("served")
    return make_adapter(tiny_checkpoint("voxcpm2"), root / "calm", rank=2)


@pytest.fixture(scope="module")
def server(adapter: Path) -> Iterator[tuple[str, list[str]]]:
    """(base URL of the adapter's parent directory, paths requested so far)."""
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            requests.append(self.path)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(adapter.parent)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", requests
    httpd.shutdown()
    httpd.server_close()


def test_parse_specs() -> None:
    sha = "a" * 64
    assert parse_spec(f"calm=https://x/y/#sha256={sha}") == AdapterSource("calm", "https://x/y/", sha)
    assert parse_specs(["a=file:///x,b=hf://o/r@v1?path=l", "c=/p"]) == [
        AdapterSource("a", "file:///x"),
        AdapterSource("b", "hf://o/r@v1?path=l"),
        AdapterSource("c", "/p"),
    ]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("noequals", "expected NAME=URI"),
        ("bad name=/x", "bad LoRA name"),
        ("a=/x#md5=00", "the only fragment is #sha256"),
        ("a=/x#sha256=xyz", "bad sha256"),
    ],
)
def test_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(SourceError, match=message):
        parse_spec(spec)


def test_name_given_twice() -> None:
    with pytest.raises(SourceError, match="given twice: a"):
        parse_specs(["a=/x", "a=/y"])


def test_file_uri_in_place_with_checksum(adapter: Path, tmp_path: Path) -> None:
    sha = file_sha256(adapter / WEIGHTS_FILE)
    assert fetch(adapter.as_uri(), sha, tmp_path) == adapter
    assert fetch(str(adapter), None, tmp_path) == adapter
    with pytest.raises(SourceError, match="checksum mismatch"):
        fetch(adapter.as_uri(), "0" * 64, tmp_path)
    with pytest.raises(SourceError, match="no such adapter directory"):
        fetch((tmp_path / "nowhere").as_uri(), None, tmp_path)
    with pytest.raises(SourceError, match=r"no lora_config\.json there"):
        fetch(tmp_path.as_uri(), None, tmp_path)


def test_https_fetch_caches_by_checksum(adapter: Path, server: tuple[str, list[str]], tmp_path: Path) -> None:
    base, requests = server
    sha = file_sha256(adapter / WEIGHTS_FILE)
    got = fetch(f"{base}/calm/", sha, tmp_path)
    assert got.is_relative_to(tmp_path) and file_sha256(got / WEIGHTS_FILE) == sha
    seen = len(requests)
    assert fetch(f"{base}/calm/", sha, tmp_path) == got
    assert len(requests) == seen  # served from the cache
    (got / WEIGHTS_FILE).write_bytes(b"damaged")
    assert fetch(f"{base}/calm/", sha, tmp_path) == got  # a cached copy that no longer matches is fetched again
    assert len(requests) == seen + 2 and file_sha256(got / WEIGHTS_FILE) == sha
    assert fetch(f"{base}/calm", None, tmp_path).is_dir()  # without the trailing slash, without a checksum


def test_https_checksum_mismatch_leaves_nothing(server: tuple[str, list[str]], tmp_path: Path) -> None:
    base, _ = server
    with pytest.raises(SourceError, match="checksum mismatch"):
        fetch(f"{base}/calm/", "0" * 64, tmp_path)
    assert not any((tmp_path / "http").iterdir())


def test_unreachable_uris(server: tuple[str, list[str]], tmp_path: Path) -> None:
    base, _ = server
    with pytest.raises(SourceError, match=r"cannot fetch .*/missing/lora_config\.json: HTTP 404"):
        fetch(f"{base}/missing/", None, tmp_path)
    with pytest.raises(SourceError, match=r"cannot fetch http://127\.0\.0\.1:9/x/lora_config\.json"):
        fetch("http://127.0.0.1:9/x/", None, tmp_path, timeout=2)
    with pytest.raises(SourceError, match="unsupported LoRA URI"):
        fetch("ftp://host/x", None, tmp_path)
    with pytest.raises(SourceError, match="bad hf URI"):
        fetch("hf://just-a-name", None, tmp_path)


def test_hf_unreachable_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(SourceError, match=r"cannot fetch hf://owner/repo@v1\?path=calm"):
        fetch("hf://owner/repo@v1?path=calm", None, tmp_path)
