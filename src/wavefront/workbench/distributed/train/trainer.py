"""One variant's training, in three moves: :func:`build` the model, :func:`parallelize` it for the run's
layout (parallelize.py), then :func:`train_step` once per step; :func:`train` is the loop around them.

A step reads this data-parallel rank's sequences of the step (:class:`Batch`), runs forward and backward
(the pipeline's schedule, or one micro-batch at a time with the gradient sync on the last), finishes the
gradients the parallel dimensions leave partial, all-reduces a status vector (loss, non-finite flag, stop
flag) *before* the optimizer step, so a NaN/inf loss on any rank stops every rank at the same step with the
parameters untouched, steps the optimizer and returns the step's :class:`StepRecord`.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, profile

import wavefront
from wavefront.kernels._launch import recording
from wavefront.patching import PatchError
from wavefront.patching.loss import loss_metrics
from wavefront.workbench.distributed import launch as dist_launch
from wavefront.workbench.distributed.train import checkpoint as train_checkpoint
from wavefront.workbench.distributed.train import context_parallel
from wavefront.workbench.distributed.train import expert_parallel as train_ep
from wavefront.workbench.distributed.train import fp8 as train_fp8
from wavefront.workbench.distributed.train import overlap as train_overlap
from wavefront.workbench.distributed.train import recompute as train_recompute
from wavefront.workbench.distributed.train.config import TrainConfig
from wavefront.workbench.distributed.train.data import Batches, load_tokens, synthetic_corpus
from wavefront.workbench.distributed.train.errors import EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_NONFINITE, TrainFailure
from wavefront.workbench.distributed.train.kpi import (
    EnergyMeter,
    MemoryMeter,
    Peak,
    StepRecord,
    Summary,
    matmul_params,
    summarize,
)
from wavefront.workbench.distributed.train.mesh import Layout, RunLayout, build_mesh, coordinates
from wavefront.workbench.distributed.train.parallelize import (
    Parallelized,
    ParallelOptions,
    finish_backward,
    parallelize,
)
from wavefront.workbench.distributed.train.presets import build_model

#: Set by SIGTERM (harness.py installs the handler); honoured at the end of the current step.
STOP = threading.Event()


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


@dataclass
class Env:
    """This rank in the launch: where it runs, the run's layout and mesh, and its coordinates on the mesh."""

    rank: int
    world: int
    device: torch.device
    bf16: bool
    run: RunLayout
    mesh: Any  # the DeviceMesh, every dimension named
    dp_rank: int = 0  # which slice of the global batch this rank reads
    dp: int = 1  # data-parallel ranks (slices of the global batch)
    cp_rank: int = 0  # which zig-zag shard of each sequence this rank holds (context_parallel.py)
    cp: int = 1

    @property
    def layout(self) -> Layout:
        return self.run.layout


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def init(cfg: TrainConfig) -> Env:
    """Join the process group (timeouts on every collective) and build the run's mesh."""
    world, rank = world_size_from_env(), int(os.environ.get("RANK", "0"))
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist_launch.import_world_defaults()  # else the default group outlives destroy_process_group (launch.py)
        backend, timeout = ("nccl" if use_cuda else "gloo"), timedelta(seconds=cfg.timeout_s)
        if world == 1 and "MASTER_ADDR" not in os.environ:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        else:
            dist.init_process_group(backend, timeout=timeout)
    run = cfg.run_layout(world)
    mesh = build_mesh(run.layout, device.type)
    coord = coordinates(mesh)
    return Env(rank, world, device, cfg.dtype == "bf16" or (cfg.dtype == "auto" and use_cuda), run, mesh,
               dp_rank=coord["dp_replicate"] * run.layout.dp_shard + coord["dp_shard"], dp=run.layout.dp,
               cp_rank=coord["cp"], cp=run.layout.cp)


class Clock:
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


def all_reduce(values: list[float], env: Env, op=dist.ReduceOp.SUM) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=env.device)
    with torch.profiler.record_function(train_overlap.SYNC_LABEL):  # kept out of the per-dimension comm split
        dist.all_reduce(t, op=op)
    return t.tolist()


