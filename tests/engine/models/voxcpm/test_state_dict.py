"""The shared wording of both loaders' strict checks (each loader's own test checks its message end to end)."""

from __future__ import annotations

from engine.models.voxcpm.state_dict import mismatches, name_list


def test_a_matching_checkpoint_has_no_mismatches() -> None:
    assert mismatches({"a": (2, 3), "b": [4]}, {"a": (2, 3), "b": (4,)}) == ""


def test_every_fault_is_named_in_one_message() -> None:
    found = {"a": (2, 3), "extra": (1,), "b": (5,)}
    expected = {"a": (2, 3), "b": (4,), "gone": (7,)}
    assert (
        mismatches(found, expected)
        == "unknown tensors: extra; missing tensors: gone; wrong shapes: b (5,) (expected (4,))"
    )


def test_long_lists_are_cut_with_a_count() -> None:
    names = [f"t{i:02d}" for i in range(15)]
    assert name_list(names) == ", ".join(names[:12]) + ", ... (3 more)"
    assert name_list(names[:12]) == ", ".join(names[:12])
