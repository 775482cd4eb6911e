"""Compute/communication overlap: a concurrency probe and the DDP gradient-bucket experiment.

Probe: a compute loop (matmuls) and an asynchronous collective, timed alone and together:

    exposed comm        = t(both) - t(compute)          (what the collective adds to the compute)
    overlap efficiency  = (t(compute) + t(comm) - t(both)) / min(t(compute), t(comm))
                          1 = the shorter one is fully hidden, 0 = they serialise

DDP buckets: DistributedDataParallel all-reduces gradients in buckets of bucket_cap_mb, each launched
when its last gradient is ready, so only what is still running after the backward is exposed. We measure
it on a proxy model with a preset's layer structure (every matrix dimension divided by `shrink`) as
t(step) - t(step under no_sync()), and predict it with `predict_ddp_exposed`: gradients become ready in
reverse parameter order at a rate proportional to their size over the measured backward time; buckets
follow DDP's assignment (reverse order, a first bucket of 1 MiB where this torch uses one, then
bucket_cap_mb; `ddp_buckets` reproduces torch's own assignment, which the tests check); bucket i
starts at max(ready_i, end_{i-1}) and lasts alpha + 2(n-1)/n * bytes / busbw (the all-reduce fit of
`wavefront comm`); exposed = max(0, end_last - t_backward). The planner uses the closed form of the same
model (time.py): exposed = max(t_reduce - t_backward, t_last_bucket).

On a CPU the collective and the compute share the cores (gloo runs in its own threads): the numbers show
the method and the model's bookkeeping, not GPU overlap, and are labelled so.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.distributed as dist
from torch import nn

from wavefront.shapes import ModelDims, get_model
from wavefront.workbench.distributed import comm
from wavefront.workbench.distributed.launch import init_process_group
from wavefront.workbench.document import encode
from wavefront.workbench.planner.comm_model import AlphaBeta

#: torch DDP's small first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES, 1 MiB).
FIRST_BUCKET_BYTES = 1024 * 1024


def ddp_first_bucket_bytes(bucket_cap_bytes: int, cap_given: bool = True) -> int:
    """The first bucket's cap in this torch: releases with DDP's _BucketCapacityConfig (2.10+) use the
    1 MiB first bucket only when bucket_cap_mb is left at its default; older ones always do."""
    import torch.nn.parallel.distributed as ddp_module  # lazy: torch submodule on use

    if hasattr(ddp_module, "_BucketCapacityConfig") and cap_given:
        return bucket_cap_bytes
    return min(FIRST_BUCKET_BYTES, bucket_cap_bytes)


@dataclass(frozen=True)
class OverlapResult:
    collective: str
    size_bytes: int
    compute_ms: float
    comm_ms: float
    both_ms: float
    exposed_comm_ms: float
    overlap_efficiency: float


def overlap_metrics(compute_s: float, comm_s: float, both_s: float) -> tuple[float, float]:
    """(exposed communication seconds, overlap efficiency in [0, 1])."""
    exposed = max(0.0, both_s - compute_s)
    shorter = min(compute_s, comm_s)
    eff = (compute_s + comm_s - both_s) / shorter if shorter > 0 else 0.0
    return exposed, min(1.0, max(0.0, eff))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _interleaved_medians(fns: dict, device, rounds: int) -> dict[str, float]:
    """Median seconds of each function, timed in turn within every round (so slow drifts of a shared
    machine hit all of them alike), then the maximum over ranks."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            dist.barrier()
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - t0)
    med = torch.tensor([statistics.median(v) for v in times.values()], dtype=torch.float64, device=device)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return dict(zip(fns, med.tolist(), strict=True))


