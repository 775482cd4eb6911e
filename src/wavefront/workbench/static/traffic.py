"""Bytes each kernel really loads and stores, against the op's minimum and against eager PyTorch.

Kernel traffic is counted by instrumenting the Triton interpreter's memory paths
(``InterpreterBuilder.create_masked_load`` / ``create_masked_store``, which plain, descriptor and atomic
loads and stores all go through, and ``create_atomic_rmw`` / ``create_atomic_cas``): every lane whose mask is
on counts its element size; masked-off lanes count nothing. Two totals per kernel:

- requested bytes: what the loads and stores ask for (a re-read counts again: a cache-less model);
- unique bytes: the footprint, the union of byte ranges touched (a perfect-cache model).

The op's traffic adds the PyTorch work it does besides its kernels (e.g. summing per-program weight
gradient partials), counted like eager's. Eager traffic is counted with a ``TorchDispatchMode``: every aten
op reads its tensor inputs and writes its outputs (views and allocations move nothing; ``fill_``,
``zero_``, ``copy_`` and ``out=`` targets are written, not read). This is the traffic of unfused eager
PyTorch at the input dtype; a real GPU's caches can only lower it.

Ratios per op x mode x case: ``bytes_moved / min_bytes`` (goal 1.00 for memory-bound ops: each input read
once, each output written once) and ``eager_bytes / bytes_moved``. For row-wise ops (a case with
``n_rows``) the case is also run with more rows, and the marginal ratio (extra bytes per extra row, over
the minimum's) separates per-row traffic from fixed per-program costs such as gradient partials.

**HBM passes per row** (``hbm_passes``, row-wise cases): how many times a row of the most-read row-sized
input is loaded, from the same two runs: per pointer argument (summed over the mode's launches), the extra
bytes loaded over the extra bytes of the tensor's extent; row-sized arguments only (those whose extent grows
by at least ``n_cols`` bytes per extra row, so per-row statistics and scales do not count); the largest.
1.0 is one read of each row; a wide row whose statistics pass is followed by a writing pass reads 2.0. It
is a cache-less count (requested bytes): a second read served from L2 still counts. A 0-d output (a loss)
gets the upstream gradient 1, what ``loss.backward()`` passes; other outputs get random gradients.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import ClassVar

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from wavefront import runtime
from wavefront.kernels._launch import Launch, TensorArg, recording, reset_caches
from wavefront.kernels._memcheck import keep_addresses
from wavefront.ops import REGISTRY
from wavefront.ops._spec import Case, OpSpec, dtype_name
from wavefront.workbench.static.capture import BELOW_PYTHON_KEYS, op_modes, seed

SCHEMA = "wavefront.traffic/1"
#: Elements per traffic case (rows are scaled down to about this many): small enough for the interpreter.
TRAFFIC_ELEMS = 1 << 18
#: The marginal run has this many times the case's rows.
MARGINAL_FACTOR = 2
#: Fewest rows in a traffic case: twice the persistent programs the interpreter launches (2 SMs x 4), so
#: every program owns rows in both runs of the marginal ratio and its fixed costs cancel.
MIN_TRAFFIC_ROWS = 2 * runtime.INTERPRETER_SM_COUNT * runtime.PERSISTENT_PROGRAMS_PER_SM


# ---------------------------------------------------------------------------------------------------
# Interval arithmetic on byte ranges.


def union_bytes(starts: np.ndarray, sizes: np.ndarray) -> int:
    """Bytes covered by the union of [start, start + size) ranges."""
    if starts.size == 0:
        return 0
    order = np.argsort(starts, kind="stable")
    s = starts[order].astype(np.int64)
    e = s + sizes[order].astype(np.int64)
    running_end = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > running_end[:-1]
    first = np.flatnonzero(new)
    block_end = np.maximum.reduceat(e, first)
    return int((block_end - s[first]).sum())


@dataclass
class _Accesses:
    """Byte ranges touched, as runs of consecutive elements (a block load of 8192 contiguous lanes is one
    run), kept until the launch is summarized."""

    starts: list[np.ndarray] = field(default_factory=list)
    lengths: list[np.ndarray] = field(default_factory=list)  # bytes
    requested: int = 0

    def add(self, addrs: np.ndarray, size: int) -> None:
        if addrs.size == 0:
            return
        a = addrs.astype(np.int64, copy=False).ravel()
        breaks = np.flatnonzero(np.diff(a) != size) + 1
        first = np.concatenate(([0], breaks))
        self.starts.append(a[first])
        self.lengths.append(np.diff(np.concatenate((first, [a.size]))) * size)
        self.requested += int(a.size) * size

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.starts:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        return np.concatenate(self.starts), np.concatenate(self.lengths)


@dataclass
class _LaunchAccesses:
    loads: _Accesses = field(default_factory=_Accesses)
    stores: _Accesses = field(default_factory=_Accesses)
    atomics: _Accesses = field(default_factory=_Accesses)


#: True while the interpreter runs a kernel: the PyTorch calls it makes to stage arguments and convert
#: dtypes are the emulator's, not the op's, and :class:`AtenBytes` skips them.
_IN_KERNEL = [False]


class InterpreterCounter:
    """Counts the interpreter's global memory accesses per launch while active (a context manager).

    ``launches`` is the list a ``recording()`` block fills: an access belongs to its last launch.
    """

    def __init__(self) -> None:
        self.launches: list[Launch] | None = None
        self.by_launch: dict[int, _LaunchAccesses] = {}
        self._saved: dict[str, Callable] = {}

    def _current(self) -> _LaunchAccesses:
        if not self.launches:
            raise RuntimeError("a kernel ran outside wavefront.kernels._launch.launch: its traffic has no owner")
        return self.by_launch.setdefault(id(self.launches[-1]), _LaunchAccesses())

    def __enter__(self) -> InterpreterCounter:
        from triton.runtime import interpreter  # lazy: Triton-free import

        if not runtime.interpreting():
            raise RuntimeError("traffic is counted under the Triton interpreter: set TRITON_INTERPRET=1 before "
                               "the first kernel module is imported")
        builder = interpreter.InterpreterBuilder
        names = ("create_masked_load", "create_masked_store", "create_atomic_rmw", "create_atomic_cas")
        self._saved = {n: getattr(builder, n) for n in names}
        # addresses are attributed to the launch's recorded tensors: memcheck must not move them
        self._keep_addresses = keep_addresses()
        self._keep_addresses.__enter__()
        self._saved_call = interpreter.GridExecutor.__call__
        run_grid = self._saved_call

        def grid_call(self, *args, **kwargs):
            _IN_KERNEL[0] = True
            try:
                return run_grid(self, *args, **kwargs)
            finally:
                _IN_KERNEL[0] = False

        counter = self
        load, store = self._saved["create_masked_load"], self._saved["create_masked_store"]
        rmw, cas = self._saved["create_atomic_rmw"], self._saved["create_atomic_cas"]

        def _size(ptrs) -> int:
            return ptrs.get_element_ty().primitive_bitwidth // 8

        def _active(ptrs, mask) -> np.ndarray:
            addrs = np.asarray(ptrs.data)
            if mask is None:
                return addrs.ravel()
            return addrs[np.broadcast_to(np.asarray(mask.data, dtype=bool), addrs.shape)]

        def masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
            counter._current().loads.add(_active(ptrs, mask), _size(ptrs))
            return load(self, ptrs, mask, other, cache_policy, is_volatile)

        def masked_store(self, ptrs, value, mask, cache_policy):
            counter._current().stores.add(_active(ptrs, mask), _size(ptrs))
            return store(self, ptrs, value, mask, cache_policy)

        def atomic_rmw(self, rmw_op, ptr, val, mask, sem, scope):
            counter._current().atomics.add(_active(ptr, mask), _size(ptr))
            return rmw(self, rmw_op, ptr, val, mask, sem, scope)

        def atomic_cas(self, ptr, cmp, val, sem, scope):
            counter._current().atomics.add(_active(ptr, None), _size(ptr))
            return cas(self, ptr, cmp, val, sem, scope)

        builder.create_masked_load = masked_load
        builder.create_masked_store = masked_store
        builder.create_atomic_rmw = atomic_rmw
        builder.create_atomic_cas = atomic_cas
        interpreter.GridExecutor.__call__ = grid_call
        return self

    def __exit__(self, *exc) -> None:
        from triton.runtime import interpreter  # lazy: Triton-free import

        for name, fn in self._saved.items():
            setattr(interpreter.InterpreterBuilder, name, fn)
        interpreter.GridExecutor.__call__ = self._saved_call
        self._saved = {}
        self._keep_addresses.__exit__(None, None, None)


# ---------------------------------------------------------------------------------------------------
# Eager (and host-side) traffic: aten ops' inputs and outputs.

_NO_TRAFFIC = {"detach", "alias", "lift_fresh", "set_", "resize_", "_local_scalar_dense"}
_WRITE_ONLY = {"fill_", "zero_", "copy_", "normal_", "uniform_", "random_", "bernoulli_", "exponential_"}


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor addresses (broadcast dims count once)."""
    n = 1
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if size == 0:
            return 0
        if stride != 0:
            n *= size
    return n * t.element_size()


