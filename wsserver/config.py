"""Server configuration: the only place that reads the command line and the environment.

Every flag `--some-flag` can also be set with the environment variable `TTSWS_SOME_FLAG`; the flag wins.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import EngineConfig
from engine.lora.source import AdapterSource, SourceError, parse_specs
from wsserver.admission import ClientLimits
from wsserver.decoding import UploadLimits
from wsserver.protocol import Limits
from wsserver.voices import DEFAULT_VOICE, OPENAI_VOICES

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
# Uploaded voices are user data, not a cache: they live under XDG_DATA_HOME unless --voices-store says otherwise.
DATA_HOME = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
DEFAULT_VOICES_STORE = DATA_HOME / "voxstream" / "voices"
# Fetched LoRA adapters are a cache: they can always be fetched again.
DEFAULT_LORA_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "voxstream" / "loras"
LORA_SLOTS_WITH_LORAS = 8  # --max-loras when --lora is given without it


@dataclass(frozen=True, slots=True)
class EngineDevice:
    device: str  # EngineConfig.device: "auto", "cpu" or "cuda"
    gpu: str | None = None  # the one GPU its process sees (CUDA_VISIBLE_DEVICES), if named


# The most front-end processes the default gives one engine: an H200's 512 Opus streams at 48 kHz (complexity 10) kept
# 14 workers 74 % busy (docs/benchmarks.md, "End to end over the WebSocket"); a host with more GPUs needs that many
# per GPU.
WORKERS_PER_ENGINE = 16


@dataclass(frozen=True, slots=True)
class ServerConfig:
    model: str | None = None  # checkpoint directory or Hugging Face repo id; None: the offline tiny demo checkpoint
    devices: str = "auto"  # one engine per entry (engine_devices)
    workers: int | None = None  # front-end processes; None: from the cores; 0: one process, the engine on a thread
    host: str | None = None  # None: 127.0.0.1 without an API key, all interfaces with one
    port: int = 8000
    api_key: str | None = None
    admin_key: str | None = None  # needed (instead of api_key) to add or delete voices; None: api_key guards all
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed besides the server's own (and localhost, keyless)
    trusted_proxies: tuple[str, ...] = ()  # addresses or networks whose X-Forwarded-For names the client
    max_connections_per_client: int = 0  # sessions and speech requests one client address may hold; 0: no limit
    handshakes_per_client_s: float = 0.0  # new sessions and speech requests per second per client; 0: no limit
    max_connections: int = 256
    max_num_seqs: int = 64  # engine slots: segments generating at once; more wait in the server's FIFO
    max_patches: int = 2000  # absolute cap on patches per segment
    max_prefill_tokens: int = 8192  # prompt positions an engine step admits (EngineConfig)
    idle_prefill_tokens: int | None = None  # ... a step of an idle engine, nothing decoding (EngineConfig says why)
    # Idle engine: a lone request goes at once; the ones after it, or several arriving together, wait until none arrived
    # for coalesce_ms, at most coalesce_max_ms after the first (EngineConfig, engine.engine_loop). Wider than the
    # engine's own defaults (1, 20): a burst of sessions reaches the engine through the workers' segmenters and IPC,
    # spread over tens of ms with gaps of a few. Cut in two, its first wave starts playing and then waits out the second
    # wave's prefill: on one H100, 256 Opus sessions starved 69 times at 1/20 ms (each at 0.14 s of audio) and never at
    # 5/150, whose first frames also came sooner (p50 330 ms, not 416).
    coalesce_ms: float = 5.0
    coalesce_max_ms: float = 150.0
    prefill_ahead_tokens: int = 8192  # a quietening burst's queued prompt positions prefilled ahead (EngineConfig)
    # A stream's first chunk waits for its second while the next engine step is due to admit more than this many
    # prompt positions (EngineConfig): such a step outlasts the 140 ms a stream that has just started holds. A burst
    # of more prompt positions than an idle step admits (idle_prefill_tokens) comes in two waves, and the step that
    # admits the second is that long (engine step traces on one H200, 512 sessions of 21-position prompts, when an
    # idle step admitted 8,192: 390 then 122 admitted, the second step 141-207 ms). There, in one call, 512 PCM
    # sessions starved none with 1024 where four runs without starved 218-393 (docs/benchmarks.md, "End to end
    # over the WebSocket"); 0 turns the hold off.
    first_chunk_hold_positions: int = 1024
    fp8_gemms: bool = False  # VoxCPM: the LocDiT's GEMMs in FP8 (EngineConfig)
    fp8_backbone: bool = False  # VoxCPM: the LocEnc's and LMs' GEMMs in FP8 too (EngineConfig)
    fp8_backbone_min_rows: int = 0  # ... in calls of this many rows or more (0: the engine's FP8_MIN_ROWS)
    pace_admissions: bool = False  # admit only what the playing streams' buffered audio can spare (EngineConfig)
    pacing_margin_ms: float = 50.0  # audio a stream keeps in hand when admissions are paced (EngineConfig)
    pacing_max_hold_ms: float = 500.0  # paced admissions: the longest the queue's head is held (EngineConfig)
    step_trace_dir: Path | None = None  # each engine N writes a JSON line per step to DIR/engine-N.jsonl (EngineConfig)
    carry_s: float = 3.0  # audio carried from one segment to the next for voice continuity
    # libopus's effort per frame, 0-10: its encoder is most of the workers' CPU at scale, and 5 costs about half of 10.
    # A worker short of CPU lowers it for its streams, down to opus_min_complexity (wsserver.opus_load).
    opus_complexity: int = 10
    opus_min_complexity: int = 4
    voices_dir: Path | None = None
    voices_store: Path = DEFAULT_VOICES_STORE
    max_voices: int = 1000  # uploaded voices kept in the store
    # Extra names for voices (OpenAI's voice names, which some clients insist on, all name `default` to begin with).
    voice_aliases: dict[str, str] = field(default_factory=lambda: dict.fromkeys(OPENAI_VOICES, DEFAULT_VOICE))
    uploads: UploadLimits = field(default_factory=UploadLimits)
    static_dir: Path = REPO_ROOT / "web_demo"
    drain_timeout_s: float = 30.0  # SIGTERM: how long open contexts may take to finish
    limits: Limits = field(default_factory=Limits)
    loras: tuple[AdapterSource, ...] = ()  # --lora: adapters loaded at start
    max_loras: int = 0  # adapters resident at once; 0: no LoRA support (no cost in the engine)
    max_lora_rank: int = 32
    lora_cache_dir: Path = DEFAULT_LORA_CACHE

    def lora_slots(self) -> int:
        """max_loras as the engines get it: --max-loras, or 8 when --lora names adapters without it."""
        return self.max_loras or (max(LORA_SLOTS_WITH_LORAS, len(self.loras)) if self.loras else 0)

    def engine_devices(self) -> list[EngineDevice]:
        """`devices` as engines: "auto", "cpu", "cuda" or "cuda:N" is one engine; a comma list is one engine per entry,
        a bare N meaning GPU N ("0,1": two engines, one per GPU; "cpu,cpu": two CPU engines, for tests)."""
        entries = [entry.strip() for entry in self.devices.split(",") if entry.strip()]
        if not entries:
            raise ValueError("--devices lists no device")
        out = []
        for entry in entries:
            gpu = entry.removeprefix("cuda:") if entry.startswith("cuda:") else entry if entry.isdigit() else None
            if gpu is not None and not gpu.isdigit():
                raise ValueError(f"bad device {entry!r}: auto, cpu, cuda, cuda:N or N")
            if gpu is None and entry not in ("auto", "cpu", "cuda"):
                raise ValueError(f"bad device {entry!r}: auto, cpu, cuda, cuda:N or N")
            out.append(EngineDevice("cuda" if gpu is not None else entry, gpu))
        return out

    def worker_count(self) -> int:
        """Front-end processes: as configured, else one per core left over by the engines and the supervisor (at least
        one, at most WORKERS_PER_ENGINE per engine)."""
        if self.workers is not None:
            return self.workers
        engines = len(self.engine_devices())
        return max(1, min(WORKERS_PER_ENGINE * engines, available_cores() - engines - 1))

    def engine_config(
        self, model: str, device: str, loras: tuple[tuple[str, str], ...], index: int = 0
    ) -> EngineConfig:
        """Engine `index`'s configuration: the server's engine settings, on `device`, with its start-up adapters."""
        trace = "" if self.step_trace_dir is None else str(self.step_trace_dir / f"engine-{index}.jsonl")
        return EngineConfig(
            model=model,
            device=device,
            max_num_seqs=self.max_num_seqs,
            max_patches=self.max_patches,
            max_prefill_tokens=self.max_prefill_tokens,
            idle_prefill_tokens=self.idle_prefill_tokens,
            coalesce_ms=self.coalesce_ms,
            coalesce_max_ms=self.coalesce_max_ms,
            prefill_ahead_tokens=self.prefill_ahead_tokens,
            first_chunk_hold_positions=self.first_chunk_hold_positions,
            fp8_gemms=self.fp8_gemms,
            fp8_backbone=self.fp8_backbone,
            fp8_backbone_min_rows=self.fp8_backbone_min_rows,
            pace_admissions=self.pace_admissions,
            pacing_margin_ms=self.pacing_margin_ms,
            pacing_max_hold_ms=self.pacing_max_hold_ms,
            max_loras=self.lora_slots(),
            max_lora_rank=self.max_lora_rank,
            loras=loras,
            step_trace=trace,
        )

    def client_limits(self) -> ClientLimits:
        return ClientLimits(self.max_connections_per_client, self.handshakes_per_client_s)

    @property
    def bind_host(self) -> str:
        # Without an API key anyone who can reach the port can use the GPU: stay on loopback unless told otherwise.
        return self.host or ("0.0.0.0" if self.api_key else "127.0.0.1")


def available_cores() -> int:
    """The cores this process may use: its CPU affinity, and its cgroup's CPU quota (a container's CPU limit), which
    affinity does not show."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    return cores


