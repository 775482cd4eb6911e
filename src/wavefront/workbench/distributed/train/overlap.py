"""Compute/communication overlap on the training mesh: FSDP2 prefetch and resharding, async TP, and the
communication each mesh dimension leaves exposed.

- ``--fsdp-prefetch N``: each FSDP2 layer issues the all-gather of the next N layers (forward) or the
  previous N layers (backward) before its own compute, through ``set_modules_to_forward_prefetch`` /
  ``set_modules_to_backward_prefetch``; 0 keeps FSDP2's implicit one-layer prefetch.
- ``--reshard-after-forward true|false|K``: FSDP2's ``reshard_after_forward`` (false keeps the gathered
  parameters until backward, ZeRO-2-like; K reshards to a group of K ranks, K dividing the shard degree).
- ``--async-tp``: PyTorch's micro-pipelined TP (symmetric memory + inductor's ``_micro_pipeline_tp``
  pass), which decomposes all-gather + matmul and matmul + reduce-scatter into overlapped pieces. It needs
  CUDA (NCCL, symmetric memory) and a compiled model, so it is validated here and refused elsewhere.

Import-light (no torch at module import) so the CLI can read :data:`HELP`.
"""

from __future__ import annotations

#: The CLI's help for the overlap options (cli/train.py keeps only the option names).
HELP = {
    "fsdp_prefetch": "FSDP2: explicitly prefetch the next N layers' all-gathers (0: FSDP2's implicit one).",
    "reshard_after_forward": "FSDP2: true, false (keep gathered parameters until backward) or K (reshard to K "
                             "ranks).",
    "async_tp": "Async TP (symmetric memory + inductor micro-pipelining): CUDA, --tp > 1 and --compare compile.",
}


def parse_reshard(text: str | bool | int) -> bool | int:
    """``"true"`` / ``"false"`` / ``"4"`` -> True / False / 4 (FSDP2's ``reshard_after_forward``)."""
    if isinstance(text, bool | int):
        return text
    low = str(text).strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        value = int(low)
    except ValueError:
        raise ValueError(f"--reshard-after-forward: expected true, false or an integer, got {text!r}") from None
    if value < 1:
        raise ValueError(f"--reshard-after-forward: an integer must be >= 1, got {value}")
    return value


def problems(*, fsdp_prefetch: int, reshard_after_forward, async_tp: bool, layout, variants,
             cuda: bool) -> list[str]:
    """Why these overlap options cannot run on this launch (empty: they can). ``layout``: the run's, resolved
    (mesh.resolve; ``--parallel fsdp2`` is ``dp_shard`` = world)."""
    out = []
    try:
        reshard = parse_reshard(reshard_after_forward)
    except ValueError as e:
        return [str(e)]
    fsdp = layout.shards  # replicas only: DDP
    if fsdp_prefetch < 0:
        out.append(f"--fsdp-prefetch must be >= 0, got {fsdp_prefetch}")
    if (fsdp_prefetch or reshard is not True) and not fsdp:
        out.append("--fsdp-prefetch/--reshard-after-forward set FSDP2 options, but this run does not shard with "
                   "FSDP2 (use --parallel fsdp2, or a mesh with --dp-shard > 1; replicas alone run DDP)")
    if (fsdp_prefetch or reshard is not True) and layout.pp > 1:
        out.append("--fsdp-prefetch/--reshard-after-forward are not applied to pipeline stages yet; drop them with "
                   "--pp")
    if not isinstance(reshard, bool) and fsdp and (reshard > layout.dp_shard or layout.dp_shard % reshard):
        out.append(f"--reshard-after-forward {reshard} must divide the shard degree {layout.dp_shard}")
    if async_tp:
        if not cuda:
            out.append("--async-tp needs CUDA GPUs (NCCL and symmetric memory); gloo on a CPU has no async TP")
        if layout.tp < 2:
            out.append("--async-tp overlaps tensor-parallel collectives: it needs --tp > 1")
        if "compile" not in variants or "liger" in variants or "wavefront" in variants:
            out.append("--async-tp is an inductor pass: it runs on the compiled model (--compare compile or "
                       "baseline,compile)")
    return out


def fsdp_kwargs(reshard_after_forward) -> dict:
    """Extra ``fully_shard`` keyword arguments for the per-layer wraps."""
    return {"reshard_after_forward": parse_reshard(reshard_after_forward)}


