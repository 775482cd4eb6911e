"""The training harness behind ``wavefront train``: one code path for a single process, DDP and FSDP2,
launched with torchrun (gloo on CPU, nccl/rccl on GPU).

``run(config)`` is called on every rank and returns a :class:`TrainResult` (data only; the CLI prints
and writes files). For each variant ("baseline" = unpatched Hugging Face, "wavefront" = patched) it
builds the model from the same seed, wraps it for the parallel plan, trains on the same batches, and
measures the KPIs of :mod:`train_kpi`. With ``--compare`` both variants run back to back in one
invocation.

Failure behaviour:

- every collective has a timeout (``--timeout``), so a dead or stuck rank ends the job instead of
  hanging it; a rank that raises exits at once, which closes its connections and makes its peers' next
  collective fail fast (torchrun also stops the remaining workers);
- each step all-reduces a status vector (loss, non-finite flag, stop flag) *before* the optimizer step,
  so a NaN/inf loss on any rank stops every rank at the same step, with the parameters untouched;
- SIGTERM (preemption, or torchrun stopping the job) is noted and honoured at the end of the current
  step: a checkpoint is written (when configured) and the run exits, to be continued with ``--resume``;
- whatever was measured before a failure is still written to the results store.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import platform
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import wavefront
from wavefront import runtime
from wavefront.kernels._launch import recording
from wavefront.patching.loss import loss_metrics
from wavefront.workbench.distributed import launch as dist_launch
from wavefront.workbench.distributed.train import checkpoint as train_checkpoint
from wavefront.workbench.distributed.train import context_parallel, pipeline, predict
from wavefront.workbench.distributed.train import expert_parallel as train_ep
from wavefront.workbench.distributed.train import fp8 as train_fp8
from wavefront.workbench.distributed.train import mesh as train_mesh
from wavefront.workbench.distributed.train import overlap as train_overlap
from wavefront.workbench.distributed.train import recompute as train_recompute
from wavefront.workbench.distributed.train import store as train_store
from wavefront.workbench.distributed.train.config import ConfigError, TrainConfig
from wavefront.workbench.distributed.train.data import Batches, load_tokens, synthetic_corpus
from wavefront.workbench.distributed.train.fp8 import enable_all_gather
from wavefront.workbench.distributed.train.kpi import (
    EnergyMeter,
    MemoryMeter,
    Peak,
    StepRecord,
    Summary,
    compare,
    device_peak,
    matmul_params,
    summarize,
)
from wavefront.workbench.distributed.train.mesh import Layout
from wavefront.workbench.distributed.train.parallelize import finish_backward, parallelize
from wavefront.workbench.distributed.train.presets import build_config, build_model

EXIT_FAILED, EXIT_CONFIG, EXIT_NONFINITE, EXIT_INTERRUPTED = 1, 2, 3, 4

#: The JSON document of a training run (:meth:`TrainResult.document`); docs/json/train.md.
SCHEMA = "wavefront.train/1"


class TrainFailure(RuntimeError):
    """The run stopped; ``exit_code`` and a one-line message for the CLI."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class VariantResult:
    variant: str
    status: str  # "ok" or why it stopped
    steps: list[StepRecord] = field(default_factory=list)
    summary: Summary | None = None
    patch_report: dict | None = None
    trace_paths: list[str] = field(default_factory=list)
    resumed_from_step: int | None = None
    history_losses: list[float] = field(default_factory=list)  # losses of steps before a resume
    notes: list[str] = field(default_factory=list)  # what the reader must know (resume fallback, skips)
    #: wavefront kernel launches per kernel in the first step's forward and backward on rank 0 (proof that the
    #: patched kernels ran, e.g. on tensor-parallel shards, instead of falling back to eager code)
    kernel_launches: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["summary"] = self.summary.as_dict() if self.summary else None
        return d


@dataclass
class TrainResult:
    run_id: str
    config: dict
    provenance: dict
    variants: list[VariantResult]
    comparison: dict | None  # wavefront vs the first variant (the reference), when both ran
    out_dir: str
    store: str | None
    comparisons: dict[str, dict] = field(default_factory=dict)  # every other variant vs the reference

    def as_dict(self) -> dict:
        return {"run_id": self.run_id, "config": self.config, "provenance": self.provenance,
                "variants": [v.as_dict() for v in self.variants], "comparison": self.comparison,
                "comparisons": self.comparisons, "out_dir": self.out_dir, "store": self.store}

    def document(self) -> dict:
        """The ``wavefront train --json`` document."""
        return {"schema": SCHEMA, **self.as_dict()}


