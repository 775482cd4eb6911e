"""Device math shared by the pointwise and loss kernels: tanh and the gated-MLP activations.

Triton's core language has no tanh, and ``libdevice.tanh`` does not run under the interpreter, so tanh is
built from exp2 here (one ex2 on NVIDIA, one v_exp_f32 on AMD, the same instruction softmax uses):

    tanh(|x|) = (1 - e) / (1 + e),  e = 2^(-2 |x| log2(e))         for |x| >= 1/8
    tanh(x)   = x (1 - x^2/3 + 2x^4/15 - 17x^6/315)                 for |x| <  1/8

The series branch exists because 1 - e cancels for small |x| (relative error eps / |2x|); its truncation
error is below 3e-10 relative at |x| = 1/8. Both branches are evaluated and selected (no divergence).

Activations and their derivatives (g is the gate value, fp32):

    silu(g)       = g s,  s = sigmoid(g)               silu'(g) = s (1 + g (1 - s))
    gelu_tanh(g)  = g (1 + t) / 2,  t = tanh(u),  u = sqrt(2/pi) (g + 0.044715 g^3)
                    gelu_tanh'(g) = (1 + t) / 2 + g (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 g^2) / 2
    gelu_erf(g)   = g (1 + erf(g / sqrt 2)) / 2
                    gelu_erf'(g) = (1 + erf(g / sqrt 2)) / 2 + g exp(-g^2 / 2) / sqrt(2 pi)
"""

from __future__ import annotations

import triton
import triton.language as tl

ACT_SILU = 0
ACT_GELU_TANH = 1
ACT_GELU_ERF = 2


@triton.jit
def tanh(x):
    ax = tl.abs(x)
    e = tl.exp2(ax * -2.8853900817779268)  # -2 log2(e)
    big = (1.0 - e) / (1.0 + e)
    x2 = x * x
    small = ax * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * -0.05396825396825397)))
    t = tl.where(ax < 0.125, small, big)
    return tl.where(x < 0, -t, t)


@triton.jit
def sigmoid(x):
    # 1 / (1 + e^-x) through exp2; saturates cleanly to 0 and 1 at large |x|.
    return 1.0 / (1.0 + tl.exp2(x * -1.4426950408889634))


@triton.jit
def activation(g, ACT: tl.constexpr):
    if ACT == 0:
        out = g * sigmoid(g)
    elif ACT == 1:
        u = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        out = 0.5 * g * (1.0 + tanh(u))
    else:
        out = 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476))
    return out


@triton.jit
def activation_and_grad(g, ACT: tl.constexpr):
    """(act(g), act'(g)) sharing the transcendental."""
    if ACT == 0:
        s = sigmoid(g)
        out = g * s
        d = s * (1.0 + g * (1.0 - s))
    elif ACT == 1:
        g2 = g * g
        u = 0.7978845608028654 * (g + 0.044715 * g2 * g)
        t = tanh(u)
        out = 0.5 * g * (1.0 + t)
        d = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * g2)
    else:
        cdf = 0.5 * (1.0 + tl.math.erf(g * 0.7071067811865476))
        out = g * cdf
        d = cdf + g * tl.exp2(g * g * -0.7213475204444817) * 0.3989422804014327  # exp(-g^2/2) / sqrt(2 pi)
    return out, d
