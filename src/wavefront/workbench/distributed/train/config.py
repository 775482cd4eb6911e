"""The training harness's configuration, checked in full before any work starts.

Every rank validates the same config against the launch (``WORLD_SIZE`` from torchrun), so a bad
configuration stops all ranks at once with one clear message, before a model is built or a collective
is issued: unknown preset, missing data file, a global batch that world size x micro-batch does not
divide, a parallel plan that does not fit the number of processes, and so on.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from wavefront.workbench.distributed.train.overlap import parse_reshard, problems
from wavefront.workbench.distributed.train.presets import PRESETS, build_config
from wavefront.workbench.distributed.train.store import check_store
from wavefront.workbench.hardware import get_gpu

PARALLEL_PLANS = ("auto", "single", "ddp", "fsdp2", "mesh")
DTYPES = ("auto", "fp32", "bf16")
#: What ``--compare`` can run side by side: Hugging Face's own PyTorch code ("baseline", or "eager" by the
#: name users know it under), ``torch.compile`` of that model, Liger-Kernel's patch (when installed), and
#: wavefront's patch.
VARIANTS = ("baseline", "eager", "compile", "liger", "wavefront")


class ConfigError(ValueError):
    """A configuration that cannot run; raised before any work starts."""


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

    def as_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self)))

    def uses_mesh_options(self) -> bool:
        return self.plan is not None or self.dp_shard > 0 or any(
            getattr(self, n) != 1 for n in ("tp", "pp", "cp", "dp_replicate", "vpp"))

    @property
    def recompute_policy(self) -> str:
        """The recompute policy this run applies (--activation-checkpointing is --recompute full)."""
        return "full" if self.activation_checkpointing else self.recompute

    def resolve_parallel(self, world_size: int) -> str:
        if self.parallel == "auto":
            if self.uses_mesh_options():
                return "mesh"
            return "single" if world_size == 1 else "ddp"
        return self.parallel

    def layout(self):
        """The mesh layout of these options (unresolved: dp_shard may be 0)."""
        from wavefront.workbench.distributed.train.mesh import Layout  # lazy: import cycle

        source = f"plan {self.plan} rank {self.plan_rank}" if self.plan else "options"
        return Layout(self.tp, self.pp, self.cp, self.dp_shard, self.dp_replicate, self.vpp, self.pp_schedule,
                      source)

    def grad_accum_mesh(self, dp: int) -> int:
        return self.global_batch // (dp * self.micro_batch)

    def grad_accum(self, world_size: int) -> int:
        return self.global_batch // (world_size * self.micro_batch)

    def validate(self, world_size: int) -> None:
        """Raise ConfigError naming the problem; called on every rank before any work."""
        def bad(msg: str) -> None:
            raise ConfigError(msg)

        model_path = Path(self.model)
        if self.model not in PRESETS and not model_path.is_dir():
            bad(f"--model: unknown preset {self.model!r} and no such directory; presets: {', '.join(PRESETS)}")
        if model_path.is_dir() and not (model_path / "config.json").is_file():
            bad(f"--model: directory {self.model!r} has no config.json")
        if self.data != "synthetic" and not Path(self.data).is_file():
            bad(f"--data: file {self.data!r} does not exist (or pass 'synthetic')")
        if self.token_dtype not in ("uint16", "uint32"):
            bad(f"--token-dtype must be uint16 or uint32, got {self.token_dtype!r}")
        for name in ("seq_len", "global_batch", "micro_batch", "steps"):
            if getattr(self, name) < 1:
                bad(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.warmup_steps < self.steps:
            bad(f"--warmup-steps must be in [0, steps), got {self.warmup_steps} with --steps {self.steps}")
        if self.lr <= 0:
            bad(f"--lr must be > 0, got {self.lr}")
        if self.parallel not in PARALLEL_PLANS:
            bad(f"--parallel must be one of {', '.join(PARALLEL_PLANS)}, got {self.parallel!r}")
        plan = self.resolve_parallel(world_size)
        if plan != "mesh" and self.uses_mesh_options():
            bad(f"--tp/--pp/--cp/--dp-shard/--dp-replicate/--vpp/--plan build a device mesh: use --parallel auto or "
                f"mesh, not {plan}")
        if plan == "mesh":
            self._validate_mesh(world_size)
        if self.ep != 1:
            self._validate_ep(world_size, plan)
        if plan == "single" and world_size != 1:
            bad(f"--parallel single runs one process, but {world_size} were launched; use ddp or fsdp2")
        if plan in ("ddp", "fsdp2") and world_size < 2:
            bad(f"--parallel {plan} needs at least 2 processes; launch with torchrun --nproc_per_node=N "
                f"(or wavefront train --nproc-per-node N), or use --parallel single")
        if plan != "mesh" and self.global_batch % (world_size * self.micro_batch):
            bad(f"--global-batch {self.global_batch} is not divisible by world size x micro-batch = "
                f"{world_size} x {self.micro_batch} = {world_size * self.micro_batch}")
        if self.dtype not in DTYPES:
            bad(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        from wavefront.workbench.distributed.train.recompute import POLICIES  # lazy: torch-free import

        if self.recompute not in POLICIES:
            bad(f"--recompute must be one of {', '.join(POLICIES)}, got {self.recompute!r}")
        if self.activation_checkpointing and self.recompute not in ("none", "full"):
            bad(f"--activation-checkpointing is --recompute full; it contradicts --recompute {self.recompute}")
        if self.attn_implementation not in ("sdpa", "eager"):
            bad(f"--attn-implementation must be sdpa or eager, got {self.attn_implementation!r}")
        if not self.variants or any(v not in VARIANTS for v in self.variants):
            bad(f"--compare: variants must be among {', '.join(VARIANTS)}, got {','.join(self.variants)}")
        if len(set(self.variants)) != len(self.variants) or {"baseline", "eager"} <= set(self.variants):
            bad(f"--compare: each variant once ('baseline' and 'eager' are the same), got {','.join(self.variants)}")
        if self.checkpoint_every < 0:
            bad(f"--checkpoint-every must be >= 0, got {self.checkpoint_every}")
        if (self.checkpoint_every or self.resume) and not self.checkpoint_dir:
            bad("--checkpoint-every and --resume need --checkpoint-dir")
        if self.checkpoint_dir:
            root = Path(self.checkpoint_dir)
            _check_dir("--checkpoint-dir", root, [root / v for v in self.variants])
        if len(self.variants) > 1 and (self.checkpoint_every or self.resume):
            bad("--compare measures two back-to-back runs from the same start; checkpointing and --resume apply "
                "to single-variant runs")
        if self.profile_steps is not None:
            a, b = self.profile_steps
            if not 0 <= a <= b < self.steps:
                bad(f"--profile-steps {a}-{b} must lie within [0, {self.steps - 1}]")
        if self.peak_tflops is not None and self.peak_tflops <= 0:
            bad(f"--peak-tflops must be > 0, got {self.peak_tflops}")
        if self.price_per_hour is not None and self.price_per_hour < 0:
            bad(f"--price-per-hour must be >= 0, got {self.price_per_hour}")
        if self.gpu is not None:
            try:
                get_gpu(self.gpu)
            except ValueError as e:
                bad(f"--gpu: {e}")
        if self.store and Path(self.store).is_dir():
            bad(f"--store: {self.store!r} is a directory; give the path of an SQLite results file")
        if self.store:
            try:
                check_store(self.store)
            except ValueError as e:
                bad(str(e))
        if self.timeout_s <= 0:
            bad(f"--timeout must be > 0 seconds, got {self.timeout_s}")
        if self.inject_failure is not None and not 0 <= self.inject_failure[0] < world_size:
            bad(f"--inject-failure rank {self.inject_failure[0]} is outside the {world_size} launched ranks")
        if self.fp8 is not None:
            self._validate_fp8()
        from wavefront.workbench.distributed.train.fp8 import all_gather_problem  # lazy: torch-free import

        if why := all_gather_problem(self, world_size, plan):
            bad(why)
        self._validate_overlap(world_size, plan)
        from wavefront.patching.table import OPS  # lazy: torch-free import

        unknown = set(self.patch_options) - set(OPS)
        if unknown:
            bad(f"--patch-ops: unknown op(s) {', '.join(sorted(unknown))}; ops: {', '.join(OPS)}")
        if self.model in PRESETS:
            max_pos = PRESETS[self.model].config.get("max_position_embeddings")
            if max_pos and self.seq_len > max_pos:
                bad(f"--seq-len {self.seq_len} exceeds the model's max_position_embeddings {max_pos}")

    def _validate_ep(self, world_size: int, plan: str) -> None:
        from wavefront.workbench.distributed.train import expert_parallel  # lazy: import cycle

        if self.patch_options and not self.patch_options.get("moe"):
            raise ConfigError("--ep splits the experts of the wavefront MoE patch: keep moe in --patch-ops")
        expert_parallel.validate(self.ep, world_size, plan, self.variants, build_config(self.model))

    def _validate_fp8(self) -> None:
        import torch  # lazy: torch-free import

        from wavefront.patching.fp8 import RECIPES  # lazy: torch-free import

        if self.fp8 not in RECIPES:
            raise ConfigError(f"--fp8 must be one of {', '.join(RECIPES)}, got {self.fp8!r}")
        if "wavefront" not in self.variants:
            raise ConfigError("--fp8 patches the wavefront variant, which this run does not train (drop --no-patch, "
                              "or add wavefront to --compare)")
        if self.dtype == "fp32" or (self.dtype == "auto" and not torch.cuda.is_available()):
            raise ConfigError("--fp8 needs bf16 compute (FP8 layers take bf16 weights and inputs): pass --dtype bf16"
                              + (" (auto is fp32 on a CPU)" if self.dtype == "auto" else ""))

    def _validate_overlap(self, world_size: int, plan: str) -> None:
        import torch  # lazy: torch-free import

        why = problems(fsdp_prefetch=self.fsdp_prefetch, reshard_after_forward=self.reshard_after_forward,
                       async_tp=self.async_tp, plan=plan, variants=self.variants, cuda=torch.cuda.is_available(),
                       layout=self.layout().resolved(world_size) if plan == "mesh" else None)
        if why:
            raise ConfigError("; ".join(why))

    def _validate_mesh(self, world_size: int) -> None:
        from wavefront.workbench.distributed.train import mesh  # lazy: import cycle

        other = [v for v in self.variants if v in ("compile", "liger")]
        if other and not (self.async_tp and other == ["compile"]) and (self.tp > 1 or self.pp > 1 or self.cp > 1):
            raise ConfigError(f"--compare {','.join(other)} with --tp/--pp/--cp: only the baseline and wavefront "
                              f"variants run on tensor-, pipeline- and context-parallel meshes")
        if self.pp > 1 and (self.checkpoint_every or self.resume):
            raise ConfigError("--pp: checkpointing a pipeline's stages is not supported yet; drop --checkpoint-every "
                              "and --resume")
        if self.pp > 1 and self.attn_implementation != "sdpa":
            raise ConfigError("--pp: pipeline stages pass no attention mask, so they need --attn-implementation sdpa "
                              "(causal without a mask)")
        mesh.validate(self.layout(), world_size, build_config(self.model), seq_len=self.seq_len,
                      global_batch=self.global_batch, micro_batch=self.micro_batch)


def apply_plan(cfg: TrainConfig) -> TrainConfig:
    """`cfg` with the degrees and micro-batch of plan number ``cfg.plan_rank`` of the ``--plan`` file."""
    from wavefront.workbench.distributed.train.mesh import read_plan  # lazy: import cycle

    if cfg.plan is None:
        return cfg
    if cfg.plan_rank < 0:
        raise ConfigError(f"--plan-rank must be >= 0, got {cfg.plan_rank}")
    lay, micro, doc = read_plan(cfg.plan, cfg.plan_rank)
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


def _check_dir(option: str, root: Path, subdirs: list[Path]) -> None:
    """A directory the run will create or use: no file in the way, and writable where it exists."""
    for path in (root, *subdirs):
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{option}: {str(path)!r} is a file, not a directory")
    existing = next((p for p in (root, *root.resolve().parents) if p.exists()), None)
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{option}: {str(root)!r} cannot be created or written ({existing} is not writable)")


def parse_patch_ops(text: str) -> dict[str, bool]:
    """"rms_norm,rope" -> every patchable op on or off (see wavefront.patching.table)."""
    from wavefront.patching.table import OPS  # lazy: torch-free import

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
