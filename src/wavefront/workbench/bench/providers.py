"""Who runs an op: wavefront, and the baselines a user would pick instead.

- ``wavefront``: the op's registered function (``spec.fn``);
- ``eager``: eager PyTorch in the input dtype (``spec.eager_fn``);
- ``torch_compile``: ``torch.compile`` of that eager function, specialized to each bench shape
  (``dynamic=False``): a training run has fixed shapes, and a dynamic-shape kernel would be an unfairly
  weak baseline. Each shape costs one compilation, paid in the warm-up;
- ``liger``: Liger-Kernel, when it is installed (``pip install 'wavefront[liger]'``) and runs on the
  device; ops map to its functions through :data:`LIGER`;
- ``vendor``: the vendor BLAS (cuBLAS/cuBLASLt, hipBLASLt through torch.mm / torch.addmm) for every GEMM
  product of ops that have one, with any epilogue as separate PyTorch ops: the op called with
  ``provider="vendor"`` (:data:`VENDOR`). Beside ``wavefront`` (``provider="auto"``: the vendor where we fuse
  nothing, our kernel where fusion saves a pass) it shows what the rule and the fusion gain;
- ``sdpa_flash``, ``sdpa_cudnn``: ``F.scaled_dot_product_attention`` restricted to its FlashAttention or
  cuDNN backend (``torch.nn.attention.sdpa_kernel``), GQA through ``enable_gqa``; ``flash_attn``: the
  flash-attn package's ``flash_attn_func`` when installed. Attention only (:data:`ATTENTION_PEERS`);
- ``quack``: quack-kernels (Dao-AILab's CuTe-DSL kernels for NVIDIA sm_90/sm_100), when it is installed and
  runs on the device, for the memory-bound ops it has (:data:`QUACK`);
- ``grouped_mm``: ``torch._grouped_mm`` (cuBLAS / CUTLASS grouped GEMM) where the installed torch has it, for
  grouped_linear, with SwiGLU as separate PyTorch ops (:data:`GROUPED_MM_PEERS`).

:data:`LIGER`, :data:`QUACK`, :data:`VENDOR`, :data:`ATTENTION_PEERS` and :data:`GROUPED_MM_PEERS` are the only
per-op tables in the harness.

A provider that cannot run an op says why (:class:`Unavailable`); the harness records the reason and
goes on.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

PROVIDERS: tuple[str, ...] = ("wavefront", "eager", "torch_compile", "liger", "vendor", "sdpa_flash", "sdpa_cudnn",
                              "flash_attn", "grouped_mm", "quack")
BASELINES: tuple[str, ...] = PROVIDERS[1:]

#: Ops whose function takes ``provider=`` ("auto" | "wavefront" | "vendor") to route their GEMM products.
VENDOR: tuple[str, ...] = ("linear",)


@dataclass(frozen=True)
class Unavailable:
    reason: str


def _no_fp8_output(fp8: dict, who: str) -> None:
    if fp8.get("quantize") is not None:
        raise NotImplementedError(f"{who} has no FP8 output (wavefront's quantize= option)")


#: wavefront's RMSNorm cast names -> Liger's casting modes ("none": no upcast, its input-dtype mode).
_LIGER_CASTS = {"input": "none"}


def _liger_rms_norm(fn):
    def call(x, w, eps=1e-6, offset=0.0, cast="llama", **fp8):
        _no_fp8_output(fp8, "Liger's RMSNorm")
        # in_place=False: the in-place variant overwrites the upstream gradient, which a timed backward
        # replayed with retain_graph=True must read again.
        return fn.apply(x, w, eps, offset, _LIGER_CASTS.get(cast, cast), False)
    return call


def _liger_add_rms_norm(fn):
    def call(x, residual, w, eps=1e-6, offset=0.0, cast="llama", **fp8):
        _no_fp8_output(fp8, "Liger's RMSNorm")
        return fn.apply(x, residual, w, eps, offset, _LIGER_CASTS.get(cast, cast), False)
    return call


def _liger_layer_norm(fn):
    def call(x, w=None, b=None, eps=1e-5, **fp8):
        _no_fp8_output(fp8, "Liger's LayerNorm")
        if w is None or b is None:
            raise NotImplementedError("Liger's LayerNorm needs both weight and bias")
        return fn.apply(x, w, b, eps)
    return call


def _liger_softmax(fn):
    return lambda x: fn.apply(x)


def _liger_swiglu(fn):
    def call(gate, up, **fp8):
        _no_fp8_output(fp8, "Liger's SwiGLU")
        return fn.apply(gate, up)
    return call


def _liger_geglu(fn):
    def call(gate, up, approximate="tanh", **fp8):
        _no_fp8_output(fp8, "Liger's GEGLU")
        if approximate != "tanh":
            raise NotImplementedError("Liger's GEGLU implements the tanh approximation only")
        return fn.apply(gate, up)
    return call


def _liger_rope(fn):
    def call(q, k, cos, sin, *, position_ids=None, cu_seqlens=None):
        if cu_seqlens is not None or k is None:
            raise NotImplementedError("Liger's RoPE takes the [batch, heads, seq, head_dim] layout with q and k")
        return fn.apply(q, k, cos, sin, position_ids, 1)
    return call


# Not mapped: Liger's cross-entropy and fused linear cross-entropy write the gradient into their input during
# the forward (liger_kernel.ops.cross_entropy), so a replayed timing would run on overwritten logits.
#: op name -> (Liger module, autograd Function, adapter from our call signature to Liger's). Signatures as of
#: liger-kernel 0.8.5.
LIGER: dict[str, tuple[str, str, Callable[[Any], Callable[..., Any]]]] = {
    "rms_norm": ("liger_kernel.ops.rms_norm", "LigerRMSNormFunction", _liger_rms_norm),
    "add_rms_norm": ("liger_kernel.ops.fused_add_rms_norm", "LigerFusedAddRMSNormFunction", _liger_add_rms_norm),
    "layer_norm": ("liger_kernel.ops.layer_norm", "LigerLayerNormFunction", _liger_layer_norm),
    "softmax": ("liger_kernel.ops.softmax", "LigerSoftmaxFunction", _liger_softmax),
    "swiglu": ("liger_kernel.ops.swiglu", "LigerSiLUMulFunction", _liger_swiglu),
    "geglu": ("liger_kernel.ops.geglu", "LigerGELUMulFunction", _liger_geglu),
    "rope": ("liger_kernel.ops.rope", "LigerRopeFunction", _liger_rope),
}


def _quack_softmax(fn):
    def call(x):
        # quack's softmax takes [M, N] rows: a view of x's rows, reshaped back.
        return fn(x.reshape(-1, x.shape[-1])).view(x.shape)
    return call


def _quack_rms_norm(fn):
    def call(x, w, eps=1e-6, offset=0.0, cast="llama", **fp8):
        _no_fp8_output(fp8, "quack's RMSNorm")
        if offset != 0.0:
            raise NotImplementedError("quack's RMSNorm has no weight offset (Gemma's weight + 1)")
        if cast == "input":
            raise NotImplementedError("quack's RMSNorm computes in fp32 (no input-dtype mode)")
        # quack multiplies the fp32 normalized value by the weight before its one rounding to x's dtype (our
        # cast="gemma" order); cast="llama" rounds before the multiply: at most one rounding apart, which the
        # bench's max_diff_vs_eager column shows.
        return fn(x, w, eps=eps)
    return call


def _quack_layer_norm(fn):
    def call(x, w=None, b=None, eps=1e-5, **fp8):
        _no_fp8_output(fp8, "quack's LayerNorm")
        if w is None:
            raise NotImplementedError("quack's LayerNorm needs a weight")
        # Forward only (quack has no LayerNorm autograd): a bwd row says no output requires grad. Its weight
        # and bias are fp32 by contract; the casts are two [N] vectors, noise beside the [M, N] pass.
        out = fn(x.reshape(-1, x.shape[-1]), w.float(), None if b is None else b.float(), eps=eps)
        return out.view(x.shape)
    return call


#: wavefront.ops.cross_entropy's options quack has no counterpart for, with their defaults.
_CE_DEFAULTS: dict[str, Any] = {"label_smoothing": 0.0, "z_loss": 0.0, "softcap": None, "weight": None,
                                "divisor": None, "loss_dtype": None, "return_z_loss": False,
                                "return_predicted_tokens": False, "return_token_accuracy": False}


def _quack_cross_entropy(fn):
    def call(logits, target, *, ignore_index=-100, reduction="mean", inplace_backward=False,
             z_loss_reduction="token", **options):
        unknown = sorted(k for k in options if k not in _CE_DEFAULTS)
        used = sorted(k for k, v in options.items() if k in _CE_DEFAULTS
                      and ((v is not None) if _CE_DEFAULTS[k] is None else v != _CE_DEFAULTS[k]))
        if unknown or used:
            raise NotImplementedError(f"quack's cross-entropy has no {', '.join(used + unknown)}")
        # inplace_backward=False whatever the caller asked: the in-place gradient overwrites the logits, which
        # a replayed timing reads again (why Liger's cross-entropy is not mapped).
        return fn(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=ignore_index,
                  reduction=reduction, inplace_backward=False)
    return call


#: op name -> (quack module, function, adapter from our call signature to quack's). API as of quack-kernels
#: 0.6.5: ``quack.softmax(x)``, ``quack.rmsnorm(x, weight, ..., eps=)`` and ``quack.cross_entropy(x, target,
#: ..., ignore_index=, reduction=, inplace_backward=)`` on [M, N] rows with autograd; the LayerNorm is the
#: forward ``quack.rmsnorm.layernorm_fwd(x, weight, bias, eps=)`` (the package's ``rmsnorm`` attribute is the
#: function, so the module is imported by name).
QUACK: dict[str, tuple[str, str, Callable[[Any], Callable[..., Any]]]] = {
    "softmax": ("quack", "softmax", _quack_softmax),
    "rms_norm": ("quack", "rmsnorm", _quack_rms_norm),
    "layer_norm": ("quack.rmsnorm", "layernorm_fwd", _quack_layer_norm),
    "cross_entropy": ("quack", "cross_entropy", _quack_cross_entropy),
}


def _no_varlen(cu_seqlens, who: str, fp8: dict | None = None) -> None:
    if cu_seqlens is not None:
        raise NotImplementedError(f"{who} is measured on the dense [batch, heads, seq, head_dim] cases only")
    if fp8 and fp8.get("quantize") is not None:
        raise NotImplementedError(f"{who} has no FP8 output (wavefront.ops.attention's quantize=)")


def _sdpa(backend: str):
    def make():
        from torch.nn.attention import SDPBackend, sdpa_kernel  # lazy: torch submodule on use

        chosen = getattr(SDPBackend, backend)

        def call(q, k, v, *, causal=False, scale=None, cu_seqlens=None, max_seqlen=None, **fp8):
            _no_varlen(cu_seqlens, f"SDPA's {backend} backend", fp8)
            with sdpa_kernel(chosen):
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=causal, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
        return call
    return make


def _flash_attn():
    try:
        from flash_attn import flash_attn_func  # lazy: optional flash_attn
    except ImportError:
        return Unavailable("flash-attn is not installed")

    def call(q, k, v, *, causal=False, scale=None, cu_seqlens=None, max_seqlen=None, **fp8):
        _no_varlen(cu_seqlens, "flash_attn_func", fp8)
        # flash-attn takes [batch, seq, heads, head_dim]: transposed views, unit stride kept on head_dim.
        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal,
                              softmax_scale=scale)
        return out.transpose(1, 2)
    return call


#: Attention peers: provider -> factory of a callable with wavefront.ops.attention's signature.
ATTENTION_PEERS: dict[str, Callable[[], Any]] = {
    "sdpa_flash": _sdpa("FLASH_ATTENTION"),
    "sdpa_cudnn": _sdpa("CUDNN_ATTENTION"),
    "flash_attn": _flash_attn,
}


def _grouped_mm():
    if not hasattr(torch, "_grouped_mm"):
        return Unavailable("the installed torch has no torch._grouped_mm")

    def call(x, weight, offsets, *, activation=None):
        # offs: int32 cumulative ends, the same convention; W_e^T as a transposed view (no copy). Rows past
        # offsets[-1] come back undefined, so they are zeroed (one elementwise pass) to match the op.
        y = torch._grouped_mm(x, weight.transpose(1, 2), offs=offsets.to(torch.int32))
        routed = torch.arange(x.shape[0], device=x.device) < offsets[-1]
        y = torch.where(routed[:, None], y, 0)
        if activation == "swiglu":
            gate, up = y.chunk(2, dim=-1)
            y = torch.nn.functional.silu(gate) * up
        return y
    return call


#: Grouped-GEMM peers: provider -> (ops it serves, factory of a callable with that op's signature).
GROUPED_MM_PEERS: dict[str, tuple[tuple[str, ...], Callable[[], Any]]] = {
    "grouped_mm": (("grouped_linear",), _grouped_mm),
}


def check_providers(names) -> tuple[str, ...]:
    names = tuple(names)
    for n in names:
        if n not in PROVIDERS:
            raise ValueError(f"provider must be one of {', '.join(PROVIDERS)}; got {n!r}")
    return names


class ProviderSet:
    """Resolves (provider, op) to a callable once, caching compiled functions across cases."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self._cache: dict[tuple[str, str], Callable[..., Any] | Unavailable] = {}

    def resolve(self, provider: str, spec) -> Callable[..., Any] | Unavailable:
        key = (provider, spec.name)
        if key not in self._cache:
            self._cache[key] = self._resolve(provider, spec)
        return self._cache[key]

    def _resolve(self, provider: str, spec) -> Callable[..., Any] | Unavailable:
        check_providers([provider])
        if provider == "wavefront":
            return spec.fn
        if provider == "eager":
            return spec.eager_fn
        if provider == "torch_compile":
            return torch.compile(spec.eager_fn, dynamic=False)
        if provider == "vendor":
            if spec.name not in VENDOR:
                return Unavailable(f"{spec.name!r} has no vendor-BLAS path")
            return functools.partial(spec.fn, provider="vendor")
        if provider in GROUPED_MM_PEERS:
            served, make = GROUPED_MM_PEERS[provider]
            if spec.name not in served:
                return Unavailable(f"{provider} is a grouped GEMM ({', '.join(served)} only)")
            return make()
        if provider in ATTENTION_PEERS:
            if spec.name != "attention":
                return Unavailable(f"{provider} is an attention kernel")
            if self.device.type != "cuda":
                return Unavailable(f"{provider} runs on GPUs only")
            return ATTENTION_PEERS[provider]()
        if provider == "quack":
            return self._quack(spec)
        return self._liger(spec)

    def _liger(self, spec) -> Callable[..., Any] | Unavailable:
        if spec.name not in LIGER:
            return Unavailable(f"no Liger-Kernel counterpart mapped for {spec.name!r}")
        if self.device.type != "cuda":
            return Unavailable("Liger-Kernel runs on GPUs only")
        return _load(LIGER[spec.name], "Liger-Kernel", "pip install 'wavefront[liger]'")

    def _quack(self, spec) -> Callable[..., Any] | Unavailable:
        if spec.name not in QUACK:
            return Unavailable(f"no quack-kernels counterpart mapped for {spec.name!r}")
        if self.device.type != "cuda" or torch.version.hip:
            return Unavailable("quack-kernels runs on NVIDIA GPUs only (sm_90/sm_100, CUTLASS CuTe DSL)")
        return _load(QUACK[spec.name], "quack-kernels",
                     "pip install quack-kernels; it needs an sm_90/sm_100 GPU and nvidia-cutlass-dsl")


def _load(entry, package: str, install: str) -> Callable[..., Any] | Unavailable:
    """A peer's function through its adapter, or why it cannot be loaded."""
    module, attr, adapter = entry
    try:
        fn = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        return Unavailable(f"{package} is not installed ({install}): {exc}")
    except AttributeError:
        return Unavailable(f"the installed {package} has no {module}.{attr}")
    except Exception as exc:  # a DSL runtime can fail at import without a driver or a supported GPU
        return Unavailable(f"{package} failed to import: {type(exc).__name__}: {exc}")
    return adapter(fn)
