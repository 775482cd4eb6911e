"""Make the Triton interpreter round like the GPU.

GPUs convert fp32 to bf16 with round-to-nearest-even (PTX ``cvt.rn.bf16.f32``; AMD ``v_cvt_pk_bf16_f32``
or its software RNE sequence). Triton 3.x's interpreter truncates instead (its ``_convert_float`` is
called with no rounding mode by implicit casts and stores), and its explicit "rtne" path rounds ties up
without carrying into the exponent. Under the interpreter every bf16 output would then carry up to one
extra ulp of error that the compiled kernel does not have, and accuracy tests would judge the emulator
rather than the kernel.

:func:`gpu_rounding` replaces the interpreter's fp32/fp64 -> bf16 conversion with PyTorch's RNE
conversion (bit-identical to the GPU's) and makes bf16 -> fp32 widening exact for subnormals.
Round-toward-zero requests keep the interpreter's own path.

Two fixes to ``tl.dot``:

- bf16 operands: the interpreter hands numpy the raw uint16 storage of bf16 tensors, so the product is
  computed on the bit patterns as integers. The operands are widened to fp32 exactly (a bf16 x bf16
  product is exact in fp32), which is what a tensor core with an fp32 accumulator computes, up to
  summation order.
- fp32 operands with ``input_precision="ieee"``: on GPUs Triton lowers this dot to a chain of FMAs along
  K (one rounding per step, in K order), so the same dot product computed by two kernels of different
  tile shapes rounds identically, which recomputation schemes (FlashAttention's backward) rely on.
  numpy's BLAS sums in an order that depends on the operand shapes; the interpreter now runs the same
  FMA chain as the compiled kernel.

Scope: :func:`gpu_rounding` installs the two replacements for the duration of one of wavefront's own
launches (``wavefront.kernels._launch.launch`` wraps each interpreted launch in it) and restores Triton's
originals afterwards, so any other kernel interpreted in the same process (a user's, Liger's) keeps the
interpreter's own behaviour. Nested use is fine (the outermost scope restores).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import numpy as np
import torch

_DEPTH = 0


@contextlib.contextmanager
def gpu_rounding() -> Iterator[None]:
    """Inside the block, the interpreter rounds to bf16 and computes dots as the GPU does (see above)."""
    global _DEPTH
    from triton.runtime import interpreter

    convert_float, create_dot = _replacements()
    builder = interpreter.InterpreterBuilder
    if _DEPTH == 0:
        saved = (interpreter._convert_float, builder.create_dot)
        interpreter._convert_float = convert_float
        builder.create_dot = create_dot
    _DEPTH += 1
    try:
        yield
    finally:
        _DEPTH -= 1
        if _DEPTH == 0:
            interpreter._convert_float, builder.create_dot = saved


@functools.cache
def _replacements():
    """(convert_float, create_dot): GPU-faithful versions wrapping Triton's originals (built once)."""
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    original = interpreter._convert_float

    def convert_float(input, input_dtype, output_dtype, rounding_mode):
        if (output_dtype == tl.bfloat16 and input_dtype in (tl.float32, tl.float64)
                and rounding_mode != ir.ROUNDING_MODE.RTZ):
            src = np.ascontiguousarray(input).view(np.float32 if input_dtype == tl.float32 else np.float64)
            out = torch.from_numpy(src.copy()).to(torch.bfloat16).view(torch.int16).numpy()
            return out.view(np.uint16)
        if input_dtype == tl.bfloat16 and output_dtype == tl.float32:
            # Exact widening (the interpreter flushes bf16 subnormals to zero here; GPUs do not).
            return (np.ascontiguousarray(input).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return original(input, input_dtype, output_dtype, rounding_mode)

    return convert_float, _gpu_faithful_dot(interpreter)


def _gpu_faithful_dot(interpreter):
    import triton.language as tl
    from triton._C.libtriton import interpreter as native
    from triton._C.libtriton import ir

    original = interpreter.InterpreterBuilder.create_dot

    def widen(handle):
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        bits = np.ascontiguousarray(handle.data).view(np.uint16).astype(np.uint32) << 16
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def fma_chain(a, b, d):
        acc = np.array(d.data, dtype=np.float32, copy=True)
        a_data, b_data = a.data, b.data
        for k in range(a_data.shape[-1]):
            acc = native.fma_fp32(*np.broadcast_arrays(a_data[..., :, k:k + 1], b_data[..., k:k + 1, :], acc))
        return interpreter.TensorHandle(acc, d.dtype.scalar)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if (input_precision == ir.INPUT_PRECISION.IEEE and a.dtype.scalar == tl.float32
                and b.dtype.scalar == tl.float32 and d.data.dtype == np.float32):
            return fma_chain(a, b, d)
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    return create_dot
