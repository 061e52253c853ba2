"""LoRA adapters: the released file layout (`format`), where adapters come from (`source`), the resident pool of
device tensors every targeted linear reads (`pool`) and the linear layer that applies them per row (`linear`).

An adapter changes a targeted linear y = x W^T + b into y + (alpha / r) * (x A^T) B^T (voxcpm
`modules/layers/lora.py`). Rows of one batch may each use a different resident adapter, or none.

This package module holds what the server side needs without torch (file names, the error type).
"""

CONFIG_FILE = "lora_config.json"
WEIGHTS_FILE = "lora_weights.safetensors"


class AdapterError(ValueError):
    """An adapter's files or source do not make a valid adapter for this model and engine."""
