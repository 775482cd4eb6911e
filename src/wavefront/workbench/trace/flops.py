"""FLOPs and minimal bytes of the CPU ops whose kernels the roofline places, from recorded input shapes.

A kernel is placed when the op that launched it (through its correlation / External id) is one of the ops
below and the trace has its input shapes (``record_shapes=True``). Conventions:

- matmul family: ``2*M*N*K`` FLOPs per product (one multiply + one add); bytes = each operand read once
  plus the output written once (the minimum any kernel must move).
- ``addmm``/``baddbmm`` add ``M*N`` FLOPs for the bias and read the bias once.
- attention forward (SDPA flash / efficient / cuDNN / math-free kernels): ``4*B*H*S_q*S_k*D`` (QK^T and PV),
  non-causal by convention (the PaLM/MFU convention: causal sparsity is not discounted); bytes = Q, K, V
  read and O written once.
- elementwise ops: one FLOP per output element; bytes = the tensor inputs read once and the output
  (broadcast shape of the inputs) written once. In-place ops write their first input.
- row reductions/normalizations (softmax, layer_norm, rms_norm): ``FLOPS_PER_ELEMENT_ROW_OP`` FLOPs per
  element (max, subtract, exp, sum, divide for softmax; mean, variance, normalize, scale for the norms);
  bytes = input read once, output written once, weights read once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DTYPE_BYTES = {
    "float": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8, "long int": 8, "int": 4, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::complex<float>": 8,
}
# Names for the device table's peaks (GPU.peak_tflops).
DTYPE_PEAK = {"float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16", "c10::Float8_e4m3fn": "fp8",
              "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8", "c10::Float8_e5m2fnuz": "fp8"}

FLOPS_PER_ELEMENT_ROW_OP = 5

MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear", "aten::matmul"}
ATTENTION_OPS = {"aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
                 "aten::_scaled_dot_product_cudnn_attention", "aten::_flash_attention_forward",
                 "aten::_efficient_attention_forward"}
ELEMENTWISE_OPS = {f"aten::{n}{s}" for n in ("add", "sub", "mul", "div", "relu", "gelu", "silu", "sigmoid", "tanh",
                                             "exp", "neg", "sqrt", "rsqrt", "pow", "where", "copy", "fill", "clamp",
                                             "gelu_backward", "silu_backward", "threshold_backward",
                                             "sigmoid_backward", "tanh_backward", "lerp", "addcmul", "addcdiv")
                   for s in ("", "_")}
ROW_OPS = {"aten::_softmax", "aten::softmax", "aten::_log_softmax", "aten::native_layer_norm", "aten::layer_norm",
           "aten::rms_norm", "aten::_fused_rms_norm", "aten::_softmax_backward_data",
           "aten::native_layer_norm_backward"}
SHAPED_OPS = MATMUL_OPS | ATTENTION_OPS | ELEMENTWISE_OPS | ROW_OPS


@dataclass(frozen=True)
class OpCost:
    flops: float
    bytes_moved: float
    dtype: str  # the Input type of the first tensor input ("float", "c10::BFloat16", ...)

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes_moved if self.bytes_moved > 0 else math.inf


def _numel(dims: Sequence[int] | None) -> int:
    return math.prod(int(d) for d in dims) if dims else 1


def _tensors(dims: list[Any], types: list[Any]) -> list[tuple[list[int], str]]:
    """The tensor inputs: dims that are a list of ints with a dtype we know."""
    out = []
    for i, d in enumerate(dims):
        t = types[i] if i < len(types) else ""
        if isinstance(d, list) and all(isinstance(x, int) for x in d) and t in DTYPE_BYTES and (d or t):
            out.append((d, t))
    return out


def _broadcast(shapes: list[list[int]]) -> list[int]:
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(ndim):
        size = 1
        for s in shapes:
            k = axis - (ndim - len(s))
            if k >= 0 and s[k] != 1:
                size = s[k]
        out.append(size)
    return out


def op_cost(name: str, dims: list[Any], types: list[Any]) -> OpCost | None:
    """FLOPs and minimal bytes of one op call, or None when the op or its shapes are not understood."""
    tensors = _tensors(dims, types)
    if not tensors:
        return None
    dtype = tensors[0][1]
    elt = DTYPE_BYTES[dtype]
    try:
        if name in MATMUL_OPS:
            return _matmul(name, tensors, elt, dtype)
        if name in ATTENTION_OPS:
            q, k, v = (t[0] for t in tensors[:3])
            b, h, s_q, d = q
            s_k = k[-2]
            flops = 4.0 * b * h * s_q * s_k * d
            return OpCost(flops, float(elt * (_numel(q) + _numel(k) + _numel(v) + _numel(q[:-1]) * v[-1])), dtype)
        if name in ELEMENTWISE_OPS:
            out_shape = tensors[0][0] if name.endswith("_") else _broadcast([t[0] for t in tensors])
            n_out = _numel(out_shape)
            read = sum(_numel(t[0]) * DTYPE_BYTES[t[1]] for t in tensors)
            return OpCost(float(n_out), float(read + n_out * elt), dtype)
        if name in ROW_OPS:
            x = tensors[0][0]
            n = _numel(x)
            weights = sum(_numel(t[0]) * DTYPE_BYTES[t[1]] for t in tensors[1:] if len(t[0]) <= 1)
            return OpCost(float(FLOPS_PER_ELEMENT_ROW_OP * n), float(2 * n * elt + weights), dtype)
    except (ValueError, IndexError):
        return None
    return None


def _matmul(name: str, tensors: list[tuple[list[int], str]], elt: int, dtype: str) -> OpCost | None:
    shapes = [t[0] for t in tensors]
    bias = None
    if name in ("aten::addmm", "aten::baddbmm"):
        bias, shapes = shapes[0], shapes[1:]
    if len(shapes) < 2:
        return None
    a, w = shapes[0], shapes[1]
    if name == "aten::linear":  # input [..., K], weight [N, K], optional bias [N]
        k, n = a[-1], w[0]
        m = _numel(a[:-1])
        batch = 1
        out = m * n
        bias = shapes[2] if len(shapes) > 2 else None
    else:
        if len(a) < 2 or len(w) < 2 or a[-1] != w[-2]:
            return None
        m, k, n = _numel(a[:-1]) if len(w) == 2 else a[-2], a[-1], w[-1]
        batch = _numel(a[:-2]) if len(w) > 2 else 1
        out = batch * m * n
    flops = 2.0 * batch * m * n * k
    moved = _numel(a) + _numel(w) + out
    if bias is not None:
        flops += out
        moved += _numel(bias)
    return OpCost(flops, float(moved * elt), dtype)
