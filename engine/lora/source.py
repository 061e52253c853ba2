"""Where adapters come from: `NAME=URI[#sha256=HEX]` specs, and fetching a URI into a local adapter directory.

URIs:
- `file:///abs/dir` (or a plain path): a local adapter directory, used in place.
- `hf://owner/repo[@revision][?path=sub/dir]`: a Hugging Face repo (huggingface_hub), the adapter in `sub/dir`.
- `https://host/base/` (or `http://`): a base URL under which `lora_config.json` and `lora_weights.safetensors`
  are fetched, into `cache_dir`.
The optional sha256 is that of `lora_weights.safetensors` (what `sha256sum lora_weights.safetensors` prints);
with it, an https adapter already in the cache is not fetched again.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from engine.lora import CONFIG_FILE, WEIGHTS_FILE, AdapterError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SHA256 = re.compile(r"[0-9a-f]{64}")


class SourceError(AdapterError):
    """An adapter URI that is malformed, unreachable, or whose content does not match its checksum."""


@dataclass(frozen=True, slots=True)
class AdapterSource:
    name: str
    uri: str
    sha256: str | None = None


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise SourceError(f"bad LoRA name {name!r}: 1-64 of letters, digits, '.', '_', '-' (not first)")
    return name


def check_sha256(sha256: str | None) -> str | None:
    if sha256 is not None and not SHA256.fullmatch(sha256):
        raise SourceError(f"bad sha256 {sha256!r}: 64 lowercase hex digits")
    return sha256


def parse_spec(spec: str) -> AdapterSource:
    """`NAME=URI[#sha256=HEX]` -> AdapterSource."""
    name, sep, rest = spec.strip().partition("=")
    if not sep or not rest:
        raise SourceError(f"bad LoRA spec {spec!r}: expected NAME=URI[#sha256=HEX]")
    uri, _, fragment = rest.partition("#")
    sha256 = None
    if fragment:
        key, _, value = fragment.partition("=")
        if key != "sha256":
            raise SourceError(f"bad LoRA spec {spec!r}: the only fragment is #sha256=HEX")
        sha256 = value
    return AdapterSource(check_name(name.strip()), uri, check_sha256(sha256))


def parse_specs(values: list[str]) -> list[AdapterSource]:
    """Repeated and/or comma-separated specs; a name given twice is an error."""
    sources = [parse_spec(part) for value in values for part in value.split(",") if part.strip()]
    names = [s.name for s in sources]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SourceError(f"LoRA name(s) given twice: {', '.join(twice)}")
    return sources


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _verify(directory: Path, uri: str, sha256: str | None) -> Path:
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise SourceError(f"{uri}: no {name} there (an adapter is {CONFIG_FILE} + {WEIGHTS_FILE})")
    if sha256 is not None:
        got = file_sha256(directory / WEIGHTS_FILE)
        if got != sha256:
            raise SourceError(f"{uri}: checksum mismatch for {WEIGHTS_FILE}: expected sha256 {sha256}, got {got}")
    return directory


def _fetch_http(uri: str, sha256: str | None, cache_dir: Path, timeout: float) -> Path:
    target = cache_dir / "http" / hashlib.sha256(uri.encode()).hexdigest()[:32]
    if sha256 is not None and (target / WEIGHTS_FILE).is_file():
        try:
            return _verify(target, uri, sha256)
        except SourceError:
            pass  # a stale or partial copy: fetch again
    base = uri if uri.endswith("/") else uri + "/"
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".fetch-"))
    try:
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            url = urllib.parse.urljoin(base, name)
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response, (staging / name).open("wb") as out:
                    shutil.copyfileobj(response, out)
            except urllib.error.HTTPError as exc:
                raise SourceError(f"cannot fetch {url}: HTTP {exc.code} {exc.reason}") from exc
            except (urllib.error.URLError, OSError, ValueError) as exc:
                reason = getattr(exc, "reason", None) or exc
                raise SourceError(f"cannot fetch {url}: {reason}") from exc
        _verify(staging, uri, sha256)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _fetch_hf(uri: str, sha256: str | None, cache_dir: Path) -> Path:
    parsed = urllib.parse.urlsplit(uri)
    repo, _, revision = (parsed.netloc + parsed.path).partition("@")
    sub = urllib.parse.parse_qs(parsed.query).get("path", [""])[0].strip("/")
    if repo.count("/") != 1:
        raise SourceError(f"bad hf URI {uri!r}: expected hf://owner/repo[@revision][?path=dir]")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise SourceError(f"{uri}: hf:// adapters need huggingface_hub (pip install 'voxstream[hub]')") from exc
    patterns = [f"{sub}/{name}" if sub else name for name in (CONFIG_FILE, WEIGHTS_FILE)]
    try:
        root = snapshot_download(
            repo_id=repo, revision=revision or None, allow_patterns=patterns, cache_dir=str(cache_dir / "hf")
        )
    except Exception as exc:  # huggingface_hub raises many types (HTTP, offline, not found): all mean "unreachable"
        raise SourceError(f"cannot fetch {uri}: {type(exc).__name__}: {exc}") from exc
    return _verify(Path(root) / sub, uri, sha256)


def fetch(uri: str, sha256: str | None, cache_dir: str | Path, timeout: float = 30.0) -> Path:
    """The local adapter directory for `uri`, fetched into `cache_dir` when remote; checked against `sha256`."""
    check_sha256(sha256)
    scheme = urllib.parse.urlsplit(uri).scheme
    cache_dir = Path(cache_dir)
    if scheme in ("", "file"):
        path = Path(urllib.parse.unquote(urllib.parse.urlsplit(uri).path) if scheme else uri).expanduser()
        if not path.is_dir():
            raise SourceError(f"{uri}: no such adapter directory")
        return _verify(path, uri, sha256)
    if scheme in ("http", "https"):
        return _fetch_http(uri, sha256, cache_dir, timeout)
    if scheme == "hf":
        return _fetch_hf(uri, sha256, cache_dir)
    raise SourceError(f"unsupported LoRA URI {uri!r}: file://, hf:// or https://")