# --- build ----------------------------------------------------------------------------------------------------


@dataclass
class Built:
    """A variant's model before parallelization, and what is measured from it whole."""

    model: Any  # a transformers PreTrainedModel
    n_params: int
    model_flops: float  # per token
    hw_flops: float  # per token, recompute included
    fp8: tuple[train_fp8.Fp8Flops, bool] | None  # (the FP8 layers' FLOPs and peak, parameters cast to bf16)


def build(cfg: TrainConfig, env: Env, variant: str, peak: Peak, device_row, result: VariantResult) -> Built:
    """The model of `cfg` for one variant, from the run's seed: patched as the variant asks, recomputing as
    configured, on the device in training mode."""
    model = build_model(cfg.model, seed=cfg.seed, attn_implementation=cfg.attn_implementation)
    fp8 = None
    if variant == "wavefront":
        try:
            result.patch_report = wavefront.patch(model, **cfg.patch_options, strict=cfg.strict_patch,
                                                  fp8=cfg.fp8).as_dict()
        except PatchError as e:
            raise TrainFailure(str(e), EXIT_CONFIG) from None
        fp8 = _fp8_setup(cfg, env, model, peak, device_row)
    elif variant == "liger":
        # function-local: Liger-Kernel is optional (unavailable() skips the variant without it)
        from liger_kernel.transformers import _apply_liger_kernel_to_instance  # lazy: optional liger_kernel

        _apply_liger_kernel_to_instance(model=model)
    train_recompute.apply(model, cfg.recompute_policy)
    model.config.use_cache = False
    n_active = train_ep.active_matmul_params(model, matmul_params(model))  # whole experts, before any split
    model_flops, hw_flops = train_recompute.flops_per_token(model.config, cfg.seq_len, n_active,
                                                            cfg.recompute_policy)
    n_params = sum(p.numel() for p in model.parameters())
    model.to(env.device).train()
    return Built(model, n_params, model_flops, hw_flops, fp8)


def _fp8_setup(cfg: TrainConfig, env: Env, model: nn.Module, peak: Peak, device_row):
    """After the FP8 patch: the swapped layers' FLOPs and FP8 peak; bf16 parameters where FSDP2 does not cast."""
    if cfg.fp8 is None:
        return None
    flops, n_swapped = train_fp8.swapped_flops(model, cfg.fp8)
    fp8_tflops, source = train_fp8.fp8_peak(device_row, cfg.peak_tflops)
    cast = train_fp8.needs_bf16_params(env.layout)
    if cast:
        train_fp8.cast_params_bf16(model)
    return train_fp8.Fp8Flops(cfg.fp8, flops, n_swapped, fp8_tflops, source), cast


def _batches(cfg: TrainConfig, vocab_size: int) -> Batches:
    if cfg.data == "synthetic":
        n = max(1 << 16, 2 * cfg.seq_len * cfg.global_batch)
        tokens = synthetic_corpus(vocab_size, n, seed=cfg.seed)
    else:
        tokenizer_dir = cfg.model if Path(cfg.model).is_dir() else None
        tokens = load_tokens(cfg.data, vocab_size=vocab_size, token_dtype=cfg.token_dtype, tokenizer_dir=tokenizer_dir)
    return Batches(tokens, cfg.seq_len, cfg.global_batch)


# --- the state a step works on --------------------------------------------------------------------------------


@dataclass
class TrainState:
    cfg: TrainConfig
    env: Env
    variant: str
    built: Built
    par: Parallelized
    opt: torch.optim.Optimizer
    batches: Batches
    peak: Peak
    result: VariantResult
    accum: int  # micro-batches per step on this rank
    n_items: torch.Tensor  # the loss's token count over the step's micro-batches (gradients = the one-process mean)
    clock: Clock
    memory: MemoryMeter
    energy: EnergyMeter
    tail: dict = field(default_factory=dict)  # the backward's last mark (the embedding's gradient)
    start_step: int = 0
    stop: bool = False  # some rank got SIGTERM during the last step
    counts: dict = field(default_factory=dict)  # MoE tokens per expert of the last step
    profiler: Any = None
    energy_start: float | None = None
    moe_counts: list[dict] = field(default_factory=list)
    hooks: list = field(default_factory=list)
    device_row: Any = None  # the device table's row (price, power) or None