@dataclass
class _Env:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    plan: str
    bf16: bool
    layout: Layout | None = None  # resolved (parallel "mesh")
    mesh: Any = None  # the DeviceMesh (parallel "mesh")
    dp_rank: int = 0  # which slice of the global batch this rank reads
    dp: int = 1  # data-parallel ranks (slices of the global batch)
    cp_rank: int = 0  # which zig-zag shard of each sequence this rank holds (context_parallel.py)
    cp: int = 1
    cp_group: Any = None


_STOP = threading.Event()


def _on_sigterm(signum, frame) -> None:
    _STOP.set()


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _init(cfg: TrainConfig) -> _Env:
    world = world_size_from_env()
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist_launch.import_world_defaults()  # else the default group outlives destroy_process_group (launch.py)
        backend = "nccl" if use_cuda else "gloo"
        timeout = timedelta(seconds=cfg.timeout_s)
        if world == 1 and "MASTER_ADDR" not in os.environ:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        else:
            dist.init_process_group(backend, timeout=timeout)
    bf16 = cfg.dtype == "bf16" or (cfg.dtype == "auto" and use_cuda)
    env = _Env(rank, world, local_rank, device, cfg.resolve_parallel(world), bf16, dp_rank=rank, dp=world)
    if env.plan == "mesh":
        env.layout = cfg.layout().resolved(world)
        env.mesh = train_mesh.build_mesh(env.layout, device.type)
        coord = train_mesh.coordinates(env.mesh)
        env.dp_rank, env.dp = coord["dp_replicate"] * env.layout.dp_shard + coord["dp_shard"], env.layout.dp
        env.cp_rank, env.cp = coord["cp"], env.layout.cp
        env.cp_group = env.mesh["cp"].get_group() if env.cp > 1 else None
    return env