def parse_args(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> ServerConfig:
    env = os.environ if env is None else env
    defaults, limits, uploads = ServerConfig(), Limits(), UploadLimits()
    parser = argparse.ArgumentParser(prog="python -m wsserver", description="ttsws/1 streaming TTS server")

    def option(name: str, kind: Callable[[str], object], default: object, help_text: str, *aliases: str) -> None:
        variable = "TTSWS_" + name.upper().replace("-", "_")
        value = env.get(variable, default)
        parser.add_argument(f"--{name}", *aliases, type=kind, default=value, help=f"{help_text} (env {variable})")

    option("model", str, defaults.model, "checkpoint directory or Hugging Face repo id; none: the tiny demo")
    devices_help = "one engine per entry: auto, cpu, cuda, cuda:N, or N,M,... (GPUs)"
    option("devices", str, defaults.devices, devices_help, "--device")
    option("workers", int, defaults.workers, "front-end processes (default: from the cores; 0: one process)")
    option("host", str, defaults.host, "bind address; default 127.0.0.1 without --api-key, 0.0.0.0 with")
    option("port", int, defaults.port, "port")
    option("api-key", str, defaults.api_key, "require 'Authorization: Bearer KEY' or ?token=KEY")
    option("admin-key", str, defaults.admin_key, "the key that may add and delete voices (default: the API key)")
    option("allowed-origins", _names, "", "browser origins besides the server's own that may call it (* for any)")
    option("trusted-proxies", _names, "", "addresses/networks whose X-Forwarded-For names the client (comma list)")
    option("max-connections-per-client", int, 0, "sessions and speech requests per client address (0: no limit)")
    option("handshakes-per-client-s", float, 0.0, "new sessions and requests per second per client (0: no limit)")
    option("max-connections", int, defaults.max_connections, "WebSocket sessions; more get HTTP 503")
    option("max-num-seqs", int, defaults.max_num_seqs, "engine slots (segments generating at once)")
    option("max-patches", int, defaults.max_patches, "cap on generated patches per segment")
    option("max-prefill-tokens", int, defaults.max_prefill_tokens, "prompt positions one engine step admits")
    option(
        "idle-prefill-tokens",
        int,
        defaults.idle_prefill_tokens,
        "prompt positions a step of an idle engine admits (never fewer than --max-prefill-tokens; default: 96 per"
        " engine slot, at least 16384)",
    )
    option("coalesce-ms", float, defaults.coalesce_ms, "idle engine: admit a burst once nothing arrived for this long")
    option("coalesce-max-ms", float, defaults.coalesce_max_ms, "idle engine: the longest a burst's arrivals wait")
    option(
        "prefill-ahead-tokens",
        int,
        defaults.prefill_ahead_tokens,
        "idle engine: prefill a burst's arrivals while it still arrives, this many prompt positions at a time (0: no)",
    )
    option(
        "first-chunk-hold-positions",
        int,
        defaults.first_chunk_hold_positions,
        "a stream's first chunk waits for its second while the next step admits more prompt positions (0: never)",
    )
    option("fp8-gemms", _switch, defaults.fp8_gemms, "on: VoxCPM's LocDiT GEMMs in FP8 (faster; stated drift)")
    option("fp8-backbone", _switch, defaults.fp8_backbone, "on: VoxCPM's LocEnc and LM GEMMs in FP8 too, at batch")
    option(
        "fp8-backbone-min-rows",
        int,
        defaults.fp8_backbone_min_rows,
        "--fp8-backbone from this many rows per call (0: 512; 8192: large admissions' prefills alone)",
    )
    option("pace-admissions", _switch, defaults.pace_admissions, "on: a step admits what playing streams can spare")
    option("pacing-margin-ms", float, defaults.pacing_margin_ms, "paced admissions: audio each stream keeps in hand")
    option("pacing-max-hold-ms", float, defaults.pacing_max_hold_ms, "paced admissions: longest hold of the queue")
    option("step-trace-dir", Path, defaults.step_trace_dir, "each engine writes a line per step to DIR/engine-N.jsonl")
    option("carry-s", float, defaults.carry_s, "seconds of audio carried between segments of a context")
    option("opus-complexity", int, defaults.opus_complexity, "libopus encoder complexity, 0-10 (lower: less CPU)")
    option("opus-min-complexity", int, defaults.opus_min_complexity, "the least a busy worker lowers it to")
    option("voices-dir", Path, defaults.voices_dir, "NAME.wav + NAME.txt prompt voices")
    option("voices-store", Path, defaults.voices_store, "directory of uploaded voices (may be shared by replicas)")
    option("max-voices", int, defaults.max_voices, "uploaded voices kept")
    option("voice-aliases", _aliases, "", "NAME=VOICE,... more names for voices (OpenAI's names all alias 'default')")
    option("max-upload-bytes", int, uploads.max_bytes, "largest voice upload (HTTP 413 beyond)")
    option("max-voice-s", float, uploads.max_duration_s, "longest voice upload, in seconds of audio")
    option("static-dir", Path, defaults.static_dir, "files served at /")
    option("drain-timeout-s", float, defaults.drain_timeout_s, "SIGTERM: time open contexts get to finish")
    option("max-contexts", int, limits.max_contexts, "open contexts per session")
    option("max-message-bytes", int, limits.max_message_bytes, "largest client message")
    option("max-text-chars", int, limits.max_text_chars, "text per context")
    option("idle-timeout-s", float, limits.idle_timeout_s, "close a session idle this long")
    option("stall-timeout-s", float, limits.stall_timeout_s, "close a session whose client reads nothing this long")
    option("max-messages-per-s", float, limits.max_messages_per_s, "client messages per second per session")
    option("send-buffer-bytes", int, limits.send_buffer_bytes, "queued output per session before its audio pauses")
    parser.add_argument(
        "--lora",
        action="append",
        default=[env["TTSWS_LORA"]] if env.get("TTSWS_LORA") else [],
        help="NAME=URI[#sha256=HEX] LoRA adapters loaded at start, repeatable or a comma list; URI: file://, "
        "hf://owner/repo[@rev][?path=dir], https://base/ (env TTSWS_LORA)",
    )
    option("max-loras", int, defaults.max_loras, "LoRA adapters resident at once (default 0, or 8 with --lora)")
    option("max-lora-rank", int, defaults.max_lora_rank, "largest LoRA rank accepted")
    option("lora-cache-dir", Path, defaults.lora_cache_dir, "where fetched LoRA adapters are kept")
    args = parser.parse_args(argv)
    try:
        loras = tuple(parse_specs(args.lora))
    except SourceError as exc:
        parser.error(f"--lora: {exc}")
    if args.max_prefill_tokens < 1:
        parser.error("--max-prefill-tokens must be >= 1")
    if args.idle_prefill_tokens is not None and args.idle_prefill_tokens < 0:
        parser.error("--idle-prefill-tokens must be >= 0")
    if args.prefill_ahead_tokens < 0:
        parser.error("--prefill-ahead-tokens must be >= 0")
    if args.first_chunk_hold_positions < 0:
        parser.error("--first-chunk-hold-positions must be >= 0")
    if not 0 <= args.coalesce_ms <= args.coalesce_max_ms:
        parser.error("--coalesce-ms must be >= 0 and at most --coalesce-max-ms")
    if args.pacing_margin_ms < 0 or args.pacing_max_hold_ms < 0:
        parser.error("--pacing-margin-ms and --pacing-max-hold-ms must be >= 0")
    if not 0 <= args.opus_complexity <= 10:
        parser.error(f"--opus-complexity must be 0-10, not {args.opus_complexity}")
    if not 0 <= args.opus_min_complexity <= 10:
        parser.error(f"--opus-min-complexity must be 0-10, not {args.opus_min_complexity}")
    if not args.static_dir.is_dir():
        # Checked here, once: every worker would otherwise fail to start on it and be started again, endlessly.
        parser.error(f"--static-dir {args.static_dir} is not a directory")
    if args.step_trace_dir is not None:
        # Checked here, once: an engine that cannot write its trace would fail to start, again and again.
        try:
            args.step_trace_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            parser.error(f"--step-trace-dir {args.step_trace_dir}: {exc.strerror}")
        if not os.access(args.step_trace_dir, os.W_OK):
            parser.error(f"--step-trace-dir {args.step_trace_dir} is not writable")
    if args.max_loras < 0 or args.max_lora_rank < 1:
        parser.error("--max-loras must be >= 0 and --max-lora-rank >= 1")
    if args.max_loras and len(loras) > args.max_loras:
        parser.error(f"--lora names {len(loras)} adapters but --max-loras is {args.max_loras}")
    config = ServerConfig(
        model=args.model,
        devices=args.devices,
        workers=args.workers,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        admin_key=args.admin_key,
        allowed_origins=args.allowed_origins,
        trusted_proxies=args.trusted_proxies,
        max_connections_per_client=args.max_connections_per_client,
        handshakes_per_client_s=args.handshakes_per_client_s,
        max_connections=args.max_connections,
        max_num_seqs=args.max_num_seqs,
        max_patches=args.max_patches,
        max_prefill_tokens=args.max_prefill_tokens,
        idle_prefill_tokens=args.idle_prefill_tokens,
        coalesce_ms=args.coalesce_ms,
        coalesce_max_ms=args.coalesce_max_ms,
        prefill_ahead_tokens=args.prefill_ahead_tokens,
        first_chunk_hold_positions=args.first_chunk_hold_positions,
        fp8_gemms=args.fp8_gemms,
        fp8_backbone=args.fp8_backbone,
        fp8_backbone_min_rows=args.fp8_backbone_min_rows,
        pace_admissions=args.pace_admissions,
        pacing_margin_ms=args.pacing_margin_ms,
        pacing_max_hold_ms=args.pacing_max_hold_ms,
        step_trace_dir=args.step_trace_dir,
        carry_s=args.carry_s,
        opus_complexity=args.opus_complexity,
        opus_min_complexity=args.opus_min_complexity,
        voices_dir=args.voices_dir,
        voices_store=args.voices_store,
        max_voices=args.max_voices,
        voice_aliases=defaults.voice_aliases | (args.voice_aliases or {}),
        uploads=UploadLimits(max_bytes=args.max_upload_bytes, max_duration_s=args.max_voice_s),
        static_dir=args.static_dir,
        drain_timeout_s=args.drain_timeout_s,
        limits=Limits(
            max_contexts=args.max_contexts,
            max_message_bytes=args.max_message_bytes,
            max_text_chars=args.max_text_chars,
            idle_timeout_s=args.idle_timeout_s,
            stall_timeout_s=args.stall_timeout_s,
            max_messages_per_s=args.max_messages_per_s,
            send_buffer_bytes=args.send_buffer_bytes,
        ),
        loras=loras,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        lora_cache_dir=args.lora_cache_dir,
    )
    try:
        config.engine_devices()
    except ValueError as exc:
        parser.error(str(exc))
    return config


def _switch(text: str) -> bool:
    """'on'/'off' (also true/false, yes/no, 1/0) -> bool."""
    word = text.strip().lower()
    if word in ("on", "true", "yes", "1"):
        return True
    if word in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not on or off")


def _names(text: str) -> tuple[str, ...]:
    """'a, b,c' -> ('a', 'b', 'c')."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _aliases(text: str) -> dict[str, str]:
    """'alloy=vc_0123,echo=default' -> {'alloy': 'vc_0123', 'echo': 'default'}."""
    aliases = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, voice = item.partition("=")
        if not sep or not name.strip() or not voice.strip():
            raise argparse.ArgumentTypeError(f"voice alias {item!r} is not NAME=VOICE")
        aliases[name.strip()] = voice.strip()
    return aliases


def resolve_model(config: ServerConfig) -> str:
    """The checkpoint to load: the configured one, or the tiny demo checkpoint (generated once, offline)."""
    if config.model:
        return config.model
    from engine.models.registry import demo_checkpoint

    path = demo_checkpoint()
    logger.warning(
        "\n%s\nNO --model GIVEN: serving a TINY RANDOM DEMO CHECKPOINT (%s).\n"
        "It exercises the protocol end to end but makes NOISE, NOT SPEECH.\n"
        "Pass --model PATH_OR_HF_REPO_ID (e.g. openbmb/VoxCPM2) for real speech.\n%s",
        "!" * 78,
        path,
        "!" * 78,
    )
    return str(path)
