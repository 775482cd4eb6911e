"""What a training run says, in words: the loss agreement of the compared variants (on a CPU the one result
that means anything: the interpreter's wall times are correctness runs), and the time estimate printed after
a variant's first step."""

from __future__ import annotations

#: The comparison ratios of wall times: on a CPU (the Triton interpreter) they say nothing about speed.
TIMING_RATIOS = ("tokens_per_s_ratio", "step_s_ratio")


def on_cpu(provenance: dict) -> bool:
    return str(provenance.get("backend", "")).startswith("cpu")


def loss_agreement(result) -> list[str]:
    """Each compared variant's loss curve against the first measured variant's, one line each."""
    ref = next((v for v in result.variants if v.summary), None)
    lines = []
    for name, c in result.comparisons.items():
        other = next((v for v in result.variants if v.variant == name and v.summary), None)
        if c.get("max_abs_loss_diff") is None or ref is None or other is None:
            continue
        lines.append(f"loss agreement, {name} vs {ref.variant}: max |loss difference| {c['max_abs_loss_diff']:.3g} "
                     f"over {min(len(ref.steps), len(other.steps))} steps; final loss {other.summary.final_loss:.5f} "
                     f"vs {ref.summary.final_loss:.5f}")
    return lines


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def estimate_step(steps: int) -> int | None:
    """After which step (0-based) to print the estimate: the second (the first also pays one-off costs: the
    interpreter's first calls, compilation), or the first of a 2-step run; None for one step."""
    return None if steps < 2 else min(1, steps - 2)


def estimate_line(variant: str, step: int, step_s: float, steps: int, order: tuple[str, ...]) -> str:
    """How long `variant`'s remaining steps should take, from step `step`'s wall time: an estimate. `order`: the
    variants' run order (the ones still to come are named)."""
    left = order[order.index(variant) + 1:] if variant in order else ()
    n = steps - step - 1
    text = (f"{variant}: step {step + 1} took {_duration(step_s)}; estimate for its other {n} step{'s' * (n != 1)}: "
            f"about {_duration(step_s * n)}")
    return text + (f" (then {', '.join(left)})" if left else "")


def notes(result) -> list[str]:
    """The lines under the KPI table: where the peak, memory, price and energy figures come from, what was
    patched, resumes, the loss agreement (on a GPU; on a CPU it leads), predictions, where the KPIs went."""
    s = next((v.summary for v in result.variants if v.summary), None)
    lines = [f"peak: {s.peak.source}", f"memory: {s.peak_mem_kind}; price: {s.price_source}; energy: "
                                       f"{s.energy_kind}", *s.notes] if s else []
    for v in result.variants:
        lines += v.notes + [f"trace: {path}" for path in v.trace_paths]
        if v.patch_report:
            counts = ", ".join(f"{k} x{n}" for k, n in v.patch_report["counts"].items()) or "nothing"
            lines += [f"patched: {counts}", *(f"  not patched: {u['op']}: {u['reason']}"
                                              for u in v.patch_report["unmatched"])]
        lines += [f"{v.variant}: resumed after step {v.resumed_from_step}"] if v.resumed_from_step is not None else []
    lines += [] if on_cpu(result.provenance) else loss_agreement(result)  # on a CPU it leads, above the table
    # function-local: predict.py imports torch; the CLI imports this module at start-up (kept torch-free)
    from wavefront.workbench.distributed.train.predict import describe  # lazy: torch-free import

    lines += [x for v in result.variants if v.summary for x in describe(v.variant, v.summary.prediction)]
    return lines + ([f"KPIs stored in {result.store} (tables train_runs, train_steps), run {result.run_id}"]
                    if result.store else [])
