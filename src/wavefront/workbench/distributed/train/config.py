"""The training harness's configuration, checked in full before any work starts.

Every rank validates the same config against the launch (``WORLD_SIZE`` from torchrun), so a bad
configuration stops all ranks at once with one clear message, before a model is built or a collective
is issued: unknown preset, missing data file, a global batch that world size x micro-batch does not
divide, a parallel plan that does not fit the number of processes, and so on.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from pathlib import Path

from wavefront.workbench.distributed.train.errors import ConfigError
from wavefront.workbench.distributed.train.mesh import Layout, RunLayout, read_plan, resolve
from wavefront.workbench.distributed.train.overlap import parse_reshard
from wavefront.workbench.distributed.train.vocabulary import DTYPES, PARALLEL_PLANS, VARIANTS

__all__ = ["DTYPES", "PARALLEL_PLANS", "VARIANTS", "ConfigError", "TrainConfig", "apply_plan", "json_dest_problem",
           "parse_patch_ops", "parse_rank_step", "parse_step_range", "parse_variants"]


@dataclass(frozen=True)
class TrainConfig:
    model: str = "tiny-llama"  # preset name or local directory with config.json
    data: str = "synthetic"  # "synthetic" or a local .txt / .npy / .bin file
    token_dtype: str = "uint16"  # for .bin token files
    seq_len: int = 32
    global_batch: int = 8  # sequences per optimizer step, all ranks and micro-batches together
    micro_batch: int = 2  # sequences per forward/backward on one rank
    steps: int = 10
    warmup_steps: int = 1  # first steps left out of the summary KPIs (allocator, autotune, interpreter warm-up)
    lr: float = 1e-3
    seed: int = 0
    parallel: str = "auto"
    activation_checkpointing: bool = False  # the old flag: the same as recompute "full"
    recompute: str = "none"  # activation recompute policy (train/recompute.py POLICIES)
    dtype: str = "auto"  # auto: bf16 autocast on GPU, fp32 on CPU
    attn_implementation: str = "sdpa"
    variants: tuple[str, ...] = ("wavefront",)  # ("baseline", "wavefront") with --compare; see VARIANTS
    patch_options: dict = field(default_factory=dict)
    strict_patch: bool = False
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    profile_steps: tuple[int, int] | None = None  # inclusive step range traced with torch.profiler
    out_dir: str = "runs/train"
    store: str | None = "wavefront-results.sqlite"
    gpu: str | None = None  # device-table key overriding detection (peak FLOPs, power, price)
    peak_tflops: float | None = None  # dense peak per device, overrides the table / the CPU measurement
    price_per_hour: float | None = None  # $ per device-hour, overrides the table's dated default
    timeout_s: float = 300.0  # collective timeout: a dead or stuck rank ends the job instead of hanging it
    inject_failure: tuple[int, int] | None = None  # (rank, step): that rank raises in its forward (tests)
    inject_nan: int | None = None  # step whose loss is made NaN on every rank (tests)
    # The device mesh (parallel "mesh"; see mesh.py): degrees per dimension, dp_shard 0 = the ranks left over.
    tp: int = 1
    pp: int = 1
    cp: int = 1
    dp_shard: int = 0
    dp_replicate: int = 1
    vpp: int = 1
    pp_schedule: str = "1f1b"
    plan: str | None = None  # a `wavefront plan --json` file the degrees were read from (apply_plan)
    plan_rank: int = 0
    ep: int = 1  # expert-parallel degree over the data-parallel ranks (MoE models; train/expert_parallel.py)
    fp8: str | None = None  # FP8 recipe of the wavefront variant (wavefront.patching.fp8.RECIPES); train/fp8.py
    fp8_all_gather: bool = False  # FSDP2 all-gathers the FP8 layers' weights in FP8 (train/fp8.py)
    # Overlap (train/overlap.py): FSDP2 explicit prefetch depth and reshard_after_forward, async TP.
    fsdp_prefetch: int = 0
    reshard_after_forward: bool | int = True
    async_tp: bool = False

    def __post_init__(self) -> None:
        with contextlib.suppress(ValueError):  # the CLI passes "true"/"false"/"K"; validate() names a bad one
            object.__setattr__(self, "reshard_after_forward", parse_reshard(self.reshard_after_forward))

    def uses_mesh_options(self) -> bool:
        return self.plan is not None or self.dp_shard > 0 or any(
            getattr(self, n) != 1 for n in ("tp", "pp", "cp", "dp_replicate", "vpp"))

    @property
    def recompute_policy(self) -> str:
        """The recompute policy this run applies (--activation-checkpointing is --recompute full)."""
        return "full" if self.activation_checkpointing else self.recompute

    def layout(self) -> Layout:
        """The mesh layout of these options (unresolved: dp_shard may be 0)."""
        source = f"plan {self.plan} rank {self.plan_rank}" if self.plan else "options"
        return Layout(tp=self.tp, pp=self.pp, cp=self.cp, dp_shard=self.dp_shard, dp_replicate=self.dp_replicate,
                      vpp=self.vpp, pp_schedule=self.pp_schedule, source=source, ep=self.ep)

    def run_layout(self, world_size: int) -> RunLayout:
        """The layout this launch runs: the mesh options, or the degenerate mesh ``--parallel`` names (mesh.resolve,
        the one reading of the name; raises ConfigError where it does not fit the launch)."""
        return resolve(self.parallel, self.layout(), world_size, mesh_options=self.uses_mesh_options())

    def grad_accum_mesh(self, dp: int) -> int:
        return self.global_batch // (dp * self.micro_batch)

    def grad_accum(self, world_size: int) -> int:
        return self.global_batch // (world_size * self.micro_batch)

    def validate(self, world_size: int) -> None:
        """Raise ConfigError naming the problem; called on every rank before any work (checks.py)."""
        # function-local: checks.py imports torch (via the dimensions' own checks); this module stays torch-free,
        # the CLI's launching process reads it before torchrun starts the ranks
        from wavefront.workbench.distributed.train.checks import validate  # lazy: torch-free import

        validate(self, world_size)


def apply_plan(cfg: TrainConfig) -> TrainConfig:
    """`cfg` with the degrees and micro-batch of plan number ``cfg.plan_rank`` of the ``--plan`` file."""
    if cfg.plan is None:
        return cfg
    if cfg.plan_rank < 0:
        raise ConfigError(f"--plan-rank must be >= 0, got {cfg.plan_rank}")
    lay, micro, doc = read_plan(cfg.plan, cfg.plan_rank)
    # function-local: recompute.py imports torch, which this module (read by the launching process) does not need
    from wavefront.workbench.distributed.train.recompute import from_plan  # lazy: torch-free import

    planned = from_plan(doc["plans"][cfg.plan_rank]["config"].get("recompute", "none"))
    # the plan's policy unless the command line asked for one (selective runs as none: recompute.from_plan)
    chosen = cfg.recompute if cfg.recompute != "none" or cfg.activation_checkpointing else planned
    return replace(cfg, tp=lay.tp, pp=lay.pp, cp=lay.cp, dp_shard=lay.dp_shard, dp_replicate=lay.dp_replicate,
                   vpp=lay.vpp, pp_schedule=lay.pp_schedule, micro_batch=micro, recompute=chosen)


def json_dest_problem(dest: str | None) -> str | None:
    """Why a --json destination cannot be written (checked before the run by opening it), or None."""
    if dest in (None, "-"):
        return None
    path, existed = Path(dest), Path(dest).exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.open("a").close()
    except OSError as e:
        why = "a file is in the path" if isinstance(e, FileExistsError | NotADirectoryError) else e.strerror or e
        return f"--json: cannot write {dest!r}: {why}"
    if not existed:
        path.unlink()
    return None


def parse_patch_ops(text: str) -> dict[str, bool]:
    """"rms_norm,rope" -> every patchable op on or off (see wavefront.patching.table)."""
    from wavefront.patching.table import OPS  # lazy: torch-free import (the patch table imports torch)

    wanted = {o.strip() for o in text.split(",") if o.strip()}
    unknown = wanted - set(OPS)
    if unknown:
        raise ConfigError(f"--patch-ops: unknown op(s) {', '.join(sorted(unknown))}; ops: {', '.join(OPS)}")
    return {op: op in wanted for op in OPS}


def parse_variants(text: str | None) -> tuple[str, ...]:
    """``--compare`` alone -> baseline and wavefront; ``--compare eager,compile,liger,wavefront`` -> those."""
    if text is None:
        return ("baseline", "wavefront")
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        raise ConfigError(f"--compare: unknown variant(s) {', '.join(unknown) or repr(text)} (known: "
                          f"{','.join(VARIANTS)})")
    return names


def parse_step_range(text: str) -> tuple[int, int]:
    """"3" -> (3, 3); "3-5" -> (3, 5)."""
    try:
        a, _, b = text.partition("-")
        return int(a), int(b or a)
    except ValueError:
        raise ConfigError(f"--profile-steps: expected STEP or FIRST-LAST, got {text!r}") from None


def parse_rank_step(text: str) -> tuple[int, int]:
    """"1:3" -> rank 1, step 3."""
    try:
        r, s = text.split(":")
        return int(r), int(s)
    except ValueError:
        raise ConfigError(f"--inject-failure: expected RANK:STEP, got {text!r}") from None
