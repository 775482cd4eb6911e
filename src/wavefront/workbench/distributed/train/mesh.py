"""The parallel layout of a training run: degrees per named dimension, checked in full before any work,
and the one DeviceMesh built from them.

Dimension order, outermost first (torchtitan's and Megatron's): ``pp``, ``dp_replicate``, ``dp_shard``,
``cp``, ``tp``, so tensor parallelism spans the closest ranks (on a GPU node: NVLink). The world size is
the product of the degrees. Data parallelism is FSDP2 over ``dp_shard`` and HSDP when ``dp_replicate``
> 1 (replicas of the shard group); each data-parallel rank reads its own slice of the global batch,
tensor- and pipeline-parallel peers read the same one.

A layout comes from options (``--tp --pp --cp --dp-shard --dp-replicate --vpp --pp-schedule``) or from a
plan of ``wavefront plan --json`` (:func:`from_plan_document`); :func:`resolve` turns a ``--parallel`` name into
the layout it stands for (the only place the name is read); :func:`validate` checks a layout against the
launch, the model and the batch and raises ConfigError naming the option and the numbers.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from wavefront.workbench.distributed.train.errors import ConfigError
from wavefront.workbench.distributed.train.vocabulary import PARALLEL_PLANS

#: Mesh dimension names, outermost first.
DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
#: Pipeline schedules (torch.distributed.pipelining classes): one stage per rank for "1f1b" and "gpipe",
#: `vpp` stages per rank for the interleaved and zero-bubble ones.
PP_SCHEDULES = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe", "interleaved-1f1b": "ScheduleInterleaved1F1B",
                "interleaved-zb": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble"}
MULTI_STAGE = ("interleaved-1f1b", "interleaved-zb", "zbv")


@dataclass(frozen=True)
class Layout:
    """Degrees per mesh dimension; ``dp_shard = 0`` means "the ranks left over" (resolved by
    :meth:`resolved`)."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    dp_shard: int = 0
    dp_replicate: int = 1
    vpp: int = 1  # pipeline stages (model chunks) per rank
    pp_schedule: str = "1f1b"
    source: str = "options"  # "options" or "plan FILE rank K: LABEL"
    ep: int = 1  # expert parallelism: the experts split over groups of `ep` data-parallel ranks (not a mesh dimension)

    def resolved(self, world_size: int) -> Layout:
        if self.dp_shard:
            return self
        rest = self.tp * self.pp * self.cp * self.dp_replicate
        if rest < 1 or world_size % rest:
            raise ConfigError(f"world size {world_size} is not divisible by tp x pp x cp x dp-replicate = "
                              f"{self.tp} x {self.pp} x {self.cp} x {self.dp_replicate} = {rest}")
        return replace(self, dp_shard=world_size // rest)

    @property
    def degrees(self) -> dict[str, int]:
        return {"pp": self.pp, "dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "cp": self.cp,
                "tp": self.tp}

    @property
    def world_size(self) -> int:
        n = 1
        for d in self.degrees.values():
            n *= d
        return n

    @property
    def dp(self) -> int:
        """Data-parallel replicas of the batch (each reads its own slice)."""
        return self.dp_replicate * self.dp_shard

    @property
    def replicates_only(self) -> bool:
        """Data parallelism without sharding and nothing else split: DDP's all-reduce, not FSDP2."""
        return self.dp_shard == 1 and self.dp_replicate > 1 and self.tp == self.cp == self.pp == 1

    @property
    def shards(self) -> bool:
        """FSDP2 wraps the model (and gives it bf16 parameters for compute under bf16)."""
        return self.dp > 1 and not self.replicates_only

    @property
    def n_stages(self) -> int:
        return self.pp * self.vpp

    def label(self) -> str:
        parts = [f"{k}{v}" for k, v in self.degrees.items() if v > 1]
        if self.pp > 1:
            parts.append(f"{self.pp_schedule}" + (f" v{self.vpp}" if self.vpp > 1 else ""))
        return " ".join(parts) or "single"

    def as_dict(self) -> dict:
        return asdict(self) | {"world_size": self.world_size, "dp": self.dp, "label": self.label()}


def check_degrees(layout: Layout) -> None:
    """Each degree and the schedule on their own, before the layout is resolved against the launch."""
    for name in ("tp", "pp", "cp", "dp_replicate", "vpp"):
        if getattr(layout, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(layout, name)}")
    if layout.dp_shard < 0:
        raise ConfigError(f"--dp-shard must be >= 1 (or 0: the ranks left over), got {layout.dp_shard}")
    if layout.pp_schedule not in PP_SCHEDULES:
        raise ConfigError(f"--pp-schedule must be one of {', '.join(PP_SCHEDULES)}, got {layout.pp_schedule!r}")


_CP_FAMILIES = ("llama", "qwen2", "qwen3", "mistral")  # train/context_parallel.py FAMILIES


def validate(layout: Layout, world_size: int, model_config, *, seq_len: int, global_batch: int,
             micro_batch: int) -> Layout:
    """The resolved layout, or ConfigError naming what does not fit (called on every rank before work)."""
    check_degrees(layout)
    lay = layout.resolved(world_size)
    if lay.world_size != world_size:
        shape = " x ".join(f"{k} {v}" for k, v in lay.degrees.items())
        raise ConfigError(f"the mesh {shape} = {lay.world_size} ranks, but {world_size} were launched")
    if lay.cp > 1 and getattr(model_config, "model_type", None) not in _CP_FAMILIES:
        raise ConfigError(f"--cp > 1: ring attention is wired for the Llama-like families "
                          f"({', '.join(_CP_FAMILIES)}), not {getattr(model_config, 'model_type', None)!r}")
    if lay.cp > 1 and seq_len % (2 * lay.cp):
        raise ConfigError(f"--seq-len {seq_len} is not divisible by 2 x cp = {2 * lay.cp} (the zig-zag layout "
                          f"gives each cp rank two chunks)")
    if lay.vpp > 1 and lay.pp_schedule not in MULTI_STAGE:
        raise ConfigError(f"--vpp {lay.vpp} needs a multi-stage schedule ({', '.join(MULTI_STAGE)}), got "
                          f"--pp-schedule {lay.pp_schedule}")
    if lay.pp > 1 and lay.pp_schedule in MULTI_STAGE and lay.vpp < 2:
        raise ConfigError(f"--pp-schedule {lay.pp_schedule} runs several stages per rank: give --vpp >= 2")
    if lay.pp_schedule == "zbv" and lay.vpp != 2:
        raise ConfigError(f"--pp-schedule zbv runs exactly 2 stages per rank (a V), got --vpp {lay.vpp}")
    _check_model(lay, model_config, seq_len)
    _check_batch(lay, global_batch, micro_batch)
    return lay


def _check_model(lay: Layout, c, seq_len: int) -> None:
    heads = c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", None) or heads
    checks = [("attention heads", heads, lay.tp, "--tp"), ("KV heads", kv, lay.tp, "--tp"),
              ("intermediate size", getattr(c, "intermediate_size", lay.tp), lay.tp, "--tp"),
              ("vocabulary", c.vocab_size, lay.tp, "--tp")]
    for what, n, degree, option in checks:
        if n % degree:
            raise ConfigError(f"{option} {degree}: the model's {what} ({n}) is not divisible by {degree}")
    if seq_len % (lay.tp * lay.cp):
        raise ConfigError(f"--seq-len {seq_len} is not divisible by tp x cp = {lay.tp} x {lay.cp} (sequence and "
                          f"context parallelism split the sequence)")
    if lay.n_stages > c.num_hidden_layers:
        raise ConfigError(f"--pp {lay.pp} x --vpp {lay.vpp} = {lay.n_stages} stages, but the model has only "
                          f"{c.num_hidden_layers} layers")
    if lay.pp > 1 and getattr(c, "tie_word_embeddings", False):  # (tp shards the tied table once: tensor_parallel.py)
        raise ConfigError("--pp: the model ties its embedding and LM head weights (first and last stage); untied "
                          "models only for now")


def _check_batch(lay: Layout, global_batch: int, micro_batch: int) -> None:
    per = lay.dp * micro_batch
    if global_batch % per:
        raise ConfigError(f"--global-batch {global_batch} is not divisible by data-parallel ranks x micro-batch = "
                          f"{lay.dp} x {micro_batch} = {per}")
    n_micro = global_batch // per
    if lay.pp > 1 and n_micro < lay.pp:
        raise ConfigError(f"--pp {lay.pp}: {n_micro} micro-batch(es) per step cannot fill {lay.pp} stages; raise "
                          f"--global-batch or lower --micro-batch (global batch / (dp x micro-batch) >= pp)")
    if lay.pp > 1 and lay.vpp > 1 and n_micro % lay.pp:
        raise ConfigError(f"--pp-schedule {lay.pp_schedule}: micro-batches per step ({n_micro}) must be a multiple "
                          f"of --pp {lay.pp}")


@dataclass(frozen=True)
class RunLayout:
    """The layout a launch runs and how the run reports it: what :func:`resolve` makes of a ``--parallel``
    name. Everything after resolution reads these fields, never the name."""

    layout: Layout  # resolved for the launch
    name: str  # the --parallel name it resolved to (provenance: checkpoints)
    label: str  # provenance "parallel": the --parallel name, or "mesh <label>"
    document: dict | None  # provenance "layout": the mesh's degrees when asked for as a mesh
    #: asked for as a mesh (not a --parallel name): the mesh-only options and checks apply (checks.py), the run
    #: reports the planner's prediction (predict.py) and, when profiled, the communication per mesh dimension
    as_mesh: bool


def resolve(parallel: str, options: Layout, world_size: int, *, mesh_options: bool) -> RunLayout:
    """The one place a ``--parallel`` name is read: "single", "ddp" and "fsdp2" are degenerate meshes (all
    degrees 1, ``dp_replicate`` = world, ``dp_shard`` = world); "mesh" is `options` resolved for this launch;
    "auto" is "mesh" when a mesh option was given (`mesh_options`), else "single" or "ddp". Raises ConfigError
    where the name does not fit the launch or the options."""
    if parallel not in PARALLEL_PLANS:
        raise ConfigError(f"--parallel must be one of {', '.join(PARALLEL_PLANS)}, got {parallel!r}")
    name = parallel
    if parallel == "auto":
        name = "mesh" if mesh_options else "single" if world_size == 1 else "ddp"
    if name != "mesh" and mesh_options:
        raise ConfigError(f"--tp/--pp/--cp/--dp-shard/--dp-replicate/--vpp/--plan build a device mesh: use "
                          f"--parallel auto or mesh, not {name}")
    if name == "mesh":
        check_degrees(options)
        lay = options.resolved(world_size)
        return RunLayout(lay, name, f"mesh {lay.label()}", lay.as_dict(), as_mesh=True)
    if name == "single" and world_size != 1:
        raise ConfigError(f"--parallel single runs one process, but {world_size} were launched; use ddp or fsdp2")
    if name != "single" and world_size < 2:
        raise ConfigError(f"--parallel {name} needs at least 2 processes; launch with torchrun --nproc_per_node=N "
                          f"(or wavefront train --nproc-per-node N), or use --parallel single")
    replicate, shard = {"single": (1, 1), "ddp": (world_size, 1), "fsdp2": (1, world_size)}[name]
    lay = Layout(dp_shard=shard, dp_replicate=replicate, ep=options.ep, source=f"--parallel {name}")
    return RunLayout(lay, name, name, None, as_mesh=False)


def from_plan_document(doc: dict, rank: int, source: str) -> tuple[Layout, int]:
    """(layout, micro_batch) of plan number `rank` (0 = best) in a ``wavefront.plan/1`` document."""
    if not isinstance(doc, dict) or doc.get("schema") != "wavefront.plan/1":
        raise ConfigError(f"--plan {source}: not a `wavefront plan --json` document (schema "
                          f"{doc.get('schema') if isinstance(doc, dict) else None!r}, expected 'wavefront.plan/1')")
    plans = doc.get("plans") or []
    if not 0 <= rank < len(plans):
        raise ConfigError(f"--plan-rank {rank}: the plan file lists {len(plans)} plan(s) (ranks 0..{len(plans) - 1})")
    c = plans[rank]["config"]
    if int(c.get("ep", 1)) > 1:
        raise ConfigError(f"--plan {source} rank {rank}: expert parallelism (ep {c['ep']}) is not run by this "
                          f"harness; pick a plan with ep 1 (--plan-rank) or pin it (wavefront plan --fix ep=1)")
    dp, zero, shard, cp = int(c["dp"]), int(c.get("zero", 0)), int(c.get("shard", 0)), int(c.get("cp", 1))
    # ZeRO-3 shards over the whole data-parallel group, or over `shard` ranks (HSDP); the other stages keep a
    # full copy of the weights per replica, which FSDP2 runs as HSDP with shard groups of one rank.
    if zero == 3:
        dp_shard = max(1, shard // cp) if 0 < shard < dp * cp else dp
    else:
        dp_shard = 1
    vpp = int(c.get("vpp", 1))
    schedule = ("zbv" if vpp == 2 else "interleaved-zb") if c.get("zero_bubble") else (
        "interleaved-1f1b" if vpp > 1 else "1f1b")
    if c.get("zero_bubble") and vpp == 1:
        schedule, vpp = "zbv", 2
    label = c.get("label", "")
    layout = Layout(tp=int(c["tp"]), pp=int(c["pp"]), cp=cp, dp_shard=dp_shard, dp_replicate=dp // dp_shard,
                    vpp=vpp, pp_schedule=schedule, source=f"plan {source} rank {rank}: {label}")
    return layout, int(c.get("micro_batch", 1))


def read_plan(path: str, rank: int) -> tuple[Layout, int, dict]:
    """Read a plan document from a file or ``-`` (stdin); (layout, micro_batch, the document)."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"--plan: cannot read {path!r}: {e.strerror or e}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--plan {path}: not JSON ({e.msg} at line {e.lineno})") from None
    layout, micro = from_plan_document(doc, rank, path)
    return layout, micro, doc


def build_mesh(layout: Layout, device_type: str):
    """One DeviceMesh with every dimension named (size-1 dimensions included, so code can always slice)."""
    # function-local: this module is torch-free (config.py, read by the launching process, imports it)
    from torch.distributed.device_mesh import init_device_mesh  # lazy: torch-free import

    return init_device_mesh(device_type, tuple(layout.degrees.values()), mesh_dim_names=DIMS)


def coordinates(mesh) -> dict[str, int]:
    """This rank's index along each named dimension."""
    return {name: mesh[name].get_local_rank() for name in DIMS}