@dataclass(frozen=True)
class Batch:
    step: int
    ids: torch.Tensor  # [micro-batches x micro_batch, seq_len]: this data-parallel rank's sequences of the step
    measured: bool  # counted in the summary (not warm-up, not profiled)


def setup(cfg: TrainConfig, env: Env, variant: str, peak: Peak, device_row, result: VariantResult) -> TrainState:
    """build, parallelize, compile (the compile variant), the optimizer, the resume point."""
    built = build(cfg, env, variant, peak, device_row, result)
    batches = _batches(cfg, built.model.config.get_text_config().vocab_size)  # a VL model's is in its text config
    accum = cfg.global_batch // (env.dp * cfg.micro_batch)
    n_items = accum * cfg.micro_batch * (cfg.seq_len - 1)
    opts = ParallelOptions(bf16=env.bf16, reshard_after_forward=train_overlap.parse_reshard(cfg.reshard_after_forward),
                           prefetch=cfg.fsdp_prefetch, fp8_all_gather=built.fp8 is not None and cfg.fp8_all_gather,
                           device=env.device, n_micro=accum, n_items=n_items, patched=variant == "wavefront")
    par = parallelize(built.model, env.layout, env.mesh, opts)
    result.notes += par.notes
    if variant == "compile":
        if cfg.async_tp:
            train_overlap.enable_async_tp(env.mesh["tp"])  # before compiling: inductor's pass reads the flag
        built.model.compile()  # nn.Module.compile: the same module object, its calls go through torch.compile
    opt = torch.optim.AdamW(par.module.parameters(), lr=cfg.lr, fused=True if env.device.type == "cuda" else None)
    state = TrainState(cfg, env, variant, built, par, opt, batches, peak, result, accum,
                       torch.tensor(n_items, device=env.device), Clock(env.device), MemoryMeter(env.device),
                       EnergyMeter(env.device), device_row=device_row)
    state.hooks.append(built.model.get_input_embeddings().register_forward_hook(_mark_backward_tail(state)))
    state.start_step = _resume(state) if cfg.resume else 0
    return state


def _mark_backward_tail(state: TrainState):
    def hook(module, args, out) -> None:
        if out.requires_grad:
            out.register_hook(lambda grad: state.tail.__setitem__("mark", state.clock.mark()))
    return hook


def _resume(state: TrainState) -> int:
    """The first step to run: after the newest intact checkpoint's, whose state is loaded (else 0)."""
    cfg, result = state.cfg, state.result
    point = train_checkpoint.resume_point(ckpt_dir(cfg, state.variant))
    if point.note:
        result.notes.append(point.note)
    meta = point.meta
    if meta is None:
        return 0
    for key in ("global_batch", "seq_len", "model"):
        if meta.get(key) != getattr(cfg, key):
            raise TrainFailure(f"--resume: the checkpoint was written with {key}={meta.get(key)!r}, this run has "
                               f"{getattr(cfg, key)!r}", EXIT_CONFIG)
    train_checkpoint.load(meta, state.par.module, state.opt, state.par.ep)
    result.resumed_from_step = meta["step"]
    result.history_losses = list(meta.get("losses", []))
    return meta["step"] + 1


def ckpt_dir(cfg: TrainConfig, variant: str) -> Path:
    return Path(cfg.checkpoint_dir or ".") / variant


# --- one step ---------------------------------------------------------------------------------------------------


@dataclass
class _Pass:
    """One step's forward and backward on this rank: seconds and sums over its micro-batches."""

    loss: torch.Tensor
    acc: torch.Tensor  # the fused loss head's token accuracy, summed over micro-batches
    z: torch.Tensor  # its z-loss term, summed like the loss
    n_metrics: int = 0
    fwd: float = 0.0
    bwd: float = 0.0
    comm: float = 0.0
    bubble: float | None = 0.0


