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


def problems(*, fsdp_prefetch: int, reshard_after_forward, async_tp: bool, plan: str, layout, variants,
             cuda: bool) -> list[str]:
    """Why these overlap options cannot run on this launch (empty: they can). ``layout`` is resolved."""
    out = []
    try:
        reshard = parse_reshard(reshard_after_forward)
    except ValueError as e:
        return [str(e)]
    fsdp = plan == "fsdp2" or (plan == "mesh" and layout is not None and layout.dp > 1)
    if fsdp_prefetch < 0:
        out.append(f"--fsdp-prefetch must be >= 0, got {fsdp_prefetch}")
    if (fsdp_prefetch or reshard is not True) and not fsdp:
        out.append("--fsdp-prefetch/--reshard-after-forward set FSDP2 options, but this run does not shard with "
                   "FSDP2 (use --parallel fsdp2, or a mesh with --dp-shard/--dp-replicate > 1)")
    if (fsdp_prefetch or reshard is not True) and layout is not None and layout.pp > 1:
        out.append("--fsdp-prefetch/--reshard-after-forward are not applied to pipeline stages yet; drop them with "
                   "--pp")
    if reshard is not True and reshard is not False and fsdp:
        shard = layout.dp_shard if plan == "mesh" else None
        if shard is not None and (reshard > shard or shard % reshard):
            out.append(f"--reshard-after-forward {reshard} must divide the shard degree {shard}")
    if async_tp:
        if not cuda:
            out.append("--async-tp needs CUDA GPUs (NCCL and symmetric memory); gloo on a CPU has no async TP")
        if plan != "mesh" or layout is None or layout.tp < 2:
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
    from torch._inductor import config as inductor_config
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    enable_symm_mem_for_group(tp_mesh.get_group().group_name)
    inductor_config._micro_pipeline_tp = True
