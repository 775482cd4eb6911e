"""Kernel inspection without a GPU: every registered op's kernels, compiled for GPU targets and read.

For each op in the registry, each of its representative bench cases (``spec.bench_cases``), forward and
backward, and each target:

1. the op runs on the CPU with :func:`wavefront.runtime.assume_target` (so the launchers pick the launch
   configuration that target would get, including the persistent-program count of the target's GPU) and
   ``recording(execute=False)`` (nothing runs; inputs are uninitialised, see ``workbench.static.capture``);
2. each recorded launch is specialized exactly as Triton's JIT would specialize it for those arguments
   and compiled ahead of time (``workbench.static.aot``, in worker processes);
3. the machine code is read (``workbench.static.parse``) and occupancy follows from the per-arch limits
   (``workbench.static.occupancy``).

A row per kernel x target: registers, spills, shared memory/LDS, threads per block, occupancy, the widest
global load and store, the matrix instructions present, and what the machine code shows of the kernel's
design: TMA operations, warp specialization (setmaxnreg), the wgmma wait depth and block-wide barriers per
main-loop iteration, the narrowest matrix instruction, and on AMD the LDS access widths and MFMA shapes
(``docs/inspect.md`` lists the instructions each field counts). Nothing here names an op.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import json
import os
import platform
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from wavefront import runtime
from wavefront.kernels._launch import Launch, TensorArg
from wavefront.ops import REGISTRY
from wavefront.ops._spec import Case, OpSpec, dtype_name
from wavefront.workbench.document import decode
from wavefront.workbench.hardware import gpu_for_target
from wavefront.workbench.static.aot import CompileJob, CompileResult, TensorProxy, WorkerPool, gpu_target
from wavefront.workbench.static.capture import capture
from wavefront.workbench.static.occupancy import occupancy
from wavefront.workbench.static.parse import MachineCode
from wavefront.workbench.static.variants import capture_variant, variants_for

SCHEMA = "wavefront.inspect/1"
#: Global accesses narrower than this (bits per thread) count as narrow: 128-bit is the widest vector
#: access before Blackwell, and what 16-byte-aligned, divisible-by-16 rows allow.
NARROW_BITS = 128
#: Occupancy limiters as the terminal table abbreviates them.
_LIMITER = {"registers": "regs", "shared": "smem", "warps": "max", "blocks": "blocks", "none": "",
            "does-not-fit": "no fit"}


@dataclass
class KernelRow:
    """One kernel launch of one op/mode/case, compiled for one target."""

    op: str
    mode: str
    case: str
    dtype: str
    kernel: str  # kernel name; "#2", "#3"... when a mode launches it again with another specialization
    target: str
    grid: list[int]
    ok: bool
    error: str | None = None
    num_warps: int = 0
    threads_per_block: int = 0
    regs: int = 0  # NVIDIA registers/thread; AMD VGPRs/lane (AGPRs included on CDNA)
    sgprs: int | None = None
    agprs: int | None = None
    spill_bytes: int = 0
    spill_count: int = 0
    shared_bytes: int = 0  # per block: Triton's dynamic shared memory / LDS plus the binary's static part
    widest_load_bits: int = 0
    widest_store_bits: int = 0
    load_widths: dict[str, int] = field(default_factory=dict)
    store_widths: dict[str, int] = field(default_factory=dict)
    narrow_loads: int = 0  # global load instructions narrower than 128 bits (scalars, lost vectorization)
    narrow_stores: int = 0
    ptx_widest_load_bits: int | None = None
    matrix_families: list[str] = field(default_factory=list)
    matrix_ops: dict[str, int] = field(default_factory=dict)
    tma_ops: int = 0  # TMA / bulk tensor copies (UTMALDG, UTMASTG, UTMAREDG, UBLKCP)
    setmaxnreg: int = 0  # USETMAXREG: warp specialization's register reallocation
    mma_wait_depth: int | None = None  # smallest wgmma.wait_group N in the main loop (0: serialized)
    min_mma_n: int | None = None  # smallest N of any matrix instruction
    loop_barriers: int | None = None  # block-wide barriers per main-loop iteration
    row_pass_barriers: int | None = None  # block-wide barriers in one pass over a row (no matrix instructions)
    narrow_lds_ops: int = 0  # AMD 8/16-bit LDS reads and writes
    lds_read_widths: dict[str, int] = field(default_factory=dict)  # AMD bits per lane -> LDS read instructions
    lds_write_widths: dict[str, int] = field(default_factory=dict)
    mfma_shapes: list[str] = field(default_factory=list)  # AMD MFMA/WMMA "MxNxK"
    consumer_warpgroups: int | None = None  # warp-specialized: warpgroups of the block less the producer's
    pingpong: bool | None = None  # main loop waits on one named barrier, arrives on another (warpgroups alternate)
    loop_mask_ops: int | None = None  # -INF selects and their compares in the main loop (0: an unmasked loop)
    mma_overlap_depth: int | None = None  # largest wgmma.wait_group N in the main loop (>= 1: math under a wgmma)
    occupancy: float = 0.0  # fraction of the target's maximum resident warps (SM) / waves (SIMD)
    active: float = 0.0  # resident warps per SM (NVIDIA) or waves per SIMD (AMD)
    occupancy_unit: str = ""
    occupancy_limiter: str = ""
    divisible_args: list[str] = field(default_factory=list)
    signature: dict[str, str] = field(default_factory=dict)
    compile_s: float = 0.0  # CPU wall time of the compile: not a performance figure

    @property
    def key(self) -> str:
        return f"{self.op}/{self.mode}/{self.case}/{self.kernel}@{self.target}"

    @property
    def spills(self) -> bool:
        return self.spill_bytes > 0 or self.spill_count > 0

    @property
    def regs_text(self) -> str:
        """Registers as the terminal shows them: NVIDIA's count; AMD's VGPRs, SGPRs and AGPRs ("128v 40s 64a")."""
        if self.sgprs is None:
            return str(self.regs)
        return f"{self.regs}v {self.sgprs}s" + (f" {self.agprs}a" if self.agprs else "")

    @property
    def occupancy_text(self) -> str:
        """Occupancy and what limits it, as the terminal shows them ("19% regs", "100% max")."""
        return f"{self.occupancy:.0%} {_LIMITER.get(self.occupancy_limiter, self.occupancy_limiter)}".strip()

    def as_dict(self) -> dict:
        return asdict(self) | {"key": self.key, "spills": self.spills}


@dataclass
class InspectReport:
    SCHEMA: ClassVar[str] = SCHEMA

    rows: list[KernelRow]
    targets: list[str]
    dtype: str
    versions: dict[str, str | None]

    @property
    def failed(self) -> list[KernelRow]:
        return [r for r in self.rows if not r.ok]

    def as_dict(self) -> dict:
        return {"schema": SCHEMA, "dtype": self.dtype, "targets": self.targets, "versions": self.versions,
                "n_rows": len(self.rows), "n_failed": len(self.failed), "rows": [r.as_dict() for r in self.rows]}

    @classmethod
    def from_dict(cls, d: dict) -> InspectReport:
        if d.get("schema") != SCHEMA:
            raise ValueError(f"not an inspect document: schema {d.get('schema')!r}, expected {SCHEMA!r}")
        return cls([decode(KernelRow, r) for r in d["rows"]], list(d["targets"]), d["dtype"], d.get("versions", {}))


@dataclass
class KernelSummary:
    """One kernel on one target over several rows (an op's cases, or one case): each figure its worst case."""

    op: str
    mode: str
    case: str | None  # None: over every case of the op
    kernel: str  # the name without a leading "_" and a trailing "_kernel"
    target: str
    rows: list[KernelRow]

    @property
    def ok(self) -> list[KernelRow]:
        return [r for r in self.rows if r.ok]

    def worst(self, attr: str, most: bool = True) -> KernelRow:
        return (max if most else min)(self.ok, key=lambda r: getattr(r, attr))

    @property
    def wait_depth(self) -> int | None:
        depths = [r.mma_wait_depth for r in self.ok if r.mma_wait_depth is not None]
        return min(depths) if depths else None


#: What the terminal table's columns and its "-" mean (wavefront inspect).
LEGEND = ("-: none (ld/st: no plain global load/store, e.g. TMA moves the data; mma: no matrix instruction; wait: no "
          "wgmma main loop). occ: resident warps per SM (NVIDIA) or waves per SIMD (AMD) as a share of the most, and "
          "its limiter; ld/st: widest global load/store in bits (yellow: under 128); tma: TMA/bulk-copy instructions; "
          "nreg: setmaxnreg (warp specialization); wait: smallest wgmma wait depth in the main loop (0: serialized).")


def short_kernel_name(name: str) -> str:
    base, _, again = name.partition("#")
    return base.lstrip("_").removesuffix("_kernel") + (f"#{again}" if again else "")


def summarize(report: InspectReport, per_case: bool = False) -> list[KernelSummary]:
    """The report's rows grouped by op, mode, kernel and target (and case with `per_case`), in report order."""
    groups: dict[tuple, KernelSummary] = {}
    for r in report.rows:
        key = (r.op, r.mode, r.case if per_case else None, short_kernel_name(r.kernel), r.target)
        groups.setdefault(key, KernelSummary(*key, []))
        groups[key].rows.append(r)
    first: dict[tuple, int] = {}  # each op, mode (and case) together, in the order it first appears
    for i, k in enumerate(groups.values()):
        first.setdefault((k.op, k.mode, k.case), i)
    return sorted(groups.values(), key=lambda k: first[(k.op, k.mode, k.case)])


def versions() -> dict[str, str | None]:
    import triton  # lazy: Triton-free import

    return {"triton": triton.__version__, "torch": torch.__version__, "python": platform.python_version()}


# ---------------------------------------------------------------------------------------------------
# Launch -> compile job.


def _range_bytes(t: TensorArg) -> int:
    if any(s == 0 for s in t.shape):
        return 0
    itemsize = torch.empty((), dtype=t.dtype).element_size()
    return (sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride, strict=True)) + 1) * itemsize