def train_step(state: TrainState, batch: Batch) -> StepRecord:
    """Forward and backward over `batch`, the gradients finished, the status agreed by every rank, the
    optimizer stepped; the step's KPIs (every rank returns the same record)."""
    counting = _count_launches(state.result.kernel_launches) if state.variant == "wavefront" and \
        batch.step == state.start_step else contextlib.nullcontext()
    with counting:
        p = _pipeline_pass(state, batch) if state.par.pipe is not None else _micro_batches(state, batch)
    finish_backward(state.par, state.env.mesh, state.env.layout)
    state.counts = train_ep.step_counts(state.built.model, state.env.device) if state.par.pipe is None else {}
    loss, token_acc, z_loss = _agree(state, batch, p)
    t3 = state.clock.mark()
    state.opt.step()
    state.opt.zero_grad(set_to_none=True)
    t4 = state.clock.mark()
    if state.clock.cuda:
        torch.cuda.synchronize(state.env.device)
    times = all_reduce([p.fwd, p.bwd, p.comm, state.clock.between(t3, t4)], state.env, dist.ReduceOp.MAX)
    bubble = all_reduce([p.bubble], state.env, dist.ReduceOp.MAX)[0] if p.bubble is not None and \
        state.par.pipe is not None else None
    return _record(state, batch, loss, times, bubble, token_acc, z_loss)


def _pipeline_pass(state: TrainState, batch: Batch) -> _Pass:
    env = state.env
    zero = torch.zeros((), device=env.device, dtype=torch.float64)
    loss, wall, fwd, bwd = state.par.pipe.step(*context_parallel.pipeline_inputs(batch.ids, env.cp_rank, env.cp))
    p = _Pass(_inject(state, batch.step, loss), zero, zero.clone(), fwd=fwd)
    if bwd is None:  # zero-bubble schedules: backward and idle time cannot be told apart here
        p.bwd, p.bubble = wall - fwd, None
    else:
        p.bwd = bwd
        p.comm = p.bubble = wall - fwd - bwd  # waiting for peers (the bubble) and the p2p transfers
    return p


def _micro_batches(state: TrainState, batch: Batch) -> _Pass:
    """One micro-batch at a time; the gradients are reduced in the last one's backward."""
    env, clock, module = state.env, state.clock, state.par.module
    zero = torch.zeros((), device=env.device, dtype=torch.float64)
    p = _Pass(zero.clone(), zero.clone(), zero.clone())
    for micro, ids in enumerate(batch.ids.split(state.cfg.micro_batch)):
        sync = micro == state.accum - 1
        with state.par.sync_grads(sync):
            t0 = clock.mark()
            with _autocast(env):
                loss = module(**context_parallel.inputs(ids, env.cp_rank, env.cp, state.n_items)).loss
            loss = _inject(state, batch.step, loss)
            t1 = clock.mark()
            state.tail.clear()
            loss.backward()
            t2 = clock.mark()
        if clock.cuda:
            torch.cuda.synchronize(env.device)
        f, b_compute, b_tail = (clock.between(t0, t1), clock.between(t1, state.tail.get("mark", t2)),
                                clock.between(state.tail.get("mark", t2), t2))
        p.fwd += f
        if env.world > 1 and sync:  # the tail of the last backward waits on the gradient reduction
            p.bwd, p.comm = p.bwd + b_compute, p.comm + b_tail
        else:
            p.bwd += b_compute + b_tail
        p.loss += loss.detach().double()
        metrics = loss_metrics(module)
        if metrics is not None and metrics.token_accuracy is not None:
            p.acc += metrics.token_accuracy.double()
            p.z += metrics.z_loss.double()
            p.n_metrics += 1
    return p


def _autocast(env: Env):
    """bf16 autocast over the parameters (FSDP2's, already bf16 under its policy, or fp32 masters)."""
    return torch.autocast(env.device.type, dtype=torch.bfloat16) if env.bf16 else contextlib.nullcontext()


