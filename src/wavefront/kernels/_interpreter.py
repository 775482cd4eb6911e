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

FP8 casts (any conversion to or from ``tl.float8e4nv``, ``float8e5``, ``float8e4b8``, ``float8e5b16``):
Triton 3.9's interpreter rounds ties away from even, mishandles fp8 subnormals, wraps out-of-range values
into garbage (464 -> NaN, 1e4 -> 320 in e4m3) and decodes the FNUZ formats with the wrong bias (448 ->
224). They go through PyTorch's ``torch.float8_*`` casts instead: round-to-nearest-even, correct
subnormals and FNUZ encodings, which is what ``cvt.rn.satfinite`` (sm_89+) and ``v_cvt_pk_fp8_f32``
(gfx942) compute for every in-range value. Out of range the hardware saturates (satfinite) where PyTorch
may give inf or NaN; wavefront's kernels clamp to the format's max before every fp8 cast, so only in-range
values reach it. The fp8 ``tl.dot`` widens through the same casts (the products are exact in fp32).

Reductions with a combine function (``tl.reduce`` over a tuple, e.g. the online softmax's (max, sum)):
Triton 3.9's interpreter folds them left to right, one Python call per element, a chain whose rounding
error grows with the length (the softmax's sum over 4096 groups came out 20x further from float64 than
the plain ``tl.sum``, which numpy sums pairwise). The GPU reduces as a tree (butterfly shuffles across
lanes, then across warps), so the interpreter now folds a power-of-two axis pairwise, element i with
element i + half, log2(n) vectorized combine calls (also far faster); other lengths keep Triton's chain.

Speed: Triton 3.9's interpreter re-patches the language (``_patch_lang``: an ``inspect.getmembers`` walk of
``tl``, ``tl.tensor`` and ``tl.math``) on every call of a ``@triton.jit`` helper inside a kernel, once per
call, so a GEMM's per-tile helpers pay it per tile: about a quarter of the interpreter's time on the MoE
training tests. Within one grid run the language stays patched until the run ends, so a helper whose
language modules (``tl``, ``tl.core``: what Triton's patch looks for in its globals) were already patched
in the run finds nothing left to replace and would only re-create equivalent wrappers; its patch is
skipped (the kernel's own patch and its restore at the end of the run are untouched).

Scope: :func:`gpu_rounding` installs these replacements for the duration of one of wavefront's own
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
    from triton.runtime import interpreter  # lazy: Triton-free import

    convert_float, create_dot = _replacements()
    builder, grid = interpreter.InterpreterBuilder, interpreter.GridExecutor
    if _DEPTH == 0:
        saved = (interpreter._convert_float, builder.create_dot, interpreter._patch_lang, grid.__call__,
                 interpreter.ReduceOps.generic_reduce)
        interpreter._convert_float = convert_float
        builder.create_dot = create_dot
        interpreter.ReduceOps.generic_reduce = _tree_reduce(interpreter.ReduceOps.generic_reduce)
        # around the current ones: a tool may have wrapped the grid run (workbench/static/traffic.py)
        interpreter._patch_lang, grid.__call__ = _patch_once_per_run(interpreter._patch_lang, grid.__call__)
    _DEPTH += 1
    try:
        yield
    finally:
        _DEPTH -= 1
        if _DEPTH == 0:
            (interpreter._convert_float, builder.create_dot, interpreter._patch_lang, grid.__call__,
             interpreter.ReduceOps.generic_reduce) = saved


@functools.cache
def _replacements():
    """(convert_float, create_dot): GPU-faithful versions wrapping Triton's originals (built once)."""
    import triton.language as tl  # lazy: Triton-free import
    from triton._C.libtriton import ir  # lazy: Triton-free import
    from triton.runtime import interpreter  # lazy: Triton-free import

    original = interpreter._convert_float
    fp8 = _fp8_dtypes()

    def convert_float(input, input_dtype, output_dtype, rounding_mode):
        if input_dtype in fp8 or output_dtype in fp8:
            return _torch_cast(input, input_dtype, output_dtype)
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


def _tree_reduce(original):
    """ReduceOps.generic_reduce folding a power-of-two axis as a pairwise tree (see "Reductions" above)."""
    import triton.language as tl  # lazy: Triton-free import

    def generic_reduce(self, input):
        axis = self.axis
        data = [np.asarray(arg.handle.data) for arg in input]
        if axis is None:
            data, axis = [d.reshape(-1) for d in data], 0
        n = data[0].shape[axis] if data[0].ndim else 0
        if n < 2 or n & (n - 1):
            return original(self, input)
        dtypes = [arg.dtype for arg in input]
        while data[0].shape[axis] > 1:
            half = data[0].shape[axis] // 2
            lo = [self.to_tensor(np.take(d, np.arange(half), axis=axis), t) for d, t in zip(data, dtypes, strict=True)]
            hi = [self.to_tensor(np.take(d, np.arange(half, 2 * half), axis=axis), t) for d, t in zip(data, dtypes, strict=True)]
            out = self.combine_fn.fn(*lo, *hi)
            out = out if isinstance(out, tuple) else (out,)
            shape = lo[0].handle.data.shape
            data = [np.broadcast_to(np.asarray(o.handle.data if isinstance(o, tl.core.tensor) else o), shape)
                    .astype(d.dtype) for o, d in zip(out, data, strict=True)]
        ret = []
        for d, t in zip(data, dtypes, strict=True):
            d = d if self.keep_dims else np.squeeze(d, axis)
            if self.axis is None:
                d = d.reshape((1,) * len(input[0].handle.data.shape)) if self.keep_dims else d.item()
            ret.append(self.to_tensor(d, t))
        return ret

    return generic_reduce


def _patch_once_per_run(original_patch, original_call):
    """(_patch_lang, GridExecutor.__call__) wrapping the given ones: each language module (``tl``,
    ``tl.core``) patched once per grid run (see "Speed" above). Each grid run gets a fresh record, so the
    kernel's own patch (the first call of its run) always happens and is restored by Triton at the end of
    the run; a function that sees no language module goes to Triton's patch (and its error)."""
    import triton.language as tl  # lazy: Triton-free import
    from triton.runtime import interpreter  # lazy: Triton-free import

    patched: list[set[int]] = []  # per active grid run (innermost last): ids of the patched language modules

    def patch_lang(fn):
        # the modules Triton's _patch_lang patches for fn: tl and tl.core where fn's globals hold them
        langs = {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}
        if patched and langs and langs <= patched[-1]:
            return interpreter._LangPatchScope()  # nothing left to replace, nothing to restore
        scope = original_patch(fn)
        if patched:
            patched[-1] |= langs
        return scope

    def grid_call(self, *args, **kwargs):
        patched.append(set())
        try:
            return original_call(self, *args, **kwargs)
        finally:
            patched.pop()

    return patch_lang, grid_call


@functools.cache
def _fp8_dtypes() -> dict:
    """Triton fp8 element type -> the torch dtype with the same encoding."""
    import triton.language as tl  # lazy: Triton-free import

    return {tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2,
            tl.float8e4b8: torch.float8_e4m3fnuz, tl.float8e5b16: torch.float8_e5m2fnuz}


def _torch_dtype(tl_dtype) -> torch.dtype:
    import triton.language as tl  # lazy: Triton-free import

    table = {**_fp8_dtypes(), tl.float16: torch.float16, tl.bfloat16: torch.bfloat16, tl.float32: torch.float32,
             tl.float64: torch.float64}
    return table[tl_dtype]


def _torch_cast(data, input_dtype, output_dtype):
    """Convert raw element storage between float types with PyTorch's (round-to-nearest-even) casts; returns
    the output's bits as the unsigned integer array the interpreter stores."""
    src, dst = _torch_dtype(input_dtype), _torch_dtype(output_dtype)
    raw = np.ascontiguousarray(data)
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    t = torch.from_numpy(raw.view(f"u{src.itemsize}").view(f"i{src.itemsize}") if src.itemsize > 1 else raw.view(
        np.uint8)).view(src)
    out = t.to(dst).view(bits[dst.itemsize]).numpy()
    return out.view(f"u{dst.itemsize}")


def _gpu_faithful_dot(interpreter):
    import triton.language as tl  # lazy: Triton-free import
    from triton._C.libtriton import interpreter as native  # lazy: Triton-free import
    from triton._C.libtriton import ir  # lazy: Triton-free import

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
