"""Collective benchmark on torch.distributed (nccl/rccl on GPUs, gloo on CPUs), checked and fitted.

Runs inside every rank of an initialised process group (torchrun, or `spawn_local`). For each collective,
group size and message size S (the nccl-tests S of comm_fit, rounded down to a multiple of n x element
size), every rank:

1. runs the collective once on patterned data and checks the result exactly (small integers, exact in
   every dtype: each rank contributes rank-dependent values, the expected output is known in closed form);
2. warms up, then times `repeats` blocks of `iters` back-to-back operations (device synchronised at the
   block edges, allocation outside the timed region), per-operation time = block time / iters;
3. takes the maximum over ranks of each block (a collective is done when its slowest rank is) and reports
   the median and minimum block, algbw and busbw (nccl-tests conventions).

Groups: a group size g < world size splits the ranks into world/g groups of consecutive ranks that run
at the same time (as tensor-parallel groups do). In-place means the input is a slice of the output
(all_gather) or the output a slice of the input (reduce_scatter); torch's all_reduce and broadcast are
in-place only, all_to_all_single and send/recv out-of-place only. A collective the backend lacks is
recorded as unsupported with the backend's message, never timed or faked.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import ClassVar

import torch
import torch.distributed as dist

from wavefront.workbench.distributed.launch import init_process_group
from wavefront.workbench.document import encode
from wavefront.workbench.planner.comm_model import (
    COLLECTIVES,
    AlphaBeta,
    Calibration,
    algbw_gbps,
    bus_factor,
    fit_alpha_beta,
    save_calibration,
)

MODES = {"all_reduce": ("in-place",), "broadcast": ("in-place",), "all_gather": ("in-place", "out-of-place"),
         "reduce_scatter": ("in-place", "out-of-place"), "all_to_all": ("out-of-place",),
         "send_recv": ("out-of-place",)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}


@dataclass(frozen=True)
class CommResult:
    collective: str
    mode: str
    group_size: int
    size_bytes: int  # nccl-tests S
    count: int  # elements per rank in the input buffer
    dtype: str
    time_us: float  # median over blocks of the slowest rank's per-operation time
    time_us_min: float
    algbw_gbps: float
    busbw_gbps: float
    correct: bool


def sizes_pow2(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of two from min_bytes up to max_bytes (both rounded to powers of two)."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ValueError(f"need 1 <= min_bytes <= max_bytes, got {min_bytes}, {max_bytes}")
    out, s = [], 1 << max(0, (min_bytes - 1).bit_length())
    while s <= max_bytes:
        out.append(s)
        s <<= 1
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _resolve(name: str):
    """torch 2.13 renamed the tensor collectives (*_single); older releases have *_into_tensor."""
    table = {"all_gather": ("all_gather_single", "all_gather_into_tensor"),
             "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor")}
    for attr in table[name]:
        fn = getattr(dist, attr, None)
        if fn is not None:
            return fn
    raise RuntimeError(f"torch.distributed has none of {table[name]}")


def _pattern(n_elems: int, offset: float, device, dtype, scale: float = 1.0) -> torch.Tensor:
    """scale * (i mod 3) + offset, built in float64 and cast: small integers, which 16-bit types hold
    exactly after summing over a few ranks (expected values are cast the same way before comparing)."""
    return ((torch.arange(n_elems, device=device) % 3).to(torch.float64) * scale + offset).to(dtype)


class _Case:
    """Buffers and the operation for one (collective, mode, size) on one rank."""

    def __init__(self, collective: str, mode: str, size_bytes: int, dtype, device, group, group_ranks: list[int]):
        self.collective, self.mode, self.group = collective, mode, group
        self.n = len(group_ranks)
        self.ranks = group_ranks
        self.me = group_ranks.index(dist.get_rank())
        elem = torch.empty((), dtype=dtype).element_size()
        per = max(1, size_bytes // (elem * self.n))
        self.full = per * self.n  # elements of the nccl-tests S for the n-way collectives
        if collective in ("all_reduce", "broadcast", "send_recv") or collective == "all_to_all":
            self.count, self.size_bytes = self.full, self.full * elem
        else:
            self.count = per if collective == "all_gather" else self.full
            self.size_bytes = self.full * elem
        self.per, self.dtype, self.device = per, dtype, device
        self.fill()

    def fill(self) -> None:
        n, per, me, dt, dev = self.n, self.per, self.me, self.dtype, self.device
        c = self.collective
        if c == "all_reduce":
            self.inp = _pattern(self.full, me + 1, dev, dt)
        elif c == "broadcast":
            self.inp = _pattern(self.full, 1, dev, dt) if me == 0 else torch.zeros(self.full, device=dev, dtype=dt)
        elif c == "all_gather":
            self.out = torch.zeros(self.full, device=dev, dtype=dt)
            in_place = self.mode == "in-place"
            self.inp = self.out[me * per:(me + 1) * per] if in_place else torch.empty(per, device=dev, dtype=dt)
            self.inp.copy_(_pattern(per, me + 1, dev, dt))
        elif c == "reduce_scatter":
            chunks = [_pattern(per, me + 1 + k, dev, dt) for k in range(n)]
            self.inp = torch.cat(chunks)
            in_place = self.mode == "in-place"
            self.out = self.inp[me * per:(me + 1) * per] if in_place else torch.empty(per, device=dev, dtype=dt)
        elif c == "all_to_all":
            self.inp = torch.cat([_pattern(per, me * n + k + 1, dev, dt) for k in range(n)])
            self.out = torch.empty(self.full, device=dev, dtype=dt)
        else:  # send_recv: a ring, as nccl-tests sendrecv does
            self.inp = _pattern(self.full, me + 1, dev, dt)
            self.out = torch.empty(self.full, device=dev, dtype=dt)

    def run(self) -> None:
        c, g = self.collective, self.group
        if c == "all_reduce":
            dist.all_reduce(self.inp, group=g)
        elif c == "broadcast":
            dist.broadcast(self.inp, src=self.ranks[0], group=g)
        elif c == "all_gather":
            _resolve("all_gather")(self.out, self.inp, group=g)
        elif c == "reduce_scatter":
            _resolve("reduce_scatter")(self.out, self.inp, group=g)
        elif c == "all_to_all":
            dist.all_to_all_single(self.out, self.inp, group=g)
        else:
            nxt, prv = self.ranks[(self.me + 1) % self.n], self.ranks[(self.me - 1) % self.n]
            ops = [dist.P2POp(dist.isend, self.inp, nxt, g), dist.P2POp(dist.irecv, self.out, prv, g)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()

    def check(self) -> bool:
        n, per, me, dt, dev = self.n, self.per, self.me, self.dtype, self.device
        c = self.collective
        if c == "all_reduce":
            expect = _pattern(self.full, n * (n + 1) / 2, dev, dt, scale=n)
            got = self.inp
        elif c == "broadcast":
            expect, got = _pattern(self.full, 1, dev, dt), self.inp
        elif c == "all_gather":
            expect = torch.cat([_pattern(per, j + 1, dev, dt) for j in range(n)])
            got = self.out
        elif c == "reduce_scatter":
            expect = _pattern(per, n * (n + 1) / 2 + n * me, dev, dt, scale=n)
            got = self.out
        elif c == "all_to_all":
            expect = torch.cat([_pattern(per, j * n + me + 1, dev, dt) for j in range(n)])
            got = self.out
        else:
            expect, got = _pattern(self.full, (me - 1) % n + 1, dev, dt), self.out
        return bool(torch.equal(got.to(torch.float64), expect.to(torch.float64)))


def _groups(world: int, group_size: int) -> list[list[int]]:
    if group_size < 1 or world % group_size:
        raise ValueError(f"group size {group_size} must divide the world size {world}")
    return [list(range(i, i + group_size)) for i in range(0, world, group_size)]


def _slowest(values_s: list[float], device) -> list[float]:
    t = torch.tensor(values_s, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def bench_case(collective: str, mode: str, size_bytes: int, *, group_size: int, dtype: str = "fp32",
               warmup: int = 3, iters: int = 10, repeats: int = 3, device: torch.device | None = None,
               groups_cache: dict | None = None) -> CommResult:
    """Check and time one case on every rank of the default group (all ranks must call it together)."""
    if collective not in COLLECTIVES:
        raise ValueError(f"collective must be one of {COLLECTIVES}, got {collective!r}")
    if mode not in MODES[collective]:
        raise ValueError(f"{collective} supports {MODES[collective]} in torch.distributed, not {mode!r}")
    device = device or torch.device("cpu")
    world = dist.get_world_size()
    cache = groups_cache if groups_cache is not None else {}
    if group_size not in cache:
        # new_group is collective: every rank creates every group, in the same order.
        made = [(ranks, dist.new_group(ranks) if group_size < world else None) for ranks in _groups(world, group_size)]
        cache[group_size] = made
    ranks, group = next((r, g) for r, g in cache[group_size] if dist.get_rank() in r)
    case = _Case(collective, mode, size_bytes, DTYPES[dtype], device, group, ranks)
    case.run()
    _sync(device)
    ok = case.check()
    ok = bool(_slowest([0.0 if ok else 1.0], device)[0] == 0.0)
    for _ in range(warmup):
        case.run()
    _sync(device)
    blocks = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            case.run()
        _sync(device)
        blocks.append((time.perf_counter() - t0) / iters)
    blocks = _slowest(blocks, device)
    t_med, t_min = statistics.median(blocks), min(blocks)
    alg = algbw_gbps(case.size_bytes, t_med)
    return CommResult(collective, mode, group_size, case.size_bytes, case.count, dtype, t_med * 1e6, t_min * 1e6,
                      alg, alg * bus_factor(collective, group_size), ok)


def probe_support(collective: str, mode: str, *, group_size: int, dtype: str, device, groups_cache: dict) -> str | None:
    """None if the backend runs the collective; else the backend's error, on every rank alike."""
    err = ""
    try:
        bench_case(collective, mode, 64, group_size=group_size, dtype=dtype, warmup=0, iters=1, repeats=1,
                   device=device, groups_cache=groups_cache)
    except (RuntimeError, NotImplementedError, ValueError) as exc:
        err = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return err or None