class _Clock:
    """Marks on the device timeline: CUDA events on a GPU (no sync until the step ends), else wall time."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def between(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a


def _decoder_layers(model) -> list[torch.nn.Module]:
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def _wrap(model, env: _Env, cfg: TrainConfig, ep: train_ep.EpState | None = None):
    if env.plan == "mesh":
        return parallelize(model, env.mesh, env.layout, bf16=env.bf16, prefetch=cfg.fsdp_prefetch,
                           reshard_after_forward=train_overlap.parse_reshard(cfg.reshard_after_forward))
    if env.plan == "ddp":
        from torch.nn.parallel import DistributedDataParallel  # lazy: torch-free import

        if ep is not None:
            train_ep.ddp_ignore(model, ep)
        return DistributedDataParallel(model, device_ids=[env.local_rank] if env.device.type == "cuda" else None)
    if env.plan == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh  # lazy: torch-free import
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # lazy: torch-free import

        mesh = init_device_mesh(env.device.type, (env.world,))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if env.bf16 else \
            MixedPrecisionPolicy()
        layers = _decoder_layers(model)
        ignored = {"ignored_params": set(ep.params)} if ep is not None else {}
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp, **train_overlap.fsdp_kwargs(cfg.reshard_after_forward),
                        **ignored)
        fully_shard(model, mesh=mesh, mp_policy=mp, **ignored)
        train_overlap.set_prefetch(layers, cfg.fsdp_prefetch)
    return model


def _autocast(env: _Env):
    if env.bf16 and env.plan != "fsdp2":  # FSDP2 casts through its MixedPrecisionPolicy instead
        return torch.autocast(env.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _all_reduce(values: list[float], env: _Env, op=dist.ReduceOp.SUM) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=env.device)
    with torch.profiler.record_function(train_overlap.SYNC_LABEL):  # kept out of the per-dimension comm split
        dist.all_reduce(t, op=op)
    return t.tolist()


def _batches(cfg: TrainConfig, vocab_size: int):
    if cfg.data == "synthetic":
        n = max(1 << 16, 2 * cfg.seq_len * cfg.global_batch)
        tokens = synthetic_corpus(vocab_size, n, seed=cfg.seed)
    else:
        tokenizer_dir = cfg.model if Path(cfg.model).is_dir() else None
        tokens = load_tokens(cfg.data, vocab_size=vocab_size, token_dtype=cfg.token_dtype, tokenizer_dir=tokenizer_dir)
    return Batches(tokens, cfg.seq_len, cfg.global_batch)


def _patch_options(cfg: TrainConfig) -> dict:
    return {**cfg.patch_options, "strict": cfg.strict_patch}


def _run_variant(cfg: TrainConfig, env: _Env, variant: str, peak: Peak, device_row, out_dir: Path,
                 on_step: Callable | None, records: list[StepRecord], result: VariantResult) -> None:
    """Train one variant; appends to `records` as it goes so a failure keeps what was measured."""
    model = build_model(cfg.model, seed=cfg.seed, attn_implementation=cfg.attn_implementation)
    fp8 = None
    if variant == "wavefront":
        try:
            result.patch_report = wavefront.patch(model, **_patch_options(cfg), fp8=cfg.fp8).as_dict()
        except wavefront.patching.PatchError as e:
            raise TrainFailure(str(e), EXIT_CONFIG) from None
        fp8 = _fp8_setup(cfg, env, model, peak, device_row)
    if env.cp > 1:
        context_parallel.install(model, env.cp_group)
    elif variant == "liger":
        from liger_kernel.transformers import _apply_liger_kernel_to_instance  # lazy: optional liger_kernel

        _apply_liger_kernel_to_instance(model=model)
    train_recompute.apply(model, cfg.recompute_policy)
    model.config.use_cache = False
    batches = _batches(cfg, model.config.get_text_config().vocab_size)  # a VL model's is in its text config
    n_params = sum(p.numel() for p in model.parameters())
    model_flops, hw_flops = train_recompute.flops_per_token(
        model.config, cfg.seq_len, train_ep.active_matmul_params(model, matmul_params(model)), cfg.recompute_policy)
    model.to(env.device).train()
    if fp8 is not None and cfg.fp8_all_gather:  # before fully_shard, after the move (train/fp8.py)

        result.notes += enable_all_gather(model, env.world if env.plan == "fsdp2" else env.layout.dp_shard)
    ep = train_ep.install(model, cfg.ep) if cfg.ep > 1 else None
    moe_counts: list[dict] = []
    inner = model
    accum = cfg.global_batch // (env.dp * cfg.micro_batch)
    pipe = par = None
    if env.plan == "mesh" and env.layout.pp > 1:
        pipe, par = pipeline.build(model, env.mesh, env.layout, bf16=env.bf16, device=env.device, n_micro=accum,
                                   n_items=accum * cfg.micro_batch * (cfg.seq_len - 1), patched=variant == "wavefront")
        model = par.module
    else:
        model = _wrap(model, env, cfg, ep)
    if env.plan == "mesh" and pipe is None:
        par, model = model, model.module
    if variant == "compile" and cfg.async_tp:
        train_overlap.enable_async_tp(env.mesh["tp"])  # before compiling: inductor's pass reads the flag
    if variant == "compile":
        inner.compile()  # nn.Module.compile: the same module object, its calls go through torch.compile
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, **({"fused": True} if env.device.type == "cuda"
                                                                and env.plan != "fsdp2" else {}))
    clock = _Clock(env.device)
    tail: dict = {}

    def mark_backward_tail(module, args, out) -> None:
        if out.requires_grad:
            out.register_hook(lambda grad: tail.__setitem__("mark", clock.mark()))

    emb_hook = inner.get_input_embeddings().register_forward_hook(mark_backward_tail)

    start_step = 0
    if cfg.resume:
        point = train_checkpoint.resume_point(_ckpt_dir(cfg, variant))
        meta = point.meta
        if point.note:
            result.notes.append(point.note)
        if meta is not None:
            for key in ("global_batch", "seq_len", "model"):
                if meta.get(key) != getattr(cfg, key):
                    raise TrainFailure(f"--resume: the checkpoint was written with {key}={meta.get(key)!r}, this "
                                       f"run has {getattr(cfg, key)!r}", EXIT_CONFIG)
            train_checkpoint.load(meta, model, opt, ep)
            start_step = meta["step"] + 1
            result.resumed_from_step = meta["step"]
            result.history_losses = list(meta.get("losses", []))

    tokens_per_step = cfg.global_batch * cfg.seq_len
    n_items = torch.tensor(accum * cfg.micro_batch * (cfg.seq_len - 1), device=env.device)
    memory = MemoryMeter(env.device)
    energy = EnergyMeter(env.device)
    energy_start = None
    profiler = None
    memory.start()
    try:
        for step in range(start_step, cfg.steps):
            profiled = cfg.profile_steps is not None and cfg.profile_steps[0] <= step <= cfg.profile_steps[1]
            if profiled and profiler is None:
                profiler = _start_profiler(env)
            if step == max(cfg.warmup_steps, start_step):
                energy_start = energy.read()
            fwd = bwd = comm = bubble = 0.0
            loss_sum = torch.zeros((), device=env.device, dtype=torch.float64)
            # the fused loss head's token accuracy (mean over micro-batches) and z-loss term (summed like the loss)
            acc_sum = torch.zeros((), device=env.device, dtype=torch.float64)
            z_sum = torch.zeros((), device=env.device, dtype=torch.float64)
            n_metrics = 0
            counting = _count_launches(result.kernel_launches) if variant == "wavefront" and step == start_step \
                else contextlib.nullcontext()
            with counting:
                if pipe is not None:
                    ids = batches.micro_batch(step, env.dp_rank, env.dp, 0, accum * cfg.micro_batch).to(env.device)
                    loss_sum, wall, fwd, bwd = pipe.step(*context_parallel.pipeline_inputs(ids, env.cp_rank, env.cp))
                    loss_sum = _inject(cfg, env, step, loss_sum)
                    if bwd is None:  # zero-bubble schedules: backward and idle time cannot be told apart here
                        bwd, bubble = wall - fwd, None
                    else:
                        comm = bubble = wall - fwd - bwd  # waiting for peers (the bubble) and the p2p transfers
                for micro in range(accum if pipe is None else 0):
                    ids = batches.micro_batch(step, env.dp_rank, env.dp, micro, cfg.micro_batch).to(env.device)
                    sync = micro == accum - 1
                    if env.plan == "fsdp2" or (par is not None and par.fsdp):
                        model.set_requires_gradient_sync(sync)
                    no_sync = model.no_sync() if env.plan == "ddp" and not sync else contextlib.nullcontext()
                    with no_sync:
                        t0 = clock.mark()
                        with _autocast(env):
                            loss = model(**context_parallel.inputs(ids, env.cp_rank, env.cp, n_items)).loss
                        loss = _inject(cfg, env, step, loss)
                        t1 = clock.mark()
                        tail.clear()
                        loss.backward()
                        t2 = clock.mark()
                    marks = (t0, t1, tail.get("mark", t2), t2)
                    if clock.cuda:
                        torch.cuda.synchronize(env.device)
                    f, b_compute, b_tail = (clock.between(marks[0], marks[1]), clock.between(marks[1], marks[2]),
                                            clock.between(marks[2], marks[3]))
                    fwd += f
                    if env.world > 1 and sync:
                        bwd, comm = bwd + b_compute, comm + b_tail
                    else:
                        bwd += b_compute + b_tail
                    loss_sum += loss.detach().double()
                    metrics = loss_metrics(model)
                    if metrics is not None and metrics.token_accuracy is not None:
                        acc_sum += metrics.token_accuracy.double()
                        z_sum += metrics.z_loss.double()
                        n_metrics += 1
            if par is not None:
                finish_backward(par, env.mesh, env.layout)
            if env.cp > 1:
                context_parallel.reduce_grads(model, env.cp_group)
            train_ep.reduce_grads(ep)
            counts = train_ep.step_counts(inner, env.device) if pipe is None else {}
            # the loss is the mean over data-parallel slices: pipeline ranks without the last stage hold none, the
            # cp ranks of a slice hold parts that add up to it (each counted 1/cp)
            weight = float(pipe.has_last) if pipe is not None else 1.0
            status = _all_reduce([float(loss_sum) * weight, float(not torch.isfinite(loss_sum)), float(_STOP.is_set()),
                                  weight / env.cp, float(acc_sum) / max(n_metrics, 1) * weight / env.cp,
                                  float(z_sum) * weight, float(n_metrics > 0)], env)
            loss_avg = status[0] / status[3]
            # every rank computes the fused loss, or none does: the KPIs exist only when all of them report
            token_acc, z_avg = (status[4] / status[3], status[5] / status[3]) if status[6] == env.world else (None,
                                                                                                             None)
            if status[1] > 0:
                raise TrainFailure(f"non-finite loss ({loss_avg}) at step {step} on {int(status[1])} rank(s); stopped "
                                   f"every rank before the optimizer step", EXIT_NONFINITE)
            t3 = clock.mark()
            opt.step()
            opt.zero_grad(set_to_none=True)
            t4 = clock.mark()
            if clock.cuda:
                torch.cuda.synchronize(env.device)
            opt_s = clock.between(t3, t4)
            fwd, bwd, comm, opt_s = _all_reduce([fwd, bwd, comm, opt_s], env, dist.ReduceOp.MAX)
            step_s = fwd + bwd + comm + opt_s
            tps = tokens_per_step / step_s

            def util(fl: float, tps: float = tps) -> float | None:
                return tps * fl / (env.world * peak.tflops * 1e12) if peak.tflops else None

            rec = StepRecord(step, loss_avg, step_s, fwd, bwd, comm, opt_s, tokens_per_step, tps, tps / env.world,
                             util(model_flops), util(hw_flops), measured=step >= cfg.warmup_steps and not profiled,
                             bubble_s=_all_reduce([bubble], env, dist.ReduceOp.MAX)[0] if bubble is not None and pipe
                             is not None else None,
                             moe_imbalance=(train_ep.imbalance(counts) or {}).get("overall"), token_accuracy=token_acc,
                             z_loss=z_avg)
            records.append(rec)
            if rec.measured:
                moe_counts.append(counts)
            if on_step is not None and env.rank == 0:
                on_step(variant, rec, cfg.steps)
            if profiler is not None and step == cfg.profile_steps[1]:
                result.trace_paths.append(_stop_profiler(profiler, out_dir, variant, env))
                profiler = None
            last = step == cfg.steps - 1
            if cfg.checkpoint_every and ((step + 1) % cfg.checkpoint_every == 0 or last or status[2] > 0):
                train_checkpoint.save(_ckpt_dir(cfg, variant), step, model, opt, {
                    "losses": result.history_losses + [r.loss for r in records], "global_batch": cfg.global_batch,
                    "seq_len": cfg.seq_len, "model": cfg.model, "world_size": env.world, "parallel": env.plan,
                    "variant": variant}, ep)
            if status[2] > 0 and not last:
                saved = "checkpoint saved; rerun with --resume" if cfg.checkpoint_every else "no --checkpoint-dir"
                raise TrainFailure(f"interrupted (SIGTERM) after step {step}; {saved}", EXIT_INTERRUPTED)
        energy_end = energy.read()
        window = None
        if energy_start is not None and energy_end is not None:
            window = _all_reduce([energy_end - energy_start], env)[0]
        peak_mem = int(_all_reduce([float(memory.stop())], env, dist.ReduceOp.MAX)[0])
        result.summary = summarize(
            variant, records, peak=peak, model_flops=model_flops, hw_flops=hw_flops, n_params=n_params,
            world_size=env.world, peak_mem_bytes=peak_mem, peak_mem_kind=memory.kind, device_row=device_row,
            price_override=cfg.price_per_hour, energy_window_j=window, energy_kind=energy.kind,
            is_gpu=env.device.type == "cuda")
        result.summary.patch = result.patch_report
        train_ep.add_summary(result.summary, moe_counts, ep)
        if cfg.profile_steps is not None and result.trace_paths and env.plan in ("mesh", "fsdp2"):
            degrees = env.layout.degrees if env.layout is not None else {"dp_shard": env.world}
            first, last = cfg.profile_steps
            mine = train_overlap.comm_by_dim(result.trace_paths[-1], degrees, last - first + 1)
            result.summary.comm_by_dim = train_overlap.across_ranks(mine, lambda v: _all_reduce(
                v, env, dist.ReduceOp.MAX))
        if variant == "wavefront" and fp8 is not None:
            result.notes += _fp8_summary(result.summary, fp8, model_flops, peak, env)
    finally:
        emb_hook.remove()
        memory.stop()  # joins the CPU sampler thread, also when a step failed (stopping twice is harmless)
        if profiler is not None:
            result.trace_paths.append(_stop_profiler(profiler, out_dir, variant, env))
        del model, opt, inner
        gc.collect()
        if env.device.type == "cuda":
            torch.cuda.empty_cache()


def _fp8_setup(cfg: TrainConfig, env: _Env, model, peak: Peak, device_row):
    """After the FP8 patch: the swapped layers' FLOPs and FP8 peak; bf16 parameters where FSDP2 does not cast."""
    if cfg.fp8 is None:
        return None

    flops, n_swapped = train_fp8.swapped_flops(model, cfg.fp8)
    fp8_tflops, source = train_fp8.fp8_peak(device_row, cfg.peak_tflops)
    cast = train_fp8.needs_bf16_params(env.plan, env.dp)
    if cast:
        train_fp8.cast_params_bf16(model)
    return train_fp8.Fp8Flops(cfg.fp8, flops, n_swapped, fp8_tflops, source), cast


