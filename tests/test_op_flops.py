"""FLOPs from recorded input shapes (``analysis.op_flops``): each rule against its formula, and
shapes that do not fit give 0 rather than a wrong count or an error."""

from __future__ import annotations

import json

import pytest

from torchprof_args.analysis.decode.op_flops import FLOP_OPS, shape_flops


def dims(*shapes: list[int]) -> bytes:
    return json.dumps(list(shapes)).encode()


@pytest.mark.parametrize(
    ("name", "shapes", "expected"),
    [
        ("aten::mm", ([8, 16], [16, 4]), 2 * 8 * 16 * 4),
        ("aten::addmm", ([4], [8, 16], [16, 4], [], []), 2 * 8 * 16 * 4),
        ("aten::bmm", ([3, 8, 16], [3, 16, 4]), 2 * 3 * 8 * 16 * 4),
        ("aten::baddbmm", ([3, 8, 4], [3, 8, 16], [3, 16, 4]), 2 * 3 * 8 * 16 * 4),
        ("aten::_scaled_dot_product_flash_attention", ([2, 4, 128, 64], [2, 4, 256, 64], [2, 4, 256, 32]),
         2 * 2 * 4 * 128 * 256 * (64 + 32)),
        ("aten::_scaled_dot_product_cudnn_attention_backward",
         ([2, 4, 128, 64], [2, 4, 128, 64], [2, 4, 128, 64], [2, 4, 128, 64], [2, 4, 128, 1]),
         2.5 * 2 * 2 * 4 * 128 * 128 * 128),
    ],
)  # fmt: skip
def test_each_rule_gives_its_formula(name: str, shapes: tuple, expected: float) -> None:
    assert name in FLOP_OPS
    assert shape_flops(name, dims(*shapes)) == expected


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("aten::relu", dims([8, 16])),  # not a counted operator
        ("aten::mm", None),  # shapes not recorded
        ("aten::mm", b""),
        ("aten::mm", b"not json"),
        ("aten::mm", dims([8, 16], [15, 4])),  # inner sizes disagree
        ("aten::mm", dims([8, 16])),  # one operand
        ("aten::addmm", dims([4], [8, 16])),
        ("aten::mm", b'[["a", 2], [2, 3]]'),
        ("aten::_scaled_dot_product_flash_attention", dims([2, 4, 128], [2, 4, 128], [2, 4, 128])),
    ],
)  # fmt: skip
def test_shapes_that_do_not_fit_give_zero(name: str, raw: bytes | None) -> None:
    assert shape_flops(name, raw) == 0.0