def _proxy(arg: Any) -> Any:
    if isinstance(arg, TensorArg):
        return TensorProxy(arg.dtype, arg.data_ptr, _range_bytes(arg))
    return arg


def job_for(launch: Launch, target: str, keep_asm: bool = False, frontend_only: bool = False) -> CompileJob:
    """The compile job that reproduces `launch`'s specialization on `target`."""
    fn = getattr(launch.kernel, "fn", launch.kernel)
    module = fn.__module__
    file = getattr(fn, "__code__", None)
    return CompileJob(module=module, qualname=fn.__qualname__, file=file.co_filename if file else "",
                      args=tuple(_proxy(a) for a in launch.args),
                      constexprs=tuple(sorted(launch.constexprs.items())),
                      options=tuple(sorted(launch.options.items())), target=target, keep_asm=keep_asm,
                      frontend_only=frontend_only)


def specialization_key(job: CompileJob) -> tuple:
    """Two jobs with equal keys compile to the same binary: Triton's own per-argument specialization."""
    from triton._C.libtriton import native_specialize_impl  # lazy: Triton-free import
    from triton.compiler.compiler import make_backend  # lazy: Triton-free import

    backend = type(make_backend(gpu_target(job.target)))
    spec = tuple(native_specialize_impl(backend, a, False, True, True) if a is not None else None
                 for a in job.args)
    return (job.module, job.qualname, job.target, spec, repr(job.constexprs), job.options, job.frontend_only)


