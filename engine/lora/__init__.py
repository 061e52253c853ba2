"""LoRA adapters: the released file layout (`format`), where adapters come from (`source`), the resident pool of
device tensors every targeted linear reads (`pool`) and the linear layer that applies them per row (`linear`).

An adapter changes a targeted linear y = x W^T + b into y + (alpha / r) * (x A^T) B^T (voxcpm
`modules/layers/lora.py`). Rows of one batch may each use a different resident adapter, or none.
"""