def _fp8_summary(summary: Summary, fp8, model_flops: float, peak: Peak, env: _Env) -> list[str]:
    flops, cast = fp8
    summary.mfu_fp8 = train_fp8.mixed_mfu(summary.tokens_per_s, model_flops, flops, peak.tflops, env.world)
    summary.fp8 = {**asdict(flops), "bf16_peak_tflops": peak.tflops, "params_cast_bf16": cast}
    return train_fp8.notes(flops, model_flops, cast)


@contextlib.contextmanager
def _count_launches(counts: dict[str, int]):
    """Count wavefront kernel launches by kernel name inside the block (into `counts`)."""
    with recording() as launches:
        yield
    for launch in launches:
        counts[launch.name] = counts.get(launch.name, 0) + 1


def _inject(cfg: TrainConfig, env: _Env, step: int, loss: torch.Tensor) -> torch.Tensor:
    """Test aids: --inject-failure RANK:STEP raises on that rank; --inject-nan STEP poisons the loss."""
    if cfg.inject_failure == (env.rank, step):
        raise RuntimeError(f"injected failure (--inject-failure {env.rank}:{step})")
    if cfg.inject_nan == step:
        return loss * float("nan")
    return loss


def _ckpt_dir(cfg: TrainConfig, variant: str) -> Path:
    return Path(cfg.checkpoint_dir) / variant