# ---------------------------------------------------------------------------------------------------
# Compile pool: worker processes with the interpreter off; results cached for the process's lifetime.

_POOL: WorkerPool | None = None
_CACHE: dict[tuple, CompileResult] = {}


def _pool(workers: int) -> WorkerPool:
    global _POOL
    if _POOL is None or _POOL.n != workers:
        if _POOL is not None:
            _POOL.close()
        _POOL = WorkerPool(workers)
    return _POOL


@atexit.register
def _shutdown_pool() -> None:
    if _POOL is not None:
        _POOL.close()


def default_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def compile_jobs(jobs: Iterable[CompileJob], workers: int | None = None,
                 on_done: Callable[[CompileJob, CompileResult], None] | None = None) -> dict[tuple, CompileResult]:
    """Compile every distinct specialization once (cached across calls); results by specialization key."""
    by_key: dict[tuple, CompileJob] = {}
    for job in jobs:
        by_key.setdefault(specialization_key(job), job)
    results = {k: _CACHE[k] for k in by_key if k in _CACHE and (not by_key[k].keep_asm or _CACHE[k].asm)}
    todo = {k: j for k, j in by_key.items() if k not in results}
    for k in results:
        if on_done:
            on_done(by_key[k], results[k])
    if todo:
        pool = _pool(workers or default_workers())
        with cf.ThreadPoolExecutor(max_workers=pool.n) as threads:
            futures = {threads.submit(pool.compile, j): k for k, j in todo.items()}
            for fut in cf.as_completed(futures):
                k, res = futures[fut], fut.result()
                _CACHE[k] = results[k] = res
                if on_done:
                    on_done(todo[k], res)
    return results


