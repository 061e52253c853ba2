"""The Dockerfile: hadolint (from PyPI) finds nothing, and what the image runs is checked against the real server.

No image is built here: that needs a container engine and the base images' registry, which CI does not have."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

from tests.servers import ServeFactory
from wsserver.config import parse_args

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


def instructions(name: str) -> list[str]:
    """The arguments of every `name` instruction, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    return [line.split(None, 1)[1] for line in text.splitlines() if line.split(None, 1)[:1] == [name]]


def test_hadolint_finds_nothing() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run([hadolint, "--no-color", DOCKERFILE], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_runs_as_a_non_root_user_on_the_cuda_runtime() -> None:
    assert instructions("ARG")[0].startswith("BASE_IMAGE=nvidia/cuda:") and "-runtime-" in instructions("ARG")[0]
    assert instructions("USER")[-1].split(":")[0] not in ("0", "root")
    assert instructions("ENTRYPOINT") == ['["python", "-m", "wsserver"]']


def test_everything_copied_from_the_context_exists_and_is_not_docker_ignored() -> None:
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    for copy in instructions("COPY"):
        if copy.startswith("--from"):
            continue
        *sources, _ = copy.split()
        for source in sources:
            assert (REPO / source).exists(), source
            assert f"!{source}" in ignored, f"{source} is excluded from the build context"


def test_the_environment_it_sets_is_the_servers_own_flags() -> None:
    env = dict(item.split("=", 1) for line in instructions("ENV") for item in line.split() if item.startswith("TTSWS_"))
    assert env  # TTSWS_HOST, TTSWS_PORT, TTSWS_VOICES_STORE
    config = parse_args([], env=env)
    assert (config.bind_host, config.port, str(config.voices_store)) == ("0.0.0.0", 8000, "/data/voices")


async def test_the_health_check_passes_when_ready_and_fails_when_draining(serve: ServeFactory) -> None:
    command = json.loads(instructions("HEALTHCHECK")[0].split("CMD", 1)[1])
    async with serve(max_patches=2) as running:
        port = running.http_url.rsplit(":", 1)[1]

        async def check() -> int:
            process = await asyncio.create_subprocess_exec(
                sys.executable, *command[1:], env={"TTSWS_PORT": port}, stderr=asyncio.subprocess.DEVNULL
            )
            return await process.wait()

        assert await check() == 0
        running.server.draining = True  # what SIGTERM sets first: /ready answers 503
        try:
            assert await check() != 0
        finally:
            running.server.draining = False
