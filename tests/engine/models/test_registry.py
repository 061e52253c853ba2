import json
from pathlib import Path

import pytest

from engine.engine_core import EngineCore
from engine.models.checkpoints import CheckpointError
from engine.models.registry import family_of
from engine.models.voxcpm.runner import VoxCPMRunner
from tests.engine.helpers import engine_config


@pytest.mark.parametrize("variant", ["voxcpm-0.5b", "voxcpm2"])
def test_voxcpm_checkpoints_are_served_by_the_voxcpm_family(tiny_checkpoint, variant: str) -> None:
    path = tiny_checkpoint(variant)
    assert family_of(path).name == "voxcpm"
    core = EngineCore(engine_config(path))
    assert isinstance(core.runner, VoxCPMRunner)
    info = core.info
    assert info.family == "voxcpm" and info.continuation and info.speakers == () and not info.instruction
    v2 = variant == "voxcpm2"
    assert info.voice_roles == (("prompt", "reference", "both") if v2 else ("prompt",))
    assert info.supports_reference is v2


def _config_dir(tmp_path: Path, text: str) -> Path:
    (tmp_path / "config.json").write_text(text)
    return tmp_path


def test_an_unknown_config_names_what_it_found_and_the_known_families(tmp_path: Path) -> None:
    path = _config_dir(tmp_path, json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError, match=r"no model family.*'model_type': 'llama'.*voxcpm \(architecture"):
        family_of(path)
    with pytest.raises(CheckpointError, match="no model family"):
        EngineCore(engine_config(path))


@pytest.mark.parametrize(("text", "error"), [("{not json", "cannot read"), ("[1, 2]", "not a JSON object")])
def test_an_unreadable_config_is_refused(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(CheckpointError, match=error):
        family_of(_config_dir(tmp_path, text))


def test_a_directory_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"cannot read .*config\.json"):
        family_of(tmp_path)