def _start_profiler(env: _Env):
    from torch.profiler import ProfilerActivity, profile  # lazy: torch-free import

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if env.device.type == "cuda" else [])
    prof = profile(activities=activities, record_shapes=True, profile_memory=True)
    prof.__enter__()
    return prof


def _stop_profiler(prof, out_dir: Path, variant: str, env: _Env) -> str:
    prof.__exit__(None, None, None)
    path = (out_dir / f"trace_{variant}_rank{env.rank}.json").resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return str(path)


def _git_sha() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent).stdout.strip() or None
    except Exception:
        return None


def _provenance(env: _Env) -> dict:
    info = runtime.describe(env.device)
    return {"started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "git_sha": _git_sha(),
            "host": platform.node(), "backend": info["backend"], "device_name": info["device_name"],
            "runtime": info, "world_size": env.world,
            "parallel": f"mesh {env.layout.label()}" if env.layout is not None else env.plan,
            "layout": env.layout.as_dict() if env.layout is not None else None,
            "dtype": "bf16" if env.bf16 else "fp32", "torch_threads": torch.get_num_threads()}


def _store_variant(cfg: TrainConfig, run_id: str, prov: dict, v: VariantResult) -> None:
    if cfg.store:
        train_store.write_variant(cfg.store, run_id=run_id, variant=v.variant, status=v.status, provenance=prov,
                                  config=cfg.as_dict(), summary=v.summary.as_dict() if v.summary else None,
                                  steps=[asdict(r) for r in v.steps])