# ---------------------------------------------------------------------------------------------------
# The registry x cases x modes x targets walk.


@dataclass(frozen=True)
class _Planned:
    spec: OpSpec
    case: Case
    mode: str
    kernel: str
    target: str
    launch: Launch
    job: CompileJob
    key: tuple


def _distinct_launches(launches: list[Launch], target: str, keep_asm: bool) -> list[tuple[str, Launch, CompileJob]]:
    """One (label, launch, job) per distinct compiled kernel of a mode: a launch that compiles to the same
    specialization as an earlier one (the chunks of a chunked op, say) adds no row. A kernel that appears
    again with another specialization is labelled name#2, name#3, ..."""
    seen_keys: set[tuple] = set()
    count: dict[str, int] = {}
    out = []
    for la in launches:
        job = job_for(la, target, keep_asm)
        key = specialization_key(job)
        if key in seen_keys:
            continue
        seen_keys.add(key)
        count[la.name] = count.get(la.name, 0) + 1
        out.append((la.name if count[la.name] == 1 else f"{la.name}#{count[la.name]}", la, job))
    return out


def plan(specs: Iterable[OpSpec], targets: Iterable[str], dtype: torch.dtype, keep_asm: bool = False,
         cases: Callable[[OpSpec], Iterable[Case]] | None = None,
         transform: Callable[[Launch], Launch] | None = None) -> list[_Planned]:
    """Record every launch per target (cheap, nothing runs) and build its compile job.

    transform: applied to each recorded launch before compiling (tests use it to plant regressions).
    """
    planned = []
    for target in targets:
        n_sms = gpu_for_target(target).sm_count
        for spec in specs:
            for case in (cases(spec) if cases else spec.bench_cases):
                if not spec.supports(case, runtime.get_arch(target)):
                    continue  # FP8 on Ampere, FNUZ off gfx942: no rows, not failures
                with runtime.assume_target(target, n_sms):
                    captured = capture(spec, case, dtype, execute=False, cheap=True)
                for mode, launches in captured.launches.items():
                    if transform is not None:
                        launches = [transform(la) for la in launches]
                    for label, la, job in _distinct_launches(launches, target, keep_asm):
                        planned.append(_Planned(spec, case, mode, label, target, la, job, specialization_key(job)))
                for variant in variants_for(spec, target, case):
                    with runtime.assume_target(target, n_sms):
                        launches = capture_variant(spec, case, dtype, variant)
                    if transform is not None:
                        launches = [transform(la) for la in launches]
                    for label, la, job in _distinct_launches(launches, target, keep_asm):
                        planned.append(_Planned(spec, case, variant.mode, label, target, la, job,
                                                specialization_key(job)))
    return planned


def _row(p: _Planned, res: CompileResult, dtype: torch.dtype) -> KernelRow:
    row = KernelRow(op=p.spec.name, mode=p.mode, case=p.case.name, dtype=dtype_name(dtype), kernel=p.kernel,
                    target=p.target, grid=list(p.launch.grid), ok=res.ok, error=res.error,
                    compile_s=round(res.compile_s, 3))
    if not res.ok or res.code is None:
        return row
    code: MachineCode = res.code
    row.num_warps, row.threads_per_block = res.num_warps, res.threads_per_block
    row.regs, row.sgprs, row.agprs = code.regs, code.sgprs, code.agprs
    row.spill_bytes, row.spill_count = code.spill_bytes, code.spill_count
    arch = runtime.get_arch(p.target)
    static = code.static_shared_bytes
    row.shared_bytes = res.shared_bytes + (max(static, arch.reserved_shared_mem_per_block)
                                           if arch.family == "nvidia" else static)
    row.widest_load_bits, row.widest_store_bits = code.widest_load_bits, code.widest_store_bits
    row.load_widths = {str(k): v for k, v in sorted(code.load_widths.items())}
    row.store_widths = {str(k): v for k, v in sorted(code.store_widths.items())}
    row.narrow_loads = sum(n for bits, n in code.load_widths.items() if bits < NARROW_BITS)
    row.narrow_stores = sum(n for bits, n in code.store_widths.items() if bits < NARROW_BITS)
    row.ptx_widest_load_bits = max(res.ptx_load_widths, default=0) if arch.family == "nvidia" else None
    row.matrix_families, row.matrix_ops = code.matrix_families, dict(sorted(code.matrix_ops.items()))
    row.tma_ops, row.setmaxnreg = code.tma_ops, code.setmaxnreg
    row.mma_wait_depth, row.min_mma_n, row.loop_barriers = code.mma_wait_depth, code.min_mma_n, code.loop_barriers
    row.row_pass_barriers = code.row_pass_barriers
    row.narrow_lds_ops, row.mfma_shapes = code.narrow_lds_ops, list(code.mfma_shapes)
    row.consumer_warpgroups, row.pingpong = code.consumer_warpgroups, code.pingpong
    row.loop_mask_ops, row.mma_overlap_depth = code.loop_mask_ops, code.mma_overlap_depth
    row.lds_read_widths = {str(k): v for k, v in sorted(code.lds_read_widths.items())}
    row.lds_write_widths = {str(k): v for k, v in sorted(code.lds_write_widths.items())}
    occ = occupancy(arch, threads_per_block=res.threads_per_block, regs_per_thread=code.regs,
                    shared_bytes=res.shared_bytes, static_shared_bytes=static, sgprs=code.sgprs or 0)
    row.occupancy, row.active = round(occ.fraction, 4), occ.active
    row.occupancy_unit, row.occupancy_limiter = occ.unit, occ.limiter
    row.divisible_args, row.signature = res.divisible_args, res.signature
    return row