class AtenBytes(TorchDispatchMode):
    """Sums the bytes each aten op reads and writes; custom (non-aten) ops are opened up, not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.read_bytes = 0
        self.written_bytes = 0
        self.ops: dict[str, int] = {}

    @property
    def total(self) -> int:
        return self.read_bytes + self.written_bytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace != "aten":
            with self:
                return func.redispatch(BELOW_PYTHON_KEYS, *args, **kwargs)
        out = func(*args, **kwargs)
        name = func._schema.name.split("::")[-1]
        if _IN_KERNEL[0] or func.is_view or name.startswith(("empty", "new_empty")) or name in _NO_TRAFFIC:
            return out
        schema = func._schema
        written_ids: set[int] = set()
        written = 0
        for arg_schema, value in _bound(schema, args, kwargs):
            if isinstance(value, torch.Tensor) and arg_schema.alias_info is not None and arg_schema.alias_info.is_write:
                written_ids.add(id(value))
                written += tensor_bytes(value)
        read = 0
        for i, (arg_schema, value) in enumerate(_bound(schema, args, kwargs)):
            if not isinstance(value, torch.Tensor):
                continue
            if id(value) in written_ids and (name in _WRITE_ONLY and i == 0 or arg_schema.is_out):
                continue
            read += tensor_bytes(value)
        if not written_ids:
            outs, _ = tree_flatten(out)
            written = sum(tensor_bytes(o) for o in outs if isinstance(o, torch.Tensor))
        self.read_bytes += read
        self.written_bytes += written
        self.ops[name] = self.ops.get(name, 0) + read + written
        return out


def _bound(schema, args, kwargs):
    for i, a in enumerate(schema.arguments):
        if i < len(args) and not a.kwarg_only:
            yield a, args[i]
        elif a.name in kwargs:
            yield a, kwargs[a.name]


# ---------------------------------------------------------------------------------------------------
# Results.


@dataclass
class TensorTraffic:
    """One pointer argument of one launch."""

    arg: str
    dtype: str
    extent_bytes: int  # bytes from the tensor's first to one past its last element
    loaded_bytes: int
    stored_bytes: int
    unique_bytes: int


@dataclass
class KernelTraffic:
    kernel: str
    grid: list[int]
    loaded_bytes: int
    stored_bytes: int
    atomic_bytes: int
    unique_bytes: int
    tensors: list[TensorTraffic]

    @property
    def requested_bytes(self) -> int:
        return self.loaded_bytes + self.stored_bytes + self.atomic_bytes


@dataclass
class TrafficRow:
    """One op x mode x case: what its kernels move, against the minimum and against eager."""

    op: str
    mode: str
    case: str
    dtype: str
    dims: dict[str, int]
    kernels: list[KernelTraffic]
    kernel_bytes: int  # requested by the op's Triton kernels
    unique_bytes: int  # footprint of the op's kernels (union over its launches)
    host_bytes: int  # PyTorch work the op does besides its kernels (partial sums, casts)
    min_bytes: int
    eager_bytes: int
    marginal_ratio: float | None = None  # extra bytes per extra row over the minimum's; row-wise ops only
    hbm_passes: float | None = None  # loads of a row of the most-read row-sized input, per row (see above)
    error: str | None = None
    wall_s: float = 0.0  # CPU interpreter: not a performance figure

    @property
    def bytes_moved(self) -> int:
        return self.kernel_bytes + self.host_bytes

    @property
    def ratio_min(self) -> float:
        return self.bytes_moved / self.min_bytes if self.min_bytes else float("nan")

    @property
    def ratio_eager(self) -> float:
        return self.eager_bytes / self.bytes_moved if self.bytes_moved else float("nan")

    @property
    def key(self) -> str:
        return f"{self.op}/{self.mode}/{self.case}"

    def as_dict(self) -> dict:
        d = asdict(self)
        for k, kd in zip(self.kernels, d["kernels"], strict=True):
            kd["requested_bytes"] = k.requested_bytes
        return d | {"key": self.key, "bytes_moved": self.bytes_moved, "ratio_min": self.ratio_min,
                    "ratio_eager": self.ratio_eager}

    @classmethod
    def from_dict(cls, d: dict) -> TrafficRow:
        kernels = [KernelTraffic(**{k: v for k, v in kd.items() if k != "requested_bytes" and k != "tensors"},
                                 tensors=[TensorTraffic(**t) for t in kd["tensors"]]) for kd in d["kernels"]]
        names = set(cls.__dataclass_fields__) - {"kernels"}
        return cls(kernels=kernels, **{k: v for k, v in d.items() if k in names})


@dataclass
class TrafficReport:
    SCHEMA: ClassVar[str] = SCHEMA

    rows: list[TrafficRow]
    dtype: str
    note: str = "bytes counted by the Triton interpreter on CPU; wall times are not performance figures"

    def as_dict(self) -> dict:
        return {"schema": SCHEMA, "dtype": self.dtype, "note": self.note, "n_rows": len(self.rows),
                "n_failed": sum(r.error is not None for r in self.rows), "rows": [r.as_dict() for r in self.rows]}

    @classmethod
    def from_dict(cls, d: dict) -> TrafficReport:
        if d.get("schema") != SCHEMA:
            raise ValueError(f"not a traffic document: schema {d.get('schema')!r}, expected {SCHEMA!r}")
        return cls([TrafficRow.from_dict(r) for r in d["rows"]], d["dtype"], d.get("note", ""))


# ---------------------------------------------------------------------------------------------------
# Measuring.


def _arg_names(launch: Launch) -> list[str]:
    fn = getattr(launch.kernel, "fn", launch.kernel)
    return list(inspect.signature(fn).parameters)


def _extent(t: TensorArg) -> int:
    if any(s == 0 for s in t.shape):
        return 0
    itemsize = torch.empty((), dtype=t.dtype).element_size()
    return (sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride, strict=True)) + 1) * itemsize


def summarize_launch(launch: Launch, acc: _LaunchAccesses | None) -> KernelTraffic:
    """Totals of one launch, with loads and stores attributed to its tensor arguments."""
    acc = acc or _LaunchAccesses()
    names = _arg_names(launch)
    tensors = [(names[i] if i < len(names) else f"arg{i}", a) for i, a in enumerate(launch.args)
               if isinstance(a, TensorArg)]
    all_addrs, all_sizes = [], []
    per = {name: [0, 0, [], []] for name, _ in tensors}
    bounds = sorted((a.data_ptr, a.data_ptr + max(_extent(a), 1), name) for name, a in tensors)
    lo = np.array([b[0] for b in bounds], dtype=np.int64)
    hi = np.array([b[1] for b in bounds], dtype=np.int64)
    for kind, accesses in (("load", acc.loads), ("store", acc.stores), ("atomic", acc.atomics)):
        addrs, sizes = accesses.arrays()
        all_addrs.append(addrs)
        all_sizes.append(sizes)
        if not bounds or addrs.size == 0:
            continue
        idx = np.searchsorted(lo, addrs, side="right") - 1
        inside = (idx >= 0) & (addrs < hi[np.clip(idx, 0, None)])
        for j, (_, _, name) in enumerate(bounds):
            sel = inside & (idx == j)
            if not sel.any():
                continue
            nbytes = int(sizes[sel].sum())
            per[name][0 if kind == "load" else 1] += nbytes
            per[name][2].append(addrs[sel])
            per[name][3].append(sizes[sel])
    tensor_rows = []
    for name, a in tensors:
        loaded, stored, addrs, sizes = per[name]
        unique = union_bytes(np.concatenate(addrs), np.concatenate(sizes)) if addrs else 0
        tensor_rows.append(TensorTraffic(name, dtype_name(a.dtype), _extent(a), loaded, stored, unique))
    unique_all = union_bytes(np.concatenate(all_addrs), np.concatenate(all_sizes))
    return KernelTraffic(launch.name, list(launch.grid), acc.loads.requested, acc.stores.requested,
                         acc.atomics.requested, unique_all, tensor_rows)


@dataclass
class _ModeCount:
    kernels: list[KernelTraffic]
    kernel_bytes: int
    unique_bytes: int
    host_bytes: int


def _clone_inputs(inputs, grad_argnums):
    return tuple(a.detach().clone().requires_grad_(i in grad_argnums) if isinstance(a, torch.Tensor) else a
                 for i, a in enumerate(inputs.args))


def _run_counted(fn, inputs, grad_argnums, modes, gen, *, kernels: bool) -> dict[str, _ModeCount]:
    """Call `fn` forward (and backward) counting aten bytes and, with kernels=True, interpreter traffic."""
    args = _clone_inputs(inputs, grad_argnums)
    counts: dict[str, _ModeCount] = {}
    reset_caches()  # every case starts cold, whatever the previous case left cached
    counter = InterpreterCounter() if kernels else None
    with counter if counter is not None else contextlib.nullcontext():
        with recording(execute=True) as fwd_launches:
            if counter is not None:
                counter.launches = fwd_launches
            with AtenBytes() as fwd_aten:
                out = fn(*args, **inputs.kwargs)
        outs = out if isinstance(out, tuple | list) else (out,)
        counts["fwd"] = _summarize(fwd_launches, counter, fwd_aten.total)
        if "bwd" in modes:
            diff = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
            dys = [torch.randn(o.shape, generator=gen).to(o.dtype) if o.dim() else torch.ones_like(o) for o in diff]
            targets = [args[i] for i in grad_argnums]
            with recording(execute=True) as bwd_launches:
                if counter is not None:
                    counter.launches = bwd_launches
                with AtenBytes() as bwd_aten:
                    torch.autograd.grad(diff, targets, dys, allow_unused=True)
            counts["bwd"] = _summarize(bwd_launches, counter, bwd_aten.total)
    return {m: c for m, c in counts.items() if m in modes}


def _summarize(launches: list[Launch], counter: InterpreterCounter | None, aten_bytes: int) -> _ModeCount:
    if counter is None:
        return _ModeCount([], 0, 0, aten_bytes)
    kernels = [summarize_launch(la, counter.by_launch.get(id(la))) for la in launches]
    addrs, sizes = [], []
    for la in launches:
        acc = counter.by_launch.get(id(la))
        if acc is None:
            continue
        for a in (acc.loads, acc.stores, acc.atomics):
            x, s = a.arrays()
            addrs.append(x)
            sizes.append(s)
    unique = union_bytes(np.concatenate(addrs), np.concatenate(sizes)) if addrs else 0
    return _ModeCount(kernels, sum(k.requested_bytes for k in kernels), unique, aten_bytes)


def _loads_by_arg(count: _ModeCount) -> dict[str, tuple[int, int]]:
    """Pointer argument -> (bytes loaded over the mode's launches, its largest extent)."""
    out: dict[str, tuple[int, int]] = {}
    for k in count.kernels:
        for t in k.tensors:
            loaded, extent = out.get(t.arg, (0, 0))
            out[t.arg] = (loaded + t.loaded_bytes, max(extent, t.extent_bytes))
    return out


def hbm_passes(base: _ModeCount, taller: _ModeCount, extra_rows: int, n_cols: int) -> float | None:
    """Loads of a row of the most-read row-sized input per row, from a case and its taller copy (see the
    module docstring); None without a row-sized input."""
    b, t = _loads_by_arg(base), _loads_by_arg(taller)
    passes = [(t[a][0] - b[a][0]) / (t[a][1] - b[a][1]) for a in t
              if a in b and t[a][1] - b[a][1] >= n_cols * extra_rows]
    return round(max(passes), 3) if passes else None


def measure_case(spec: OpSpec, case: Case, dtype: torch.dtype, modes: tuple[str, ...] | None = None,
                 eager: bool = True) -> dict[str, _ModeCount | tuple[_ModeCount, int]]:
    """Per mode: the op's counted traffic and eager's bytes."""
    modes = modes or op_modes(spec)
    gen = torch.Generator().manual_seed(seed(spec.name, case.name, dtype))
    inputs = spec.make_inputs(case, dtype, torch.device("cpu"), gen)
    grad_argnums = inputs.grad_argnums if "bwd" in modes else ()
    ours = _run_counted(spec.fn, inputs, grad_argnums, modes, torch.Generator().manual_seed(1), kernels=True)
    theirs = (_run_counted(spec.eager_fn, inputs, grad_argnums, modes, torch.Generator().manual_seed(1),
                           kernels=False) if eager else {})
    return {m: (ours[m], theirs[m].host_bytes if m in theirs else 0) for m in modes}


def traffic_cases(spec: OpSpec, elems: int = TRAFFIC_ELEMS) -> list[Case]:
    """Small but representative cases: the bench cases with rows cut to about `elems` elements (at least
    :data:`MIN_TRAFFIC_ROWS`; widths, hence launch configurations, unchanged); ops without rows use their
    non-slow cases."""
    out = []
    for case in spec.bench_cases:
        dims = dict(case.dims)
        if "n_rows" not in dims or "n_cols" not in dims:
            continue
        dims["n_rows"] = min(dims["n_rows"], max(MIN_TRAFFIC_ROWS, elems // dims["n_cols"]))
        out.append(replace(case, dims=dims))
    return out or [c for c in spec.cases if not c.slow]


def _grow_rows(case: Case, factor: int) -> Case:
    dims = dict(case.dims)
    dims["n_rows"] = dims["n_rows"] * factor
    return replace(case, dims=dims)


def traffic_rows(spec: OpSpec, case: Case, dtype: torch.dtype, modes: tuple[str, ...] | None = None,
                 marginal: bool = True) -> list[TrafficRow]:
    """Count one case (and, for row-wise cases, a taller copy for the marginal ratio)."""
    modes = modes or op_modes(spec)
    t0 = time.perf_counter()
    try:
        measured = measure_case(spec, case, dtype, modes)
        taller = None
        if marginal and "n_rows" in case.dims:
            taller = measure_case(spec, _grow_rows(case, MARGINAL_FACTOR), dtype, modes, eager=False)
    except Exception as exc:  # reported per row; the run goes on
        msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
        return [TrafficRow(spec.name, m, case.name, dtype_name(dtype), dict(case.dims), [], 0, 0, 0,
                           spec.min_bytes(case, dtype, m), 0, error=msg) for m in modes]
    wall = time.perf_counter() - t0
    rows = []
    for m in modes:
        ours, eager_bytes = measured[m]
        row = TrafficRow(spec.name, m, case.name, dtype_name(dtype), dict(case.dims), ours.kernels, ours.kernel_bytes,
                         ours.unique_bytes, ours.host_bytes, spec.min_bytes(case, dtype, m), eager_bytes,
                         wall_s=round(wall / len(modes), 3))
        if taller is not None:
            big, _ = taller[m]
            d_min = spec.min_bytes(_grow_rows(case, MARGINAL_FACTOR), dtype, m) - row.min_bytes
            d_ours = big.kernel_bytes + big.host_bytes - row.bytes_moved
            row.marginal_ratio = d_ours / d_min if d_min else None
            row.hbm_passes = hbm_passes(ours, big, case.dims["n_rows"] * (MARGINAL_FACTOR - 1), case.dims["n_cols"])
        rows.append(row)
    return rows


def traffic_ops(ops: Iterable[str] | None = None, dtype: torch.dtype = torch.bfloat16, *,
                elems: int = TRAFFIC_ELEMS, marginal: bool = True,
                cases: Callable[[OpSpec], Iterable[Case]] | None = None,
                on_progress: Callable[[int, int, str], None] | None = None) -> TrafficReport:
    """Traffic of every registered op (or the named ones) at its traffic cases, forward and backward."""
    names = list(ops) if ops else list(REGISTRY)
    for n in names:
        if n not in REGISTRY:
            raise ValueError(f"unknown op {n!r}; registered ops: {', '.join(sorted(REGISTRY))}")
    pick = cases or (lambda spec: traffic_cases(spec, elems))
    todo = [(REGISTRY[n], c) for n in names for c in pick(REGISTRY[n])]
    rows: list[TrafficRow] = []
    for i, (spec, case) in enumerate(todo):
        if on_progress:
            on_progress(i, len(todo), f"{spec.name}/{case.name}")
        rows.extend(traffic_rows(spec, case, dtype, marginal=marginal))
    if on_progress:
        on_progress(len(todo), len(todo), "done")
    return TrafficReport(rows, dtype_name(dtype))


@contextlib.contextmanager
def counting(launches: list[Launch]) -> Iterator[InterpreterCounter]:
    """Count the interpreter traffic of the launches recorded into `launches` (for direct kernel tests)."""
    with InterpreterCounter() as counter:
        counter.launches = launches
        yield counter
