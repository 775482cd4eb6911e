"""Input checks shared by the ops: every message names the op, the argument and what was expected."""

from __future__ import annotations

from collections.abc import Iterable

import torch

SUPPORTED_FLOAT = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(op: str, name: str, t, *, dtypes=SUPPORTED_FLOAT, min_dim: int = 1,
                 ndim: int | None = None) -> None:
    """t is a tensor of one of `dtypes` with at least `min_dim` (or exactly `ndim`) dims."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{op}: argument '{name}' must have dtype in ({_dtype_names(dtypes)}), got "
                        f"{str(t.dtype).removeprefix('torch.')}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{op}: argument '{name}' must have {ndim} dims, got shape {tuple(t.shape)}")
    if t.dim() < min_dim:
        raise ValueError(f"{op}: argument '{name}' must have at least {min_dim} dim(s), got a "
                         f"{t.dim()}-dim tensor of shape {tuple(t.shape)}")


def check_same_device(op: str, **tensors) -> None:
    """All given (non-None) tensors live on one device."""
    present = {k: v for k, v in tensors.items() if v is not None}
    devices = {k: v.device for k, v in present.items()}
    first_name, first = next(iter(devices.items()))
    for k, d in devices.items():
        if d != first:
            raise ValueError(f"{op}: all tensors must be on one device; '{first_name}' is on {first} but "
                             f"'{k}' is on {d}")


def check_same_dtype(op: str, **tensors) -> None:
    present = {k: v for k, v in tensors.items() if v is not None}
    first_name, first = next(iter(present.items()))
    for k, v in present.items():
        if v.dtype != first.dtype:
            raise TypeError(f"{op}: argument '{k}' must have the dtype of '{first_name}' "
                            f"({str(first.dtype).removeprefix('torch.')}), got "
                            f"{str(v.dtype).removeprefix('torch.')}")


def check_shape(op: str, name: str, t: torch.Tensor | None, shape: tuple[int, ...], what: str) -> None:
    """t (if given) has exactly `shape`; `what` says where the expectation comes from."""
    if t is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{op}: argument '{name}' must have shape {tuple(shape)} ({what}), got "
                         f"{tuple(t.shape)}")


def check_choice(op: str, name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{op}: argument '{name}' must be one of {sorted(choices)}, got {value!r}")


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """A [n_rows, n_cols] view of t with unit column stride and one row stride.

    Views when t's leading dims collapse into one stride and its last dim is contiguous (the common
    cases: contiguous tensors, row slices, a sliced last dim). Anything else is copied once with
    .contiguous(): kernels take a row stride, not a full stride vector.
    """
    n_cols = t.shape[-1]
    if t.dim() == 1:
        t = t.unsqueeze(0)
    if t.stride(-1) != 1 and n_cols > 1:
        t = t.contiguous()
    try:
        return t.view(-1, n_cols)
    except RuntimeError:
        return t.contiguous().view(-1, n_cols)