def _agree(state: TrainState, batch: Batch, p: _Pass) -> tuple[float, float | None, float | None]:
    """(mean loss, token accuracy, z-loss) over every rank; stops every rank on a non-finite loss anywhere."""
    env, pipe = state.env, state.par.pipe
    # the loss is the mean over data-parallel slices: pipeline ranks without the last stage hold none, the cp ranks
    # of a slice hold parts that add up to it (each counted 1/cp)
    weight = float(pipe.has_last) if pipe is not None else 1.0
    status = all_reduce([float(p.loss) * weight, float(not torch.isfinite(p.loss)), float(STOP.is_set()),
                         weight / env.cp, float(p.acc) / max(p.n_metrics, 1) * weight / env.cp,
                         float(p.z) * weight, float(p.n_metrics > 0)], env)
    loss = status[0] / status[3]
    if status[1] > 0:
        raise TrainFailure(f"non-finite loss ({loss}) at step {batch.step} on {int(status[1])} rank(s); stopped "
                           f"every rank before the optimizer step", EXIT_NONFINITE)
    state.stop = status[2] > 0
    if status[6] != env.world:  # every rank computes the fused loss, or none does: the KPIs need all of them
        return loss, None, None
    return loss, status[4] / status[3], status[5] / status[3]


def _record(state: TrainState, batch: Batch, loss: float, times: list[float], bubble: float | None,
            token_acc: float | None, z_loss: float | None) -> StepRecord:
    env, cfg, peak = state.env, state.cfg, state.peak
    fwd, bwd, comm, opt_s = times
    step_s = fwd + bwd + comm + opt_s
    tokens = cfg.global_batch * cfg.seq_len
    tps = tokens / step_s

    def util(flops: float) -> float | None:
        return tps * flops / (env.world * peak.tflops * 1e12) if peak.tflops else None

    return StepRecord(batch.step, loss, step_s, fwd, bwd, comm, opt_s, tokens, tps, tps / env.world,
                      util(state.built.model_flops), util(state.built.hw_flops), measured=batch.measured,
                      bubble_s=bubble, moe_imbalance=(train_ep.imbalance(state.counts) or {}).get("overall"),
                      token_accuracy=token_acc, z_loss=z_loss)


def _inject(state: TrainState, step: int, loss: torch.Tensor) -> torch.Tensor:
    """Test aids: --inject-failure RANK:STEP raises on that rank; --inject-nan STEP poisons the loss."""
    if state.cfg.inject_failure == (state.env.rank, step):
        raise RuntimeError(f"injected failure (--inject-failure {state.env.rank}:{step})")
    if state.cfg.inject_nan == step:
        return loss * float("nan")
    return loss


@contextlib.contextmanager
def _count_launches(counts: dict[str, int]):
    """Count wavefront kernel launches by kernel name inside the block (into `counts`)."""
    with recording() as launches:
        yield
    for launch in launches:
        counts[launch.name] = counts.get(launch.name, 0) + 1


# --- the loop ---------------------------------------------------------------------------------------------------


def train(cfg: TrainConfig, env: Env, variant: str, peak: Peak, device_row, out_dir: Path,
          on_step: Callable | None, result: VariantResult) -> None:
    """Train one variant; appends to ``result.steps`` as it goes so a failure keeps what was measured."""
    state = setup(cfg, env, variant, peak, device_row, result)
    last_profiled = cfg.profile_steps[1] if cfg.profile_steps is not None else -1
    state.memory.start()
    try:
        for step in range(state.start_step, cfg.steps):
            profiled = cfg.profile_steps is not None and cfg.profile_steps[0] <= step <= cfg.profile_steps[1]
            if profiled and state.profiler is None:
                state.profiler = _start_profiler(env)
            if step == max(cfg.warmup_steps, state.start_step):
                state.energy_start = state.energy.read()
            ids = state.batches.micro_batch(step, env.dp_rank, env.dp, 0, state.accum * cfg.micro_batch)
            rec = train_step(state, Batch(step, ids.to(env.device), step >= cfg.warmup_steps and not profiled))
            result.steps.append(rec)
            if rec.measured:
                state.moe_counts.append(state.counts)
            if on_step is not None and env.rank == 0:
                on_step(variant, rec, cfg.steps)
            if state.profiler is not None and step == last_profiled:
                result.trace_paths.append(_stop_profiler(state.profiler, out_dir, variant, env))
                state.profiler = None
            _after_step(state, step)
        _summarize(state)
    finally:
        _release(state, out_dir)
        del state  # the model, its gradients and the optimizer's state go before the next variant builds its own
        gc.collect()
        if env.device.type == "cuda":
            torch.cuda.empty_cache()