def set_prefetch(layers: list, n: int) -> int:
    """Explicit prefetch over FSDP2-wrapped ``layers`` (in forward order); returns the number of links set."""
    if n <= 0:
        return 0
    links = 0
    for i, layer in enumerate(layers):
        ahead = layers[i + 1:i + 1 + n]
        behind = layers[max(0, i - n):i][::-1]
        if ahead:
            layer.set_modules_to_forward_prefetch(ahead)
        if behind:
            layer.set_modules_to_backward_prefetch(behind)
        links += len(ahead) + len(behind)
    return links


def enable_async_tp(tp_mesh) -> None:
    """Turn on PyTorch's async TP for ``tp_mesh``'s group: symmetric memory and the inductor pass."""
    from torch._inductor import config as inductor_config  # lazy: torch-free import
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group  # lazy: torch-free import

    enable_symm_mem_for_group(tp_mesh.get_group().group_name)
    inductor_config._micro_pipeline_tp = True


# ---- exposed communication per mesh dimension ---------------------------------------------------------------

#: The mesh dimensions, in the order of the KPI table; "unattributed": collectives no dimension could be
#: given to (a CPU trace carries no process group and two candidate dimensions were active).
DIMS = ("tp", "dp_shard", "dp_replicate", "cp", "pp", "unattributed")
SYNC_LABEL = "wavefront::harness_sync"  # the harness's own loss/timing all-reduces: no mesh dimension's cost


def _dim_of_group(args: dict, pg_config: dict[str, str]) -> str | None:
    """The mesh dimension of a collective's process group (pg_desc "mesh_tp", or its pg_name's description);
    None for the default group (the harness's own reductions)."""
    desc = args.get("pg_desc") or pg_config.get(str(args.get("pg_name")), "")
    if desc.startswith("mesh_") and desc[5:] in DIMS:
        return desc[5:]
    return None if desc == "default_pg" else "unattributed"


def _dim_of_cpu_op(name: str, in_fsdp: bool, degrees: dict[str, int]) -> str:
    """Gloo traces name no process group: FSDP2's collectives (inside its FSDP:: ranges) are the data-parallel
    ones (all-reduce: the replicas of HSDP where it can be told), point-to-point ones are cp's ring or pp's
    stages, and the rest belong to the one other active dimension, when only one is."""
    low = name.lower().replace("allreduce", "all_reduce")
    if in_fsdp:
        shard, replicate = degrees.get("dp_shard", 1) > 1, degrees.get("dp_replicate", 1) > 1
        if "all_reduce" not in low or not replicate:
            return "dp_shard" if shard else "dp_replicate"
        # HSDP: c10d::allreduce_ is the replicas' reduction, but gloo also runs dp_shard's reduce-scatter as an
        # all-reduce on its worker threads, which then names neither
        return "dp_replicate" if not shard or low.startswith("c10d::") else "unattributed"
    p2p = "send" in low or "recv" in low
    candidates = [d for d in (("cp", "pp") if p2p else ("tp", "cp", "pp")) if degrees.get(d, 1) > 1]
    return candidates[0] if len(candidates) == 1 else "unattributed"


def _cpu_compute(trace, comm_rows):
    """CPU operators that are not collectives and enclose none on their thread: an op that issued a blocking
    collective (a DTensor-dispatched linear, FSDP's hooks) is waiting, not computing, while it runs."""
    # function-local (here and in comm_by_dim): the CLI imports this module for its help texts, and
    # `wavefront train --help` should not load numpy and the trace reader; only a profiled run needs them
    import numpy as np  # lazy: numpy-free import

    from wavefront.workbench.trace.intervals import IntervalSet  # lazy: numpy-free import
    from wavefront.workbench.trace.model import CAT_CPU_OP  # lazy: numpy-free import

    cpu = trace.cpu
    ops = cpu.cat == CAT_CPU_OP
    ops[comm_rows] = False
    for tid in np.unique(cpu.tid[comm_rows]):
        starts = np.sort(cpu.ts_ns[comm_rows][cpu.tid[comm_rows] == tid])
        mine = np.flatnonzero(ops & (cpu.tid == tid))
        encloses = np.searchsorted(starts, cpu.end_ns[mine]) > np.searchsorted(starts, cpu.ts_ns[mine])
        ops[mine[encloses]] = False
    return IntervalSet.union_of(cpu.ts_ns[ops], cpu.end_ns[ops])


