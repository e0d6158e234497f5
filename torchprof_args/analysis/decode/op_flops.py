"""FLOPs of an operator from its recorded input shapes (``Input Dims``, ``--torch-profile-record-shapes``).

torch.profiler computes FLOPs with ``with_flops`` but does not write them into the Chrome trace
(checked on torch 2.11 with CUDA 13 on an H200 and torch 2.13 on CPU: ``args`` carry no
``flops``), so MFU from a trace needs the shapes.  The matrix products and attention kernels
below are nearly all of a transformer's FLOPs.  None calls another of them (``aten::matmul`` and
``aten::linear`` call ``mm`` / ``addmm``; the ``scaled_dot_product`` operators call their
``_flash_attention_forward`` / ``_cudnn_attention_forward`` kernels, left out), so summing them
counts nothing twice.  Conventions: 2 FLOPs per multiply-add;
attention counted without a causal mask (its two products in full), its backward as 2.5 times
the forward, as FlashAttention counts them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

__all__ = ["FLOP_OPS", "shape_flops"]

Dims = Sequence[Sequence[int]]


def _matmul(a: Sequence[int], b: Sequence[int]) -> float:
    """2 x batch x M x K x N for ``a`` [..., M, K] @ ``b`` [..., K, N]."""
    if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        return 0.0
    batch = math.prod(a[:-2]) if len(a) > 2 else 1
    return 2.0 * batch * a[-2] * a[-1] * b[-1]


def _first_two(dims: Dims) -> float:
    return _matmul(dims[0], dims[1]) if len(dims) >= 2 else 0.0


def _after_bias(dims: Dims) -> float:
    """addmm / baddbmm: (input, mat1, mat2, ...)."""
    return _matmul(dims[1], dims[2]) if len(dims) >= 3 else 0.0


def _attention(dims: Dims) -> float:
    """q [B, H, S, D], k [B, H, Sk, D], v [B, H, Sk, Dv]: q @ k^T and p @ v."""
    if len(dims) < 3 or any(len(d) != 4 for d in dims[:3]):
        return 0.0
    (b, h, s, d), (_, _, sk, _), (_, _, _, dv) = dims[:3]
    return 2.0 * b * h * s * sk * (d + dv)


def _attention_backward(dims: Dims) -> float:
    """grad_out, q, k, v, ...: 2.5 x the forward."""
    return 2.5 * _attention(dims[1:4]) if len(dims) >= 4 else 0.0


#: Operator name -> FLOPs from its ``Input Dims``.
FLOP_OPS: dict[str, Callable[[Dims], float]] = {
    "aten::mm": _first_two,
    "aten::bmm": _first_two,
    "aten::_scaled_mm": _first_two,
    "aten::addmm": _after_bias,
    "aten::baddbmm": _after_bias,
    "aten::_scaled_dot_product_flash_attention": _attention,
    "aten::_scaled_dot_product_efficient_attention": _attention,
    "aten::_scaled_dot_product_cudnn_attention": _attention,
    "aten::_scaled_dot_product_flash_attention_backward": _attention_backward,
    "aten::_scaled_dot_product_efficient_attention_backward": _attention_backward,
    "aten::_scaled_dot_product_cudnn_attention_backward": _attention_backward,
}

_dims_decoder = msgspec.json.Decoder(list[Any])


def shape_flops(name: str, raw_dims: msgspec.Raw | bytes | None) -> float:
    """FLOPs of operator ``name`` from its raw ``Input Dims`` JSON; 0 for other operators or
    shapes that do not fit (missing, empty, mismatched)."""
    rule = FLOP_OPS.get(name)
    if rule is None or not raw_dims:
        return 0.0
    try:
        dims = _dims_decoder.decode(bytes(raw_dims))
        shapes = [d if isinstance(d, list) and all(isinstance(x, int) for x in d) else [] for d in dims]
        return float(rule(shapes))
    except (msgspec.DecodeError, TypeError, ValueError):
        return 0.0