@dataclass
class BenchReport:
    results: list[CommResult]
    fits: list[AlphaBeta]
    unsupported: dict[str, str]
    failures: list[str]  # cases whose result was wrong


def run_benchmark(collectives: Sequence[str], sizes: Sequence[int], *, group_sizes: Sequence[int],
                  modes: Sequence[str] = ("in-place", "out-of-place"), dtype: str = "fp32", warmup: int = 3,
                  iters: int = 10, repeats: int = 3, device: torch.device | None = None,
                  progress: Callable[[str], None] | None = None) -> BenchReport:
    """Every (collective, supported mode, group size, size); fits alpha-beta per (collective, group size)
    on the timings of its first supported mode. Results gathered so far are kept if a case raises."""
    device = device or torch.device("cpu")
    cache: dict = {}
    results: list[CommResult] = []
    unsupported: dict[str, str] = {}
    failures: list[str] = []
    fits: list[AlphaBeta] = []
    for coll in collectives:
        coll_modes = [m for m in MODES[coll] if m in modes] or [MODES[coll][0]]
        for g in group_sizes:
            if g < 2 and coll == "send_recv":
                continue  # a ring of one rank would send to itself
            err = probe_support(coll, coll_modes[0], group_size=g, dtype=dtype, device=device, groups_cache=cache)
            if err:
                unsupported[coll] = f"{dist.get_backend()} with {dtype}: {err}"
                break
            for mode in coll_modes:
                timed = []
                for size in sizes:
                    if progress:
                        progress(f"{coll} {mode} n={g} {size} B")
                    res = bench_case(coll, mode, size, group_size=g, dtype=dtype, warmup=warmup, iters=iters,
                                     repeats=repeats, device=device, groups_cache=cache)
                    results.append(res)
                    if not res.correct:
                        failures.append(f"{coll} {mode} n={g} {res.size_bytes} B")
                    timed.append(res)
                if mode == coll_modes[0] and g >= 2 and len({r.size_bytes for r in timed}) >= 2:
                    sizes, times_s = [r.size_bytes for r in timed], [r.time_us * 1e-6 for r in timed]
                    fits.append(fit_alpha_beta(coll, g, sizes, times_s))
    return BenchReport(results, fits, unsupported, failures)


