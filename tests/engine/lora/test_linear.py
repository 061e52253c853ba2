"""AdapterRows: each row layout is expanded to a linear's input rows and prepared once per forward."""

from __future__ import annotations

import torch

from engine.lora.linear import AdapterRows


def test_a_layout_is_prepared_once_until_the_model_sets_it_again() -> None:
    rows = AdapterRows(slots=4)
    assert rows.prepared("dit", torch.Size((4, 3))) is None  # not set: no adapter for the call
    rows.dit = torch.tensor([1, 0, 3, 2], dtype=torch.int32)
    rows.tokens = torch.tensor([2, 2], dtype=torch.int32)
    first = rows.prepared("dit", torch.Size((4, 3)))
    assert first is not None
    assert first.index.tolist() == [1, 1, 1, 0, 0, 0, 3, 3, 3, 2, 2, 2]  # a row's slot for each of its tokens
    assert rows.prepared("dit", torch.Size((4, 3))) is first  # shared by every linear of the forward
    assert rows.prepared("dit", torch.Size((4,))).index.tolist() == [1, 0, 3, 2]
    tokens = rows.prepared("tokens", torch.Size((2,)))
    rows.dit = torch.tensor([0, 0, 0, 1], dtype=torch.int32)  # the next forward
    again = rows.prepared("dit", torch.Size((4, 3)))
    assert again is not first and again.index.tolist() == [0] * 9 + [1] * 3
    assert rows.prepared("tokens", torch.Size((2,))) is tokens  # other layouts keep theirs
    rows.dit = None
    assert rows.prepared("dit", torch.Size((4, 3))) is None
