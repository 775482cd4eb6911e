"""Every check of a :class:`TrainConfig` against the launch, one small function per concern, run in a fixed
order so the first problem a user meets is always the same one.

Every rank runs :func:`validate` before a model is built or a collective issued; each check raises
ConfigError naming the option and what was expected. The checks of one parallel dimension live with that
dimension (mesh.py, expert_parallel.py, fp8.py, overlap.py) and are called from here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from wavefront.patching.fp8 import RECIPES
from wavefront.patching.table import OPS
from wavefront.workbench.distributed.train import expert_parallel, mesh
from wavefront.workbench.distributed.train.errors import ConfigError
from wavefront.workbench.distributed.train.fp8 import all_gather_problem
from wavefront.workbench.distributed.train.overlap import problems as overlap_problems
from wavefront.workbench.distributed.train.presets import PRESETS, build_config
from wavefront.workbench.distributed.train.recompute import POLICIES
from wavefront.workbench.distributed.train.store import check_store
from wavefront.workbench.distributed.train.vocabulary import DTYPES, VARIANTS
from wavefront.workbench.hardware import get_gpu

if TYPE_CHECKING:  # config.py calls validate(); importing it here would only serve the annotation
    from wavefront.workbench.distributed.train.config import TrainConfig

def validate(cfg: TrainConfig, world_size: int) -> None:
    """Raise ConfigError naming the first problem of `cfg` on a launch of `world_size` ranks."""
    _inputs(cfg)
    _sizes(cfg)
    _parallel(cfg, world_size)
    _numerics(cfg)
    _variants(cfg)
    _checkpointing(cfg)
    _outputs(cfg, world_size)
    _fp8(cfg, world_size)
    _overlap(cfg, world_size)
    _patch(cfg)


def _inputs(cfg: TrainConfig) -> None:
    model_path = Path(cfg.model)
    if cfg.model not in PRESETS and not model_path.is_dir():
        raise ConfigError(f"--model: unknown preset {cfg.model!r} and no such directory; presets: "
                          f"{', '.join(PRESETS)}")
    if model_path.is_dir() and not (model_path / "config.json").is_file():
        raise ConfigError(f"--model: directory {cfg.model!r} has no config.json")
    if cfg.data != "synthetic" and not Path(cfg.data).is_file():
        raise ConfigError(f"--data: file {cfg.data!r} does not exist (or pass 'synthetic')")
    if cfg.token_dtype not in ("uint16", "uint32"):
        raise ConfigError(f"--token-dtype must be uint16 or uint32, got {cfg.token_dtype!r}")


def _sizes(cfg: TrainConfig) -> None:
    for name in ("seq_len", "global_batch", "micro_batch", "steps"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    if not 0 <= cfg.warmup_steps < cfg.steps:
        raise ConfigError(f"--warmup-steps must be in [0, steps), got {cfg.warmup_steps} with --steps {cfg.steps}")
    if cfg.lr <= 0:
        raise ConfigError(f"--lr must be > 0, got {cfg.lr}")


def _parallel(cfg: TrainConfig, world_size: int) -> None:
    """The ``--parallel`` name against the launch; the mesh and expert-parallel checks of the layout."""
    run = cfg.run_layout(world_size)  # the name's own checks (mesh.resolve)
    if run.as_mesh:
        _mesh(cfg, world_size)
    elif cfg.global_batch % (world_size * cfg.micro_batch):
        raise ConfigError(f"--global-batch {cfg.global_batch} is not divisible by world size x micro-batch = "
                          f"{world_size} x {cfg.micro_batch} = {world_size * cfg.micro_batch}")
    if cfg.ep != 1:
        if cfg.patch_options and not cfg.patch_options.get("moe"):
            raise ConfigError("--ep splits the experts of the wavefront MoE patch: keep moe in --patch-ops")
        expert_parallel.validate(cfg.ep, run.layout, cfg.variants, build_config(cfg.model))


def _mesh(cfg: TrainConfig, world_size: int) -> None:
    other = [v for v in cfg.variants if v in ("compile", "liger")]
    if other and not (cfg.async_tp and other == ["compile"]) and (cfg.tp > 1 or cfg.pp > 1 or cfg.cp > 1):
        raise ConfigError(f"--compare {','.join(other)} with --tp/--pp/--cp: only the baseline and wavefront "
                          f"variants run on tensor-, pipeline- and context-parallel meshes")
    if cfg.pp > 1 and (cfg.checkpoint_every or cfg.resume):
        raise ConfigError("--pp: checkpointing a pipeline's stages is not supported yet; drop --checkpoint-every "
                          "and --resume")
    if cfg.pp > 1 and cfg.attn_implementation != "sdpa":
        raise ConfigError("--pp: pipeline stages pass no attention mask, so they need --attn-implementation sdpa "
                          "(causal without a mask)")
    mesh.validate(cfg.layout(), world_size, build_config(cfg.model), seq_len=cfg.seq_len,
                  global_batch=cfg.global_batch, micro_batch=cfg.micro_batch)


def _numerics(cfg: TrainConfig) -> None:
    if cfg.dtype not in DTYPES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {cfg.dtype!r}")
    if cfg.recompute not in POLICIES:
        raise ConfigError(f"--recompute must be one of {', '.join(POLICIES)}, got {cfg.recompute!r}")
    if cfg.activation_checkpointing and cfg.recompute not in ("none", "full"):
        raise ConfigError(f"--activation-checkpointing is --recompute full; it contradicts --recompute "
                          f"{cfg.recompute}")
    if cfg.attn_implementation not in ("sdpa", "eager"):
        raise ConfigError(f"--attn-implementation must be sdpa or eager, got {cfg.attn_implementation!r}")


def _variants(cfg: TrainConfig) -> None:
    if not cfg.variants or any(v not in VARIANTS for v in cfg.variants):
        raise ConfigError(f"--compare: variants must be among {', '.join(VARIANTS)}, got {','.join(cfg.variants)}")
    if len(set(cfg.variants)) != len(cfg.variants) or {"baseline", "eager"} <= set(cfg.variants):
        raise ConfigError(f"--compare: each variant once ('baseline' and 'eager' are the same), got "
                          f"{','.join(cfg.variants)}")


def _checkpointing(cfg: TrainConfig) -> None:
    if cfg.checkpoint_every < 0:
        raise ConfigError(f"--checkpoint-every must be >= 0, got {cfg.checkpoint_every}")
    if (cfg.checkpoint_every or cfg.resume) and not cfg.checkpoint_dir:
        raise ConfigError("--checkpoint-every and --resume need --checkpoint-dir")
    if cfg.checkpoint_dir:
        root = Path(cfg.checkpoint_dir)
        check_dir("--checkpoint-dir", root, [root / v for v in cfg.variants])
    if len(cfg.variants) > 1 and (cfg.checkpoint_every or cfg.resume):
        raise ConfigError("--compare measures two back-to-back runs from the same start; checkpointing and "
                          "--resume apply to single-variant runs")


def _outputs(cfg: TrainConfig, world_size: int) -> None:
    """Profiling, KPI inputs, the results store, the timeout and the test aids."""
    if cfg.profile_steps is not None:
        a, b = cfg.profile_steps
        if not 0 <= a <= b < cfg.steps:
            raise ConfigError(f"--profile-steps {a}-{b} must lie within [0, {cfg.steps - 1}]")
    if cfg.peak_tflops is not None and cfg.peak_tflops <= 0:
        raise ConfigError(f"--peak-tflops must be > 0, got {cfg.peak_tflops}")
    if cfg.price_per_hour is not None and cfg.price_per_hour < 0:
        raise ConfigError(f"--price-per-hour must be >= 0, got {cfg.price_per_hour}")
    if cfg.gpu is not None:
        try:
            get_gpu(cfg.gpu)
        except ValueError as e:
            raise ConfigError(f"--gpu: {e}") from None
    if cfg.store and Path(cfg.store).is_dir():
        raise ConfigError(f"--store: {cfg.store!r} is a directory; give the path of an SQLite results file")
    if cfg.store:
        try:
            check_store(cfg.store)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if cfg.timeout_s <= 0:
        raise ConfigError(f"--timeout must be > 0 seconds, got {cfg.timeout_s}")
    if cfg.inject_failure is not None and not 0 <= cfg.inject_failure[0] < world_size:
        raise ConfigError(f"--inject-failure rank {cfg.inject_failure[0]} is outside the {world_size} launched "
                          f"ranks")


def _fp8(cfg: TrainConfig, world_size: int) -> None:
    if cfg.fp8 is not None:
        if cfg.fp8 not in RECIPES:
            raise ConfigError(f"--fp8 must be one of {', '.join(RECIPES)}, got {cfg.fp8!r}")
        if "wavefront" not in cfg.variants:
            raise ConfigError("--fp8 patches the wavefront variant, which this run does not train (drop "
                              "--no-patch, or add wavefront to --compare)")
        if cfg.dtype == "fp32" or (cfg.dtype == "auto" and not torch.cuda.is_available()):
            raise ConfigError("--fp8 needs bf16 compute (FP8 layers take bf16 weights and inputs): pass --dtype "
                              "bf16" + (" (auto is fp32 on a CPU)" if cfg.dtype == "auto" else ""))
    if why := all_gather_problem(cfg, cfg.run_layout(world_size).layout):
        raise ConfigError(why)


def _overlap(cfg: TrainConfig, world_size: int) -> None:
    why = overlap_problems(fsdp_prefetch=cfg.fsdp_prefetch, reshard_after_forward=cfg.reshard_after_forward,
                           async_tp=cfg.async_tp, layout=cfg.run_layout(world_size).layout, variants=cfg.variants,
                           cuda=torch.cuda.is_available())
    if why:
        raise ConfigError("; ".join(why))


def _patch(cfg: TrainConfig) -> None:
    unknown = set(cfg.patch_options) - set(OPS)
    if unknown:
        raise ConfigError(f"--patch-ops: unknown op(s) {', '.join(sorted(unknown))}; ops: {', '.join(OPS)}")
    if cfg.model in PRESETS:
        max_pos = PRESETS[cfg.model].config.get("max_position_embeddings")
        if max_pos and cfg.seq_len > max_pos:
            raise ConfigError(f"--seq-len {cfg.seq_len} exceeds the model's max_position_embeddings {max_pos}")


def check_dir(option: str, root: Path, subdirs: list[Path]) -> None:
    """A directory the run will create or use: no file in the way, and writable where it exists."""
    for path in (root, *subdirs):
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{option}: {str(path)!r} is a file, not a directory")
    existing = next((p for p in (root, *root.resolve().parents) if p.exists()), None)
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{option}: {str(root)!r} cannot be created or written ({existing} is not writable)")
