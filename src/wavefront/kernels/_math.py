"""Device math shared by the pointwise and loss kernels: tanh and the gated-MLP activations.

Triton's core language has no tanh, and ``libdevice.tanh`` does not run under the interpreter, so tanh is
built from exp2 here (one ex2 on NVIDIA, one v_exp_f32 on AMD, the same instruction softmax uses):

    tanh(|x|) = (1 - e) / (1 + e),  e = 2^(-2 |x| log2(e))         for |x| >= 1/8
    tanh(x)   = x (1 - x^2/3 + 2x^4/15 - 17x^6/315)                 for |x| <  1/8

The series branch exists because 1 - e cancels for small |x| (relative error eps / |2x|); its truncation
error is below 3e-10 relative at |x| = 1/8. Both branches are evaluated and selected (no divergence).
:func:`tanh_parts` also returns 1 - tanh^2 and 1 + tanh in forms that do not cancel near saturation.

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
def tanh_parts(x):
    """(tanh x, 1 - tanh^2 x, 1 + tanh x), each free of cancellation.

    With e = 2^(-2|x| log2 e): 1 - |t| = 2e / (1 + e) and 1 - t^2 = 4e / (1 + e)^2, exact-form expressions
    where the direct 1 - t would lose every digit as |t| -> 1 (the gradient of a saturated softcap or
    gelu lives there).
    """
    ax = tl.abs(x)
    e = tl.exp2(ax * -2.8853900817779268)  # -2 log2(e)
    inv = 1.0 / (1.0 + e)
    x2 = x * x
    small = ax < 0.125
    t_series = ax * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * -0.05396825396825397)))
    t_abs = tl.where(small, t_series, (1.0 - e) * inv)
    sech2 = tl.where(small, 1.0 - t_abs * t_abs, 4.0 * e * inv * inv)
    one_minus_abs = tl.where(small, 1.0 - t_abs, 2.0 * e * inv)
    t = tl.where(x < 0, -t_abs, t_abs)
    one_plus_t = tl.where(x < 0, one_minus_abs, 1.0 + t_abs)
    return t, sech2, one_plus_t


@triton.jit
def tanh(x):
    t, _, _ = tanh_parts(x)
    return t


@triton.jit
def sigmoid(x):
    # 1 / (1 + e^-x) through exp2; saturates cleanly to 0 and 1 at large |x|.
    return 1.0 / (1.0 + tl.exp2(x * -1.4426950408889634))


@triton.jit
def activation(g, ACT: tl.constexpr):
    if ACT == 0:
        out = g * sigmoid(g)
    elif ACT == 1:
        _, _, one_plus_t = tanh_parts(0.7978845608028654 * (g + 0.044715 * g * g * g))
        out = 0.5 * g * one_plus_t
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
        _, sech2, one_plus_t = tanh_parts(0.7978845608028654 * (g + 0.044715 * g2 * g))
        out = 0.5 * g * one_plus_t
        d = 0.5 * one_plus_t + 0.5 * g * sech2 * 0.7978845608028654 * (1.0 + 0.134145 * g2)
    else:
        cdf = 0.5 * (1.0 + tl.math.erf(g * 0.7071067811865476))
        out = g * cdf
        d = cdf + g * tl.exp2(g * g * -0.7213475204444817) * 0.3989422804014327  # exp(-g^2/2) / sqrt(2 pi)
    return out, d