def run(cfg: TrainConfig, *, on_step: Callable[[str, StepRecord, int], None] | None = None) -> TrainResult:
    """Train every requested variant on this rank; see the module docstring. Raises ConfigError before any
    work for a bad configuration, TrainFailure (with an exit code) when the run stops."""
    cfg.validate(world_size_from_env())
    env = _init(cfg)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    out_dir = Path(cfg.out_dir)
    run_id = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    run_id = _broadcast_str(run_id, env)
    prov = _provenance(env)
    peak, device_row = device_peak(env.device, cfg.gpu, cfg.peak_tflops, env.bf16)
    measured_device = None
    if env.plan == "mesh" and env.device.type == "cpu" and peak.tflops:
        measured_device = predict.measure(peak.tflops, env.device)
    results: list[VariantResult] = []
    for variant in run_order(cfg.variants):
        v = VariantResult(variant, "running")
        results.append(v)
        missing = unavailable(variant)
        if missing:
            v.status = f"skipped: {missing}"
            v.notes.append(f"{variant}: skipped, {missing}")
            continue
        try:
            _run_variant(cfg, env, variant, peak, device_row, out_dir, on_step, v.steps, v)
            v.status = "ok"
            if measured_device is not None and v.summary is not None:
                v.summary.prediction = _prediction(cfg, env, measured_device, v.summary)
        except TrainFailure as e:
            v.status = f"failed: {e}"
            if env.rank == 0:
                _store_variant(cfg, run_id, prov, v)
            raise
        except ConfigError:
            raise
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            v.status = f"failed: {type(e).__name__}: {first}"
            if env.rank == 0:
                _store_variant(cfg, run_id, prov, v)
            at = len(v.steps) + (v.resumed_from_step + 1 if v.resumed_from_step is not None else 0)
            raise TrainFailure(f"rank {env.rank} of {env.world}, {variant} step {at}: {type(e).__name__}: "
                               f"{first}") from e
        if env.rank == 0:
            _store_variant(cfg, run_id, prov, v)
    comparisons = _compare_all(results)
    return TrainResult(run_id, cfg.as_dict(), prov, results, comparisons.get("wavefront"), str(out_dir), cfg.store,
                       comparisons)