def inspect_ops(ops: Iterable[str] | None = None, targets: Iterable[str] = runtime.DEFAULT_TARGETS,
                dtype: torch.dtype = torch.bfloat16, *, workers: int | None = None,
                asm_dir: str | Path | None = None,
                on_progress: Callable[[int, int, str], None] | None = None,
                cases: Callable[[OpSpec], Iterable[Case]] | None = None,
                transform: Callable[[Launch], Launch] | None = None) -> InspectReport:
    """Inspect the registry (or the named ops) on `targets`; see the module docstring.

    asm_dir: also write each compiled kernel's PTX/SASS or AMDGCN there.
    on_progress(done, total, what): called as compiles finish.
    """
    targets = list(targets)
    for t in targets:
        arch = runtime.get_arch(t)
        if arch.family == "cpu":
            raise ValueError(f"targets: {t!r} is not a GPU target; choose from {', '.join(runtime.DEFAULT_TARGETS)}")
    names = list(ops) if ops else list(REGISTRY)
    specs = [REGISTRY[n] if n in REGISTRY else _unknown_op(n) for n in names]
    planned = plan(specs, targets, dtype, keep_asm=asm_dir is not None, cases=cases, transform=transform)
    distinct = {p.key: p.job for p in planned}
    done = 0

    def progress(job: CompileJob, res: CompileResult) -> None:
        nonlocal done
        done += 1
        if on_progress:
            on_progress(done, len(distinct), f"{job.qualname.split('.')[-1]}@{job.target}")

    results = compile_jobs(distinct.values(), workers, progress)
    rows = [_row(p, results[p.key], dtype) for p in planned]
    if asm_dir is not None:
        _write_asm(Path(asm_dir), results, planned, rows)
    rows.sort(key=lambda r: (names.index(r.op), r.mode, r.case, r.kernel, targets.index(r.target)))
    return InspectReport(rows, targets, dtype_name(dtype), versions())


def _unknown_op(name: str):
    raise ValueError(f"unknown op {name!r}; registered ops: {', '.join(sorted(REGISTRY))}")


def _write_asm(root: Path, results: dict[tuple, CompileResult], planned: list[_Planned],
               rows: list[KernelRow]) -> None:
    """One file per distinct compiled kernel and listing (ptx, sass, resources, amdgcn), and index.json:
    file stem -> the row keys compiled from it."""
    root.mkdir(parents=True, exist_ok=True)
    stems: dict[tuple, str] = {}
    for i, (key, res) in enumerate(sorted(results.items(), key=lambda kv: repr(kv[0]))):
        stems[key] = f"{res.kernel}.{res.target}.{i:03d}"
        for ext, text in res.asm.items():
            (root / f"{stems[key]}.{ext}").write_text(text)
    index: dict[str, list[str]] = {}
    for p, row in zip(planned, rows, strict=True):
        index.setdefault(stems[p.key], []).append(row.key)
    (root / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
