"""Memcheck: bounds-check every memory access of interpreted Triton kernels.

While checking is on (:func:`checking`, ``WAVEFRONT_MEMCHECK=1``, the test suite's default), every grid run of
the Triton interpreter, wavefront's or anyone's ``@triton.jit`` kernel, is checked lane by lane before the
access happens:

- ``tl.load`` / ``tl.store`` (masked-off lanes exempt), ``tl.atomic_*`` of every kind (add, min, max, and, or,
  xor, xchg, cas), and tensor-descriptor blocks (``tl.make_tensor_descriptor`` and a host
  ``TensorDescriptor``; load, store, gather, scatter);
- against the extent of the tensor arguments: each argument's view, from its first to one past its last
  element (``data_ptr`` + ``sum((size - 1) * stride) + 1`` elements). An address inside no argument's extent
  raises :class:`MemcheckError` naming the kernel, the program id, the operation, the argument nearest the
  address, the offending element offsets relative to that argument's first element, and its extent.

Provenance: the interpreter's pointers are bare addresses, so an access is judged by where it lands. To keep an
overflow from landing silently in a neighbouring argument (PyTorch's CPU allocator packs small tensors next to
each other), each argument's storage is copied for the grid run into its own buffer between two red zones as
large as the storage (at least 4 KiB, at most 64 MiB) and copied back afterwards, as the interpreter itself
does for GPU tensors. An access that overshoots its tensor by less than the tensor's size (off-by-one rows,
one-past-the-end indices, a tail without a mask) therefore lands in a red zone and is reported against the
right argument. A wild pointer beyond the red zones is still caught unless it happens to hit another argument's
extent, in which case it is missed (no per-pointer provenance). Storages over 256 MiB stay in place, checked
without red zones (copying a mostly untouched multi-GiB buffer would make all of it resident).

Tensor descriptors: a TMA block may reach outside the descriptor's shape; the hardware clips stores and fills
loads with the padding value there, so those elements are legal and exempt (the interpreter masks them). An
element inside the shape whose address (base + index . strides) lies outside the base tensor's extent would
read or corrupt other memory on a GPU (a descriptor whose shape or strides exceed its storage) and is reported
as a ``descriptor load`` / ``descriptor store``.

Speed: one vectorized numpy test per access (min and max of the active addresses against the merged extents;
a per-lane ``searchsorted`` only when that fails), plus the storage copies per grid run.

Initcheck (``checking(initcheck=True)``, ``WAVEFRONT_MEMCHECK=init``): while it is on, every CPU tensor made by
``torch.empty``, ``torch.empty_like``, ``torch.empty_strided``, ``Tensor.new_empty`` or ``Tensor.new_empty_strided``
starts filled with a poison pattern: for float types a NaN whose payload no arithmetic produces (so math on it
also stays visibly NaN), 0xA5 bytes otherwise. A kernel load, descriptor load or read-modify-write atomic of an
element that still holds its poison raises :class:`MemcheckError` with ``kind="uninitialized"``. Whatever writes
the element first (a kernel store, ``zero_``, ``copy_``, any torch op) replaces the pattern, so no write needs
to be seen. It misses a value that happens to equal the pattern bit for bit (only a copy of unwritten memory
does), memory from other allocators, and reads by torch ops (they see the NaN, not an error).

Installing: the interpreter's builder methods and ``GridExecutor`` are wrapped while any :func:`checking` scope
is open and restored when the outermost one closes. The wrappers compose with wavefront's own
(``_interpreter.gpu_rounding``) and the traffic counter's, which wrap whatever is installed when they enter.
:func:`keep_addresses` turns the relocation off (for tools that map addresses back to the launch's tensors);
accesses are then checked in place, without red zones.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["Extent", "MemcheckError", "checking", "enabled", "env_mode", "indirect", "install_from_env",
           "keep_addresses"]

ENV = "WAVEFRONT_MEMCHECK"
_RED_ZONE_MIN, _RED_ZONE_MAX = 4096, 64 << 20
# Storages larger than this are checked in place, without red zones: copying a mostly untouched multi-GiB buffer
# (tests/ops/test_int64.py places operands past 2^31 elements in one) would make all of it resident.
_RELOCATE_MAX = 256 << 20
_SHOWN = 8  # offending offsets listed in the message
_EMPTY = torch.empty  # PyTorch's own, also while initcheck poisons what torch.empty returns


@dataclass(frozen=True)
class Extent:
    """One tensor argument's memory as the kernel sees it: ``[start, end)`` in bytes (host addresses of the
    grid run) and its element geometry."""

    name: str
    start: int
    end: int
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    numel: int
    storage_start: int
    storage_end: int

    def describe(self) -> str:
        return (f"{self.name}: {self.dtype} shape {list(self.shape)} stride {list(self.stride)} "
                f"({self.numel} elements, bytes [0x{self.start:x}, 0x{self.end:x}))")


class MemcheckError(RuntimeError):
    """An interpreted kernel accessed memory outside every tensor argument.

    Attributes: ``kernel`` (name), ``pid`` (program id, (x, y, z)), ``op`` ("load", "store", "atomic_add", ...,
    "descriptor load"), ``argument`` (name of the nearest tensor argument), ``offsets`` (first offending element
    offsets relative to that argument's first element, in elements of the access), ``byte_offsets``,
    ``n_bad`` (offending lanes in this access), ``extent`` (:class:`Extent` of that argument, or None when the
    kernel has no tensor argument).
    """

    def __init__(self, kernel: str, pid: tuple[int, ...], op: str, argument: str | None, offsets: list[int],
                 byte_offsets: list[int], n_bad: int, n_active: int, extent: Extent | None, inside_storage: bool,
                 kind: str = "out of bounds"):
        self.kernel, self.pid, self.op, self.argument, self.kind = kernel, pid, op, argument, kind
        self.offsets, self.byte_offsets, self.n_bad, self.extent = offsets, byte_offsets, n_bad, extent
        more = f" (first {len(offsets)})" if n_bad > len(offsets) else ""
        if extent is None:
            where = "the kernel has no tensor argument"
        else:
            where = (f"{'nearest argument' if kind == 'out of bounds' else 'argument'} {extent.describe()}; "
                     f"element offsets{more} {offsets}, numel {extent.numel}"
                     + ("; inside the argument's storage but outside its view" if inside_storage else ""))
        what = ("out of bounds" if kind == "out of bounds"
                else "read memory nothing has written since its allocation (initcheck)")
        super().__init__(f"memcheck: kernel {kernel} program {pid}: {op} of {n_bad} of {n_active} active lanes "
                         f"{what}; {where}")


@dataclass
class _Run:
    """The tensor arguments of one grid run."""

    kernel: str
    extents: list[Extent] = field(default_factory=list)
    lo: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))  # merged extents, sorted
    hi: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    # initcheck: storages still holding their allocation's poison, as (start address, bytes, poison pattern)
    poisoned: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)
    # relocation: the host arguments as the interpreter made them, and (their storage's bytes, the copy's bytes)
    originals: tuple[list, dict] | None = None
    copies: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)

    def seal(self) -> None:
        spans = sorted((e.start, e.end) for e in self.extents if e.end > e.start)
        merged: list[list[int]] = []
        for start, end in spans:
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self.lo = np.array([m[0] for m in merged], dtype=np.uint64)
        self.hi = np.array([m[1] for m in merged], dtype=np.uint64)

    def check(self, op: str, ptrs, mask) -> None:
        addrs = np.asarray(ptrs.data)
        if mask is not None:
            active = np.asarray(mask.data, dtype=bool)
            if not active.all():
                addrs = addrs[np.broadcast_to(active, addrs.shape)]
        addrs = addrs.ravel().astype(np.uint64, copy=False)
        if addrs.size == 0:
            return
        size = np.uint64(max(1, ptrs.get_element_ty().primitive_bitwidth // 8))
        lo, hi = addrs.min(), addrs.max()
        i = int(np.searchsorted(self.lo, lo, side="right")) - 1
        if not (i >= 0 and hi + size <= self.hi[i]):
            idx = np.searchsorted(self.lo, addrs, side="right") - 1
            ok = ((idx >= 0) & (addrs + size <= self.hi[np.maximum(idx, 0)]) if self.lo.size
                  else np.zeros(addrs.shape, bool))
            if not ok.all():
                raise self._error(op, addrs[~ok], int(size), int(addrs.size))
        if self.poisoned and _reads(op):
            self._check_written(op, addrs, int(size), int(lo), int(hi))

    def _check_written(self, op: str, addrs: np.ndarray, size: int, lo: int, hi: int) -> None:
        """initcheck: no active lane may read an element that still holds its allocation's poison."""
        for start, raw, pattern in self.poisoned:
            if hi < start or lo >= start + raw.size:
                continue
            offs = addrs.astype(np.int64) - start
            offs = offs[(offs >= 0) & (offs + size <= raw.size)]
            if offs.size == 0:
                continue
            at = offs[:, None] + np.arange(size)
            unwritten = (raw[at] == pattern[at % pattern.size]).all(axis=1)
            if unwritten.any():
                raise self._error(op, (offs[unwritten] + start).astype(np.uint64), size, int(addrs.size),
                                  kind="uninitialized")

    def _error(self, op: str, bad: np.ndarray, size: int, n_active: int,
               kind: str = "out of bounds") -> MemcheckError:
        from triton.runtime import interpreter  # lazy: Triton-free import

        pid = tuple(int(v) for v in interpreter.interpreter_builder.grid_idx)
        first = int(bad[0])
        extent = min(self.extents, key=lambda e: 0 if e.start <= first < e.end else min(abs(first - e.start),
                                                                                        abs(first - e.end)),
                     default=None)
        shown = [int(a) for a in bad[:_SHOWN]]
        if extent is None:
            return MemcheckError(self.kernel, pid, op, None, [], [], int(bad.size), n_active, None, False)
        byte_offsets = [a - extent.start for a in shown]
        inside = extent.storage_start <= first < extent.storage_end
        inside = inside and kind == "out of bounds" and not extent.start <= first < extent.end
        return MemcheckError(self.kernel, pid, op, extent.name, [b // size for b in byte_offsets], byte_offsets,
                             int(bad.size), n_active, extent, inside, kind)


def _reads(op: str) -> bool:
    """Whether the operation reads the memory it accesses (an exchange returns the old value but does not
    depend on it; a store reads nothing)."""
    return op not in ("store", "descriptor store", "descriptor scatter", "atomic_store", "atomic_xchg")


_DEPTH = 0
_RELOCATE = [True]
_RUNS: list[_Run] = []  # the grid runs in progress (innermost last)
_OP: list[str] = []  # the operation name a descriptor or atomic wrapper hands to the load/store check
_SAVED: dict[str, Any] = {}
_INDIRECT: list[list[tuple[str, torch.Tensor]]] = []  # tensors reached through pointer tables, per scope


def enabled() -> bool:
    """Whether interpreted kernels are being checked now."""
    return _DEPTH > 0


@contextlib.contextmanager
def checking(initcheck: bool = False) -> Iterator[None]:
    """Check every interpreted kernel's memory accesses inside the block (see module docstring).

    ``initcheck``: also report kernel reads of memory that nothing has written since it was allocated with an
    ``empty`` factory (see "Initcheck" in the module docstring).
    """
    _install()
    if initcheck:
        _poison_install()
    try:
        yield
    finally:
        if initcheck:
            _poison_uninstall()
        _uninstall()


@contextlib.contextmanager
def keep_addresses() -> Iterator[None]:
    """Inside the block, tensor arguments keep their own addresses (no red-zone copies), for tools that map the
    interpreter's addresses back to the launch's tensors; accesses are still checked against their extents."""
    _RELOCATE.append(False)
    try:
        yield
    finally:
        _RELOCATE.pop()


@contextlib.contextmanager
def indirect(tensors: dict[str, Sequence[torch.Tensor] | None]) -> Iterator[None]:
    """Grid runs inside the block may also access these tensors, which they reach through addresses stored in
    memory (a pointer table: AdamW's multi-tensor launch) rather than through an argument. Checked in place
    (no red zones): their addresses are baked into the table. ``tensors`` maps a name to a list of tensors
    (None: an absent column)."""
    _INDIRECT.append([(f"{name}[{i}]", t) for name, col in tensors.items() if col is not None
                      for i, t in enumerate(col)])
    try:
        yield
    finally:
        _INDIRECT.pop()


def env_mode() -> str | None:
    """``WAVEFRONT_MEMCHECK``: None (off: unset, "", "0"), "on" ("1") or "init" ("init"); anything else is an
    error naming the variable."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "0", "off"):
        return None
    if value in ("1", "on"):
        return "on"
    if value == "init":
        return "init"
    raise ValueError(f"{ENV}={os.environ[ENV]!r}: expected 0, 1 or init")


_FROM_ENV: list[str] = []


def install_from_env() -> bool:
    """Turn checking on for the rest of the process when ``WAVEFRONT_MEMCHECK`` asks for it (idempotent);
    returns whether checking is on."""
    if _FROM_ENV:
        return True
    mode = env_mode()
    if mode is not None:
        _install()  # for the rest of the process: never uninstalled
        if mode == "init":
            _poison_install()
        _FROM_ENV.append(mode)
    return enabled()


# ---------------------------------------------------------------------------------------------------
# The wrappers.

_RMW_NAMES = {"ADD": "atomic_add", "FADD": "atomic_add", "MIN": "atomic_min", "UMIN": "atomic_min",
              "MAX": "atomic_max", "UMAX": "atomic_max", "AND": "atomic_and", "OR": "atomic_or", "XOR": "atomic_xor",
              "XCHG": "atomic_xchg"}


def _check(op: str, ptrs, mask) -> None:
    if _RUNS:
        _RUNS[-1].check(_OP[0] if _OP else op, ptrs, mask)  # the outermost: a gather's loads report the gather


def _named(name: str, method):
    """A builder method that runs `method` with `name` as the operation its loads and stores report."""

    def wrapper(self, *args, **kwargs):
        _OP.append(name)
        try:
            return method(self, *args, **kwargs)
        finally:
            _OP.pop()

    return wrapper


def _install() -> None:
    global _DEPTH
    _DEPTH += 1
    if _DEPTH > 1:
        return
    from triton.runtime import interpreter  # lazy: Triton-free import

    builder, grid = interpreter.InterpreterBuilder, interpreter.GridExecutor
    names = ("create_masked_load", "create_masked_store", "create_atomic_rmw", "create_atomic_cas",
             "create_atomic_load", "create_atomic_store", "create_descriptor_load", "create_descriptor_store",
             "create_descriptor_gather", "create_descriptor_scatter")
    _SAVED.update({n: getattr(builder, n) for n in names})
    _SAVED["__call__"], _SAVED["_init_args_hst"] = grid.__call__, grid._init_args_hst
    _SAVED["_restore_args_dev"] = grid._restore_args_dev
    load, store = _SAVED["create_masked_load"], _SAVED["create_masked_store"]
    rmw, cas = _SAVED["create_atomic_rmw"], _SAVED["create_atomic_cas"]

    def masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        _check("load", ptrs, mask)
        return load(self, ptrs, mask, other, cache_policy, is_volatile)

    def masked_store(self, ptrs, value, mask, cache_policy):
        _check("store", ptrs, mask)
        return store(self, ptrs, value, mask, cache_policy)

    def atomic_rmw(self, rmw_op, ptr, val, mask, sem, scope):
        _check(_RMW_NAMES.get(getattr(rmw_op, "name", ""), "atomic_rmw"), ptr, mask)
        return rmw(self, rmw_op, ptr, val, mask, sem, scope)

    def atomic_cas(self, ptr, cmp, val, sem, scope):
        _check("atomic_cas", ptr, None)
        return cas(self, ptr, cmp, val, sem, scope)

    builder.create_masked_load, builder.create_masked_store = masked_load, masked_store
    builder.create_atomic_rmw, builder.create_atomic_cas = atomic_rmw, atomic_cas
    builder.create_atomic_load = _named("atomic_load", _SAVED["create_atomic_load"])
    builder.create_atomic_store = _named("atomic_store", _SAVED["create_atomic_store"])
    builder.create_descriptor_load = _named("descriptor load", _SAVED["create_descriptor_load"])
    builder.create_descriptor_store = _named("descriptor store", _SAVED["create_descriptor_store"])
    builder.create_descriptor_gather = _named("descriptor gather", _SAVED["create_descriptor_gather"])
    builder.create_descriptor_scatter = _named("descriptor scatter", _SAVED["create_descriptor_scatter"])
    grid._init_args_hst = _init_args_hst_wrapper(_SAVED["_init_args_hst"])
    grid._restore_args_dev = _restore_args_dev_wrapper(_SAVED["_restore_args_dev"])
    grid.__call__ = _call_wrapper(_SAVED["__call__"])


def _uninstall() -> None:
    global _DEPTH
    _DEPTH -= 1
    if _DEPTH > 0:
        return
    from triton.runtime import interpreter  # lazy: Triton-free import

    grid = interpreter.GridExecutor
    grid.__call__, grid._init_args_hst = _SAVED.pop("__call__"), _SAVED.pop("_init_args_hst")
    grid._restore_args_dev = _SAVED.pop("_restore_args_dev")
    for name, fn in _SAVED.items():
        setattr(interpreter.InterpreterBuilder, name, fn)
    _SAVED.clear()


def _call_wrapper(original):
    from triton.runtime.errors import InterpreterError  # lazy: Triton-free import

    def grid_call(self, *args, **kwargs):
        depth = len(_RUNS)
        try:
            return original(self, *args, **kwargs)
        except InterpreterError as e:
            if isinstance(e.__cause__, MemcheckError):
                raise e.__cause__ from None
            raise
        finally:
            del _RUNS[depth:]

    return grid_call


def _init_args_hst_wrapper(original):
    """GridExecutor._init_args_hst, then the host arguments' storages moved between red zones (unless
    :func:`keep_addresses`), their extents recorded for the run."""
    from triton.runtime import interpreter  # lazy: Triton-free import

    def init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = original(self, args_dev, kwargs)
        run = _Run(kernel=getattr(self.fn, "__name__", str(self.fn)), originals=(args_hst, kwargs_hst))
        moved: dict[int, torch.UntypedStorage] = {}
        relocate = _RELOCATE[-1]

        def visit(name: str, arg):
            if isinstance(arg, tuple):
                return interpreter._tuple_create(arg, (visit(f"{name}[{i}]", a) for i, a in enumerate(arg)))
            if isinstance(arg, interpreter.TensorDescriptor):
                return interpreter.TensorDescriptor(visit(f"{name}.base", arg.base), arg.shape, arg.strides,
                                                    arg.block_shape, arg.padding, arg.round_f32_to_tf32)
            if not hasattr(arg, "data_ptr"):
                return arg
            base = interpreter._unwrap_tensor(arg)
            pattern = _poison_of(base.untyped_storage()) if _POISON_DEPTH else None
            if relocate and 0 < base.untyped_storage().nbytes() <= _RELOCATE_MAX:
                base = _relocated(base, moved, run.copies)
            if pattern is not None and all(start != base.untyped_storage().data_ptr() for start, _, _ in run.poisoned):
                storage = base.untyped_storage()
                run.poisoned.append((storage.data_ptr(), _bytes(storage).numpy(), pattern))
            run.extents.append(_extent(name, base))
            return interpreter._rewrap_tensor(base, original_tensor=arg)

        names = list(self.arg_names)
        args_hst = [visit(names[i] if i < len(names) else f"arg{i}", a) for i, a in enumerate(args_hst)]
        kwargs_hst = {k: visit(k, v) for k, v in kwargs_hst.items()}
        run.extents.extend(_extent(name, t) for scope in _INDIRECT for name, t in scope)
        run.seal()
        _RUNS.append(run)
        return args_hst, kwargs_hst

    return init_args_hst


def _restore_args_dev_wrapper(original):
    """GridExecutor._restore_args_dev with the relocated copies first copied back into the host arguments the
    interpreter made (on a CPU: the caller's own tensors), which it then restores as it always does."""

    def restore_args_dev(self, args_dev, args_hst, kwargs, kwargs_hst):
        run = _RUNS[-1] if _RUNS else None
        if run is None or run.originals is None:
            return original(self, args_dev, args_hst, kwargs, kwargs_hst)
        for host, copy in run.copies:
            np.copyto(host, copy)
        return original(self, args_dev, run.originals[0], kwargs, run.originals[1])

    return restore_args_dev


def _relocated(t: torch.Tensor, moved: dict[int, torch.UntypedStorage],
               copies: list[tuple[np.ndarray, np.ndarray]]) -> torch.Tensor:
    """`t` as a view of a copy of its storage placed between two red zones (one copy per storage, so aliasing
    arguments stay aliased); `copies` gets (storage bytes, copy bytes) to copy back after the run. numpy copies:
    torch's copy_ of a few KiB goes multi-threaded and costs milliseconds on a busy machine."""
    storage = t.untyped_storage()
    key = storage.data_ptr()
    if key not in moved:
        nbytes = storage.nbytes()
        zone = min(max(nbytes, _RED_ZONE_MIN), _RED_ZONE_MAX)
        buf = np.zeros(zone + nbytes + zone + 256, dtype=np.uint8)  # calloc: untouched red zones cost no memory
        shift = (key - (buf.ctypes.data + zone)) % 256  # keep the storage's alignment modulo 256 bytes
        inner = buf[zone + shift:zone + shift + nbytes]
        host = _bytes(storage).numpy()
        np.copyto(inner, host)
        copies.append((host, inner))
        moved[key] = torch.from_numpy(inner).untyped_storage()
    view = _EMPTY(0, dtype=t.dtype).set_(moved[key], t.storage_offset(), t.size(), t.stride())
    return view


def _bytes(storage) -> torch.Tensor:
    """A storage as a uint8 tensor over its bytes."""
    return _EMPTY(0, dtype=torch.uint8).set_(storage)


def _extent(name: str, t: torch.Tensor) -> Extent:
    itemsize = t.element_size()
    numel = t.numel()
    span = (sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) + 1) * itemsize if numel else 0
    start = t.data_ptr()
    storage = t.untyped_storage()
    return Extent(name, start, start + span, str(t.dtype).removeprefix("torch."), tuple(t.shape), tuple(t.stride()),
                  numel, storage.data_ptr(), storage.data_ptr() + storage.nbytes())


# ---------------------------------------------------------------------------------------------------
# Initcheck: memory from the ``empty`` factories starts poisoned.

_POISON_DEPTH = 0
_POISONED: dict[int, tuple[weakref.ref, np.ndarray]] = {}  # storage address -> (the storage, its poison pattern)
_FACTORIES = (("torch", "empty"), ("torch", "empty_like"), ("torch", "empty_strided"), ("Tensor", "new_empty"),
              ("Tensor", "new_empty_strided"))
_SAVED_FACTORIES: dict[tuple[str, str], Any] = {}


def _pattern(dtype: torch.dtype, size: int) -> np.ndarray:
    """One element of poison, as little-endian bytes: a NaN with an unusual payload for float types (arithmetic
    on it stays visibly NaN; no float operation produces that payload), 0xA5 bytes otherwise."""
    nan_bits = {torch.float32: 0x7FA5A5A5, torch.float64: 0x7FF5A5A5A5A5A5A5, torch.float16: 0x7DA5,
                torch.bfloat16: 0x7FA5, torch.float8_e4m3fn: 0x7F, torch.float8_e5m2: 0x7F,
                torch.float8_e4m3fnuz: 0x80, torch.float8_e5m2fnuz: 0x80}
    if dtype in nan_bits:
        return np.frombuffer(nan_bits[dtype].to_bytes(size, "little"), dtype=np.uint8).copy()
    return np.full(max(size, 1), 0xA5, dtype=np.uint8)


def _poisoned(t):
    """Fill a fresh CPU tensor's storage with its dtype's poison and remember the storage."""
    if type(t) is not torch.Tensor or t.device.type != "cpu" or t.untyped_storage().nbytes() == 0:
        return t
    storage = t.untyped_storage()
    pattern = _pattern(t.dtype, t.element_size())
    raw = _bytes(storage).numpy()
    raw[:] = np.resize(pattern, raw.size)
    key = storage.data_ptr()
    _POISONED[key] = (weakref.ref(storage, lambda _, key=key: _POISONED.pop(key, None)), pattern)
    return t


def _poison_of(storage) -> np.ndarray | None:
    entry = _POISONED.get(storage.data_ptr())
    return entry[1] if entry is not None and entry[0]() is storage else None


def _factory(fn):
    def empty(*args, **kwargs):
        return _poisoned(fn(*args, **kwargs))

    return empty


def _poison_install() -> None:
    global _POISON_DEPTH
    _POISON_DEPTH += 1
    if _POISON_DEPTH > 1:
        return
    owners = {"torch": torch, "Tensor": torch.Tensor}
    for owner, name in _FACTORIES:
        _SAVED_FACTORIES[owner, name] = getattr(owners[owner], name)
        setattr(owners[owner], name, _factory(_SAVED_FACTORIES[owner, name]))


def _poison_uninstall() -> None:
    global _POISON_DEPTH
    _POISON_DEPTH -= 1
    if _POISON_DEPTH > 0:
        return
    owners = {"torch": torch, "Tensor": torch.Tensor}
    for (owner, name), fn in _SAVED_FACTORIES.items():
        setattr(owners[owner], name, fn)
    _SAVED_FACTORIES.clear()
    _POISONED.clear()