def runtime_info(device: torch.device) -> dict:
    """Where the benchmark ran: backend, device, world, node layout (for the calibration's domain)."""
    world = dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = "cpu"
    return {"backend": dist.get_backend(), "device": name, "world_size": world, "local_world_size": local,
            "domain": "intra" if local >= world else "inter", "torch_version": torch.__version__,
            "cpu_note": "CPU gloo timings: a correctness and method check, not a GPU or network figure"
            if device.type == "cpu" else ""}


#: The JSON document of a collective benchmark (:meth:`CommJobResult.as_dict`); docs/json/comm.md.
SCHEMA = "wavefront.comm/1"
CPU_NOTE = "CPU gloo: timings check the method on this machine; not a GPU or network performance figure."
MODE_CHOICES = ("in-place", "out-of-place", "both")
BACKENDS = ("auto", "nccl", "gloo")


@dataclass(frozen=True)
class CommRequest:
    """What ``wavefront comm`` measures; :meth:`validate` names the first bad field as its option."""

    ops: tuple[str, ...] = COLLECTIVES
    min_bytes: int = 8
    max_bytes: int | None = None  # None: 1 GiB on a GPU, 4 MiB on a CPU; capped at a quarter of free memory
    mode: str = "both"
    dtype: str = "fp32"
    group_sizes: tuple[int, ...] | None = None  # None: the powers of two dividing the world size, and the world
    warmup: int = 3
    iters: int = 10
    repeats: int = 3
    backend: str = "auto"
    calibration: str | None = "comm-calibration.json"  # where the alpha-beta fit is saved for the planner

    def validate(self, world: int | None = None) -> None:
        """Raise ValueError naming the option; with `world` (the launch's size), also the group sizes."""
        unknown = [op for op in self.ops if op not in COLLECTIVES]
        if unknown or not self.ops:
            raise ValueError(f"--op: unknown collective {unknown[0] if unknown else ''!r}; known: "
                             f"{', '.join(COLLECTIVES)}")
        if self.mode not in MODE_CHOICES or self.dtype not in DTYPES or self.backend not in BACKENDS:
            raise ValueError(f"--mode/--dtype/--backend: got {self.mode!r}/{self.dtype!r}/{self.backend!r}")
        if self.min_bytes < 1 or (self.max_bytes is not None and self.max_bytes < self.min_bytes):
            raise ValueError(f"need 1 <= --min-bytes <= --max-bytes, got {self.min_bytes}, {self.max_bytes}")
        if self.warmup < 0 or self.iters < 1 or self.repeats < 1:
            raise ValueError("--warmup must be >= 0, --iters and --repeats >= 1")
        if self.group_sizes is not None and min(self.group_sizes, default=2) < 1:
            raise ValueError(f"--group-size must be >= 1, got {min(self.group_sizes)}")
        if world is not None:
            self.groups(world)

    def groups(self, world: int) -> list[int]:
        """The group sizes to run at this world size (ranks per group, >= 2, dividing the world)."""
        pow2 = {g for g in (2 ** k for k in range(1, world.bit_length())) if world % g == 0}
        groups = [g for g in (self.group_sizes or sorted(pow2 | {world})) if g >= 2]
        if not groups:
            raise ValueError("collectives need at least 2 ranks (world size is 1)")
        for g in groups:
            if world % g:
                raise ValueError(f"--group-size {g} does not divide the world size {world}")
        return groups