def probe_overlap(size_bytes: int, *, matmul_n: int = 256, matmul_iters: int = 20, repeats: int = 5,
                  device: torch.device | None = None) -> OverlapResult:
    """All-reduce of size_bytes (float32) against matmul_iters n x n matmuls, on every rank."""
    device = device or torch.device("cpu")
    a = torch.randn(matmul_n, matmul_n, device=device)
    b = torch.randn(matmul_n, matmul_n, device=device)
    buf = torch.ones(max(1, size_bytes // 4), device=device)

    def compute():
        c = a
        for _ in range(matmul_iters):
            c = torch.mm(c, b) * 1e-3

    def comm():
        dist.all_reduce(buf, async_op=True).wait()

    def both():
        work = dist.all_reduce(buf, async_op=True)
        compute()
        work.wait()

    for fn in (compute, comm, both):
        fn()
    _sync(device)
    med = _interleaved_medians({"compute": compute, "comm": comm, "both": both}, device, repeats)
    t_compute, t_comm, t_both = med["compute"], med["comm"], med["both"]
    exposed, eff = overlap_metrics(t_compute, t_comm, t_both)
    return OverlapResult("all_reduce", buf.numel() * 4, t_compute * 1e3, t_comm * 1e3, t_both * 1e3, exposed * 1e3, eff)


class _ProxyLayer(nn.Module):
    """A decoder layer's weights at a preset's proportions: q, k, v, o projections (grouped KV heads
    broadcast to the query width), a gated or plain MLP, two norm weights."""

    def __init__(self, h: int, q: int, kv: int, f: int, gated: bool):
        super().__init__()
        self.norm1 = nn.Parameter(torch.ones(h))
        self.wq = nn.Linear(h, q, bias=False)
        self.wk, self.wv = nn.Linear(h, kv, bias=False), nn.Linear(h, kv, bias=False)
        self.wo = nn.Linear(q, h, bias=False)
        self.norm2 = nn.Parameter(torch.ones(h))
        self.up = nn.Linear(h, f, bias=False)
        self.gate = nn.Linear(h, f, bias=False) if gated else None
        self.down = nn.Linear(f, h, bias=False)
        self.rep = q // kv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.norm1
        k = self.wk(y).repeat_interleave(self.rep, dim=-1)
        v = self.wv(y).repeat_interleave(self.rep, dim=-1)
        x = x + self.wo(torch.tanh(self.wq(y) * k) * v)
        y = x * self.norm2
        hidden = self.up(y)
        F = torch.nn.functional
        hidden = F.silu(self.gate(y)) * hidden if self.gate is not None else F.gelu(hidden)
        return x + self.down(hidden)


def proxy_model(dims: ModelDims, *, shrink: int, n_layers: int) -> nn.Module:
    """A stack of n_layers proxy layers with every matrix dimension of `dims` divided by shrink."""
    if shrink < 1 or n_layers < 1:
        raise ValueError(f"shrink and n_layers must be >= 1, got {shrink}, {n_layers}")
    h = max(8, dims.hidden // shrink)
    kv = max(1, dims.n_kv_heads * dims.head_dim // shrink)
    q = max(kv, (dims.n_heads * dims.head_dim // shrink) // kv * kv)
    f = max(8, dims.ffn_hidden // shrink)
    return nn.Sequential(*[_ProxyLayer(h, q, kv, f, dims.gated_mlp) for _ in range(n_layers)])


def ddp_buckets(grad_bytes_in_param_order: Sequence[int], bucket_cap_bytes: int,
                first_bucket_bytes: int | None = None) -> list[list[int]]:
    """Indices of the parameters in each DDP bucket, in launch order: reverse parameter order, the
    first bucket capped at first_bucket_bytes (default: this torch's rule, ddp_first_bucket_bytes),
    the others at bucket_cap_bytes."""
    if first_bucket_bytes is None:
        first_bucket_bytes = ddp_first_bucket_bytes(bucket_cap_bytes)
    buckets, current, filled = [], [], 0
    cap = min(first_bucket_bytes, bucket_cap_bytes)
    for idx in reversed(range(len(grad_bytes_in_param_order))):
        current.append(idx)
        filled += grad_bytes_in_param_order[idx]
        if filled >= cap:
            buckets.append(current)
            current, filled, cap = [], 0, bucket_cap_bytes
    if current:
        buckets.append(current)
    return buckets


def predict_ddp_exposed(grad_bytes_in_param_order: Sequence[int], backward_s: float, bucket_cap_bytes: int,
                        all_reduce: AlphaBeta, first_bucket_bytes: int | None = None) -> float:
    """Exposed all-reduce seconds after a backward of backward_s (module docstring)."""
    total = float(sum(grad_bytes_in_param_order))
    if total <= 0:
        return 0.0
    ready_at = {}
    done = 0.0
    for idx in reversed(range(len(grad_bytes_in_param_order))):
        done += grad_bytes_in_param_order[idx]
        ready_at[idx] = backward_s * done / total
    end = 0.0
    for bucket in ddp_buckets(grad_bytes_in_param_order, bucket_cap_bytes, first_bucket_bytes):
        ready = max(ready_at[i] for i in bucket)
        size = sum(grad_bytes_in_param_order[i] for i in bucket)
        end = max(ready, end) + all_reduce.time_s(size)
    return max(0.0, end - backward_s)


@dataclass(frozen=True)
class BucketResult:
    bucket_cap_mib: float  # DDP's bucket_cap_mb argument, which torch multiplies by 1024 * 1024 (MiB)
    n_buckets: int
    step_ms: float  # forward + backward with the gradient all-reduce
    no_sync_ms: float  # the same under no_sync(): compute only
    backward_ms: float
    exposed_ms: float  # measured: step - no_sync
    predicted_exposed_ms: float | None


def ddp_bucket_sweep(dims: ModelDims, bucket_caps_mib: Sequence[float], *, shrink: int, n_layers: int,
                     tokens: int = 64, steps: int = 7, all_reduce: AlphaBeta | None = None,
                     device: torch.device | None = None) -> tuple[list[BucketResult], dict]:
    """Measured vs predicted exposed all-reduce per bucket cap (MiB, DDP's bucket_cap_mb) for a proxy of
    `dims` under DDP."""
    device = device or torch.device("cpu")
    def fresh() -> nn.Module:
        torch.manual_seed(0)  # the same weights for every bucket size
        return proxy_model(dims, shrink=shrink, n_layers=n_layers).to(device)

    params = list(fresh().parameters())
    grad_bytes = [p.numel() * p.element_size() for p in params]
    h = params[0].numel()
    x = torch.randn(tokens, h, device=device)
    out = []
    for cap in bucket_caps_mib:
        model = nn.parallel.DistributedDataParallel(fresh(), bucket_cap_mb=cap,
                                                    device_ids=[device.index] if device.type == "cuda" else None)

        def step(sync: bool, model=model) -> None:
            model.zero_grad(set_to_none=True)
            if sync:
                model(x).square().mean().backward()
            else:
                with model.no_sync():
                    model(x).square().mean().backward()

        bwd_times: list[float] = []

        def backward_only(model=model, bwd_times=bwd_times) -> None:
            model.zero_grad(set_to_none=True)
            with model.no_sync():
                loss = model(x).square().mean()
                _sync(device)
                t0 = time.perf_counter()
                loss.backward()
                _sync(device)
                bwd_times.append(time.perf_counter() - t0)

        for _ in range(2):
            step(True)
            step(False)
        med = _interleaved_medians({"sync": lambda: step(True), "no_sync": lambda: step(False),
                                    "backward": backward_only}, device, steps)
        stepped, nosync, bwd = med["sync"], med["no_sync"], statistics.median(bwd_times)
        n_buckets = len(ddp_buckets(grad_bytes, int(cap * 1024 * 1024)))
        pred = None
        if all_reduce is not None:
            pred = predict_ddp_exposed(grad_bytes, bwd, int(cap * 1024 * 1024), all_reduce) * 1e3
        out.append(BucketResult(cap, n_buckets, stepped * 1e3, nosync * 1e3, bwd * 1e3,
                                max(0.0, stepped - nosync) * 1e3, pred))
        del model
    info = {"proxy_params": sum(p.numel() for p in params), "proxy_grad_bytes": sum(grad_bytes),
            "n_tensors": len(params), "shrink": shrink, "n_layers": n_layers, "tokens": tokens}
    return out, info


#: The JSON document of the overlap probe (:meth:`OverlapJobResult.document`); docs/json/overlap.md.
#: Version 2: bucket sizes are named in MiB (``bucket_cap_mib``; version 1 said ``bucket_cap_mb``).
SCHEMA = "wavefront.overlap/2"


@dataclass(frozen=True)
class OverlapRequest:
    """What ``wavefront overlap`` measures; :meth:`validate` names the first bad field as its option."""

    size_bytes: tuple[int, ...] = (64 << 10, 1 << 20)  # all-reduce sizes for the probe
    matmul_n: int = 256
    matmul_iters: int = 20
    model: str = "llama3-8b"  # preset whose gradient sizes the DDP proxy copies
    bucket_mib: tuple[float, ...] = (0.25, 1.0, 4.0, 25.0)  # DDP bucket caps (torch's bucket_cap_mb, in MiB)
    shrink: int = 16
    layers: int = 4
    tokens: int = 64
    steps: int = 7
    backend: str = "auto"

    def validate(self, world: int | None = None) -> None:
        """Raise ValueError naming the option (`world` is accepted for symmetry with CommRequest)."""
        try:
            get_model(self.model)
        except ValueError as exc:
            raise ValueError(f"--model: {exc}") from None
        if self.backend not in ("auto", "nccl", "gloo"):
            raise ValueError(f"--backend must be auto, nccl or gloo; got {self.backend!r}")
        if not self.size_bytes or min(self.size_bytes) < 1:
            raise ValueError(f"--size-bytes values must be >= 1, got {list(self.size_bytes)}")
        if not self.bucket_mib or min(self.bucket_mib) <= 0:
            raise ValueError(f"--bucket-mib values must be > 0, got {list(self.bucket_mib)}")
        if min(self.matmul_n, self.matmul_iters, self.shrink, self.layers, self.tokens, self.steps) < 1:
            raise ValueError("--matmul-n, --matmul-iters, --shrink, --layers, --tokens and --steps must be >= 1")


@dataclass
class OverlapJobResult:
    runtime: dict
    all_reduce_fit: AlphaBeta | None
    probes: list[OverlapResult]
    model: str
    proxy: dict
    buckets: list[BucketResult]

    SCHEMA: ClassVar[str] = SCHEMA

    def as_dict(self) -> dict:
        """The ``wavefront overlap --json`` document."""
        return {"schema": SCHEMA, "runtime": self.runtime,
                "all_reduce_fit": encode(self.all_reduce_fit),
                "probes": encode(self.probes),
                "ddp": {"model": self.model, "proxy": self.proxy, "buckets": encode(self.buckets)}}


def run(request: OverlapRequest) -> OverlapJobResult | None:
    """Run the probe and the DDP bucket sweep on this rank of a launched job; rank 0 gets the result, the
    others None. The prediction uses an all-reduce fit measured first in the same job."""
    request.validate()
    device = init_process_group(request.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        fit_report = comm.run_benchmark(["all_reduce"], comm.sizes_pow2(4096, 4 << 20), group_sizes=[world],
                                        modes=("in-place",), iters=5, repeats=3, device=device)
        fit = fit_report.fits[0] if fit_report.fits else None
        probes = [probe_overlap(s, matmul_n=request.matmul_n, matmul_iters=request.matmul_iters, device=device)
                  for s in request.size_bytes]
        dims = get_model(request.model)
        buckets, proxy = ddp_bucket_sweep(dims, request.bucket_mib, shrink=request.shrink, n_layers=request.layers,
                                          tokens=request.tokens, steps=request.steps, all_reduce=fit, device=device)
        info = comm.runtime_info(device)
    finally:
        dist.destroy_process_group()
    return OverlapJobResult(info, fit, probes, dims.name, proxy, buckets) if rank == 0 else None