def _prediction(cfg: TrainConfig, env: _Env, device, summary: Summary) -> dict:
    """The planner's step time for this very plan on this machine, and predicted vs measured."""
    try:
        pred = predict.predict(device, build_config(cfg.model), env.layout, world=env.world, seq_len=cfg.seq_len,
                               global_batch=cfg.global_batch, micro_batch=cfg.micro_batch,
                               recompute=cfg.recompute_policy)
    except ValueError as e:  # a plan the planner's model refuses: the run's own KPIs stand
        return {"ok": False, "reasons": [str(e)]}
    return {**pred, "vs_measured": predict.compare(pred, summary)}


def run_order(variants: tuple[str, ...]) -> list[str]:
    """The order the variants run in: as given, except Liger last (its patch also rebinds functions in
    transformers' modeling modules for the rest of the process, which would leak into later variants)."""
    return [v for v in variants if v != "liger"] + [v for v in variants if v == "liger"]


def unavailable(variant: str) -> str | None:
    """Why a variant cannot run in this environment (a missing optional package), or None."""
    if variant == "liger" and importlib.util.find_spec("liger_kernel") is None:
        return "Liger-Kernel is not installed (pip install liger-kernel)"
    return None


def _compare_all(results: list[VariantResult]) -> dict[str, dict]:
    """Each measured variant against the first one (the reference), keyed by variant."""
    done = [r for r in results if r.summary]
    if len(done) < 2 or done[0] is not results[0]:
        return {}
    ref = done[0]
    return {r.variant: compare(ref.summary, r.summary, [x.loss for x in ref.steps], [x.loss for x in r.steps])
            for r in done[1:]}


def _broadcast_str(text: str, env: _Env) -> str:
    """Rank 0's string on every rank (the run id must be one id)."""
    box = [text]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shutdown(failed: bool) -> None:
    """Tear down the process groups after success (every rank got here: a barrier, then destroy); after a failure
    peers may be gone, so do not wait on them (the caller leaves with os._exit)."""
    if dist.is_initialized() and not failed:
        with contextlib.suppress(Exception):
            dist_launch.destroy_process_group(barrier=True)