def comm_by_dim(path: str, degrees: dict[str, int], n_steps: int = 1) -> dict[str, dict[str, float]]:
    """Per mesh dimension, seconds per step of communication (the union of its collectives' intervals) and
    the part of it with no compute running (exposed = |X_dim minus C|; C as trace.breakdown takes it on a
    device trace, and on a CPU trace less the operators that only wait on a collective: :func:`_cpu_compute`).

    Device traces attribute each communication kernel by its process group (the profiler's collective
    args); CPU (gloo) traces by the rules of :func:`_dim_of_cpu_op`. Dimensions without communication in
    the trace are absent."""
    import numpy as np  # lazy: numpy-free import (see _cpu_compute)

    from wavefront.workbench.trace.breakdown import build_timeline, cpu_comm_rows  # lazy: numpy-free import
    from wavefront.workbench.trace.classify import COMM, classify_device  # lazy: numpy-free import
    from wavefront.workbench.trace.intervals import IntervalSet, subtract  # lazy: numpy-free import
    from wavefront.workbench.trace.load import load_trace  # lazy: numpy-free import

    trace = load_trace(path)
    names = np.asarray(trace.names, dtype=object)
    dims: np.ndarray
    if len(trace.device):
        dev, compute = trace.device, build_timeline(trace).compute
        rows = np.flatnonzero(classify_device(trace).cls == COMM)
        pgs = {str(g.get("pg_name")): g.get("pg_desc", "") for g in
               trace.meta.get("distributedInfo", {}).get("pg_config", [])}
        dims = np.array([_dim_of_group(trace.kernel_comm_args.get(int(c), {}), pgs)
                         for c in dev.correlation[rows]], dtype=object)
        starts, ends = dev.ts_ns[rows], dev.end_ns[rows]
    else:
        cpu = trace.cpu
        rows = np.flatnonzero(cpu_comm_rows(trace))
        starts, ends, op_names = cpu.ts_ns[rows], cpu.end_ns[rows], names[cpu.name[rows]]

        def inside(prefix: str) -> np.ndarray:  # any thread: gloo runs the work on its own threads
            labels = np.array([str(n).startswith(prefix) for n in names], dtype=bool)[cpu.name]
            return IntervalSet.union_of(cpu.ts_ns[labels], cpu.end_ns[labels]).contains(starts)

        fsdp, sync = inside("FSDP::"), inside(SYNC_LABEL)
        compute = _cpu_compute(trace, rows)
        dims = np.array([None if s else _dim_of_cpu_op(str(n), f, degrees)
                         for n, f, s in zip(op_names, fsdp, sync, strict=True)], dtype=object)
    out = {}
    for dim in DIMS:
        sel = dims == dim
        if not sel.any():
            continue
        comm = IntervalSet.union_of(starts[sel], ends[sel])
        out[dim] = {"comm_s": comm.measure() / 1e9 / n_steps,
                    "exposed_s": subtract(comm, compute).measure() / 1e9 / n_steps}
    return out


def kpi_rows(summaries: list) -> list[tuple[str, list[str]]]:
    """KPI-table rows (label, one cell per summary): each dimension's communication and exposed part."""
    seen = [d for d in DIMS if any(d in (s.comm_by_dim or {}) for s in summaries)]
    rows = []
    for dim in seen:
        for key, what in (("comm_s", "comm"), ("exposed_s", "exposed")):
            cells = [format(s.comm_by_dim[dim][key], ".3g") if dim in (s.comm_by_dim or {}) else "n/a"
                     for s in summaries]
            rows.append((f"  {dim} {what} (s, traced)", cells))
    return rows


def across_ranks(mine: dict[str, dict[str, float]], reduce_max) -> dict[str, dict[str, float]]:
    """Every rank's split combined by ``reduce_max`` (an all-reduce MAX of a list of floats): the slowest
    rank per dimension, which is what the step waits for. Absent dimensions travel as -1."""
    flat = [mine.get(d, {}).get(k, -1.0) for d in DIMS for k in ("comm_s", "exposed_s")]
    top = reduce_max(flat)
    return {d: {"comm_s": top[2 * i], "exposed_s": top[2 * i + 1]} for i, d in enumerate(DIMS) if top[2 * i] >= 0}