@dataclass
class CommJobResult:
    runtime: dict
    config: dict
    report: BenchReport
    calibration: str | None
    notes: list[str]

    SCHEMA: ClassVar[str] = SCHEMA

    def as_dict(self) -> dict:
        """The ``wavefront comm --json`` document."""
        return {"schema": SCHEMA, "runtime": self.runtime, "config": self.config, **encode(self.report),
                "calibration": self.calibration}


def _memory_cap_bytes(device: torch.device, world: int) -> int:
    """Largest S worth trying: a quarter of the free memory per rank (the buffers need about 2 x S)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free // 4)
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        avail = 1 << 30
    return int(avail // (4 * max(1, world)))


def _plan(request: CommRequest, device: torch.device, world: int, notes: list[str]) -> tuple[list[int], list[int]]:
    max_bytes = request.max_bytes or (1 << 30 if device.type == "cuda" else 4 << 20)
    cap = _memory_cap_bytes(device, world)
    if max_bytes > cap:
        notes.append(f"--max-bytes {max_bytes} exceeds a quarter of free memory; using {cap}")
    return sizes_pow2(request.min_bytes, min(max_bytes, cap)), request.groups(world)


def _ticker(on_progress: Callable[[int, int, str], None], total: int) -> Callable[[str], None]:
    done = [0]

    def tick(what: str) -> None:
        done[0] += 1
        on_progress(done[0], total, what)

    return tick


def run(request: CommRequest, on_progress: Callable[[int, int, str], None] | None = None) -> CommJobResult | None:
    """Run the benchmark on this rank of a launched job (wavefront.workbench.distributed.launch): every rank
    calls it; rank 0 gets the result (and saves the calibration), the others None. Rank 0 reports
    `on_progress(done, total, what)` once per case. Raises ValueError for a plan the world size cannot run."""
    request.validate()
    device = init_process_group(request.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    notes: list[str] = []
    try:
        sizes, groups = _plan(request, device, world, notes)
        modes = ("in-place", "out-of-place") if request.mode == "both" else (request.mode,)
        per_op = sum(len([m for m in MODES[c] if m in modes] or [1]) for c in request.ops)
        tick = _ticker(on_progress, per_op * len(groups) * len(sizes)) if on_progress and rank == 0 else None
        report = run_benchmark(request.ops, sizes, group_sizes=groups, modes=modes, dtype=request.dtype,
                               warmup=request.warmup, iters=request.iters, repeats=request.repeats, device=device,
                               progress=tick)
        info = runtime_info(device)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return None
    if request.calibration:
        cal = Calibration(info["backend"], info["device"], world, info["domain"],
                          datetime.now(timezone.utc).isoformat(timespec="seconds"), info["torch_version"],
                          report.fits, report.unsupported, CPU_NOTE if device.type == "cpu" else "")
        save_calibration(cal, request.calibration)
        notes.append(f"calibration ({info['domain']}-node, {len(report.fits)} fits) -> {request.calibration}")
    if device.type == "cpu":
        notes.append(CPU_NOTE)
    config = {"ops": list(request.ops), "sizes_bytes": sizes, "group_sizes": groups, "mode": request.mode,
              "dtype": request.dtype, "warmup": request.warmup, "iters": request.iters, "repeats": request.repeats}
    return CommJobResult(info, config, report, request.calibration, notes)
