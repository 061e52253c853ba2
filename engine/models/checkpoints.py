"""Where a checkpoint is, for every model family: a local directory, or a Hugging Face repo id downloaded once."""

from __future__ import annotations

from pathlib import Path


class CheckpointError(ValueError):
    """The checkpoint cannot be found or read, or its files do not match the model."""


def resolve_checkpoint(path_or_repo: str | Path) -> Path:
    """A local directory as is; anything else is taken as a Hugging Face repo id and downloaded."""
    path = Path(path_or_repo).expanduser()
    if path.is_dir():
        return path
    if path.exists() or str(path_or_repo).startswith((".", "/", "~")) or str(path_or_repo).count("/") != 1:
        raise CheckpointError(f"{path_or_repo!r} is neither a checkpoint directory nor a Hugging Face repo id")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise CheckpointError(
            f"{path_or_repo!r} is not a local directory; loading by Hugging Face repo id needs huggingface_hub "
            "(pip install 'voxstream[hub]')"
        ) from exc
    return Path(snapshot_download(repo_id=str(path_or_repo)))