def _after_step(state: TrainState, step: int) -> None:
    """The checkpoint when due (or when stopping), then the stop SIGTERM asked for."""
    cfg, env, result = state.cfg, state.env, state.result
    last = step == cfg.steps - 1
    if cfg.checkpoint_every and ((step + 1) % cfg.checkpoint_every == 0 or last or state.stop):
        train_checkpoint.save(ckpt_dir(cfg, state.variant), step, state.par.module, state.opt, {
            "losses": result.history_losses + [r.loss for r in result.steps], "global_batch": cfg.global_batch,
            "seq_len": cfg.seq_len, "model": cfg.model, "world_size": env.world,
            "parallel": env.run.name, "variant": state.variant}, state.par.ep)
    if state.stop and not last:
        saved = "checkpoint saved; rerun with --resume" if cfg.checkpoint_every else "no --checkpoint-dir"
        raise TrainFailure(f"interrupted (SIGTERM) after step {step}; {saved}", EXIT_INTERRUPTED)


def _summarize(state: TrainState) -> None:
    """The variant's summary KPIs over the measured steps (every rank takes part in the reductions)."""
    cfg, env, result, built = state.cfg, state.env, state.result, state.built
    energy_end = state.energy.read()
    window = None
    if state.energy_start is not None and energy_end is not None:
        window = all_reduce([energy_end - state.energy_start], env)[0]
    peak_mem = int(all_reduce([float(state.memory.stop())], env, dist.ReduceOp.MAX)[0])
    result.summary = summarize(
        state.variant, result.steps, peak=state.peak, model_flops=built.model_flops, hw_flops=built.hw_flops,
        n_params=built.n_params, world_size=env.world, peak_mem_bytes=peak_mem, peak_mem_kind=state.memory.kind,
        device_row=state.device_row, price_override=cfg.price_per_hour, energy_window_j=window,
        energy_kind=state.energy.kind, is_gpu=env.device.type == "cuda")
    result.summary.patch = result.patch_report
    train_ep.add_summary(result.summary, state.moe_counts, state.par.ep)
    if cfg.profile_steps is not None and result.trace_paths and (env.run.as_mesh or env.layout.shards):
        first, last = cfg.profile_steps
        mine = train_overlap.comm_by_dim(result.trace_paths[-1], env.layout.degrees, last - first + 1)
        result.summary.comm_by_dim = train_overlap.across_ranks(mine, lambda v: all_reduce(
            v, env, dist.ReduceOp.MAX))
    if built.fp8 is not None:
        result.notes += _fp8_summary(result.summary, built.fp8, built.model_flops, state.peak, env)


def _fp8_summary(summary: Summary, fp8, model_flops: float, peak: Peak, env: Env) -> list[str]:
    flops, cast = fp8
    summary.mfu_fp8 = train_fp8.mixed_mfu(summary.tokens_per_s, model_flops, flops, peak.tflops, env.world)
    summary.fp8 = {**asdict(flops), "bf16_peak_tflops": peak.tflops, "params_cast_bf16": cast}
    return train_fp8.notes(flops, model_flops, cast)


def _release(state: TrainState, out_dir: Path) -> None:
    """Hooks off, the memory sampler joined, an open trace written (also after a failure)."""
    for hook in state.hooks:
        hook.remove()
    state.memory.stop()  # joins the CPU sampler thread (stopping twice is harmless)
    if state.profiler is not None:
        state.result.trace_paths.append(_stop_profiler(state.profiler, out_dir, state.variant, state.env))
        state.profiler = None


def _start_profiler(env: Env):
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if env.device.type == "cuda" else [])
    prof = profile(activities=activities, record_shapes=True, profile_memory=True)
    prof.__enter__()
    return prof


def _stop_profiler(prof, out_dir: Path, variant: str, env: Env) -> str:
    prof.__exit__(None, None, None)
    path = (out_dir / f"trace_{variant}_rank{env.rank}.json").resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return str(path)
