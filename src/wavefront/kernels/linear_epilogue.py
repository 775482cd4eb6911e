"""The activations of linear's fused epilogue and their derivatives, shared by the pointer kernels
(kernels/linear.py) and the TMA persistent kernels (kernels/linear_tma.py).

    relu       max(z, 0)                              1[z > 0]
    gelu       0.5 z (1 + erf(z / sqrt 2))            Phi(z) + z phi(z)
    gelu_tanh  0.5 z (1 + t)                          0.5 (1 + t) + 0.5 z (1 - t^2) sqrt(2/pi) (1 + 3 c z^2)
               t = tanh(sqrt(2/pi) (z + c z^3)), c = 0.044715
    silu       z s, s = sigmoid(z)                    s (1 + z (1 - s))

Everything is evaluated on the fp32 accumulator.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Globals read inside @triton.jit functions must be constexpr (the compiler rejects plain floats; the
# interpreter does not, so only the ahead-of-time compile test catches it). In expressions they follow a
# tensor operand: the interpreter turns `constexpr * tensor` into a constexpr wrapping a tensor.
SQRT1_2 = tl.constexpr(0.7071067811865476)
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
INV_SQRT_2PI = tl.constexpr(0.3989422804014327)
GELU_C = tl.constexpr(0.044715)


@triton.jit
def _tanh(u):
    # 1 - 2 / (e^{2u} + 1): saturates cleanly to +-1 (e^{2u} -> inf or 0) without a libdevice call.
    return 1.0 - 2.0 / (tl.math.exp2(u * 2.8853900817779268) + 1.0)


@triton.jit
def apply_activation(z, ACTIVATION: tl.constexpr):
    if ACTIVATION == "relu":
        y = tl.maximum(z, 0.0, propagate_nan=tl.PropagateNan.ALL)
    elif ACTIVATION == "gelu":
        y = 0.5 * z * (1.0 + tl.math.erf(z * SQRT1_2))
    elif ACTIVATION == "gelu_tanh":
        y = 0.5 * z * (1.0 + _tanh((z + z * z * z * GELU_C) * SQRT_2_OVER_PI))
    elif ACTIVATION == "silu":
        y = z * tl.sigmoid(z)
    else:
        y = z
    return y


@triton.jit
def activation_grad(z, ACTIVATION: tl.constexpr):
    if ACTIVATION == "relu":
        d = tl.where(z > 0.0, 1.0, 0.0)
    elif ACTIVATION == "gelu":
        d = 0.5 * (1.0 + tl.math.erf(z * SQRT1_2)) + z * INV_SQRT_2PI * tl.math.exp(-0.5 * z * z)
    elif ACTIVATION == "gelu_tanh":
        t = _tanh((z + z * z * z * GELU_C) * SQRT_2_OVER_PI)
        d = 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + z * z * GELU_C * 3.0)
    else:  # silu
        s = tl.sigmoid(z)
        d = s * (1.0 + z * (1.0 - s))
    return d
