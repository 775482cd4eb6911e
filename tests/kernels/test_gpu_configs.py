"""Every configuration the dispatchers choose on sm_90, sm_100 and gfx942 at the bench shapes, run under the
interpreter with the target assumed, forward and backward, against the float64 reference.

Each parameter is one distinct configuration (``workbench.static.configs``): the kernels, tiles, stages, warp
specialization, TMA or pointer path, persistent grid and splits a target picks for a bench case, run on a small
problem that picks the same ones. The test asserts both that the numbers pass the accuracy rule and that the
launches that ran are exactly the configuration chosen at the bench shape. A configuration whose launches are
identical on two targets runs once (the interpreter runs the launches, not the target). The default run takes
a subset (see PER_TARGET_DEFAULT); the rest are marked slow (``pytest -m slow`` runs every one).
"""

from __future__ import annotations

import pytest
import torch

from wavefront import runtime
from wavefront.ops import REGISTRY
from wavefront.workbench.bench.correctness import check_case
from wavefront.workbench.hardware import gpu_for_target
from wavefront.workbench.static import configs as gc

CONFIGS = gc.gpu_configs()
VARLEN = {cfg.id: gc.varlen_companion(cfg) for cfg in CONFIGS.configs if cfg.op == "attention" and cfg.runnable}


#: Ops whose targets take different code paths (TMA and warp specialization on NVIDIA, pointer kernels with
#: transposed copies, XCD remap and a persistent backward on AMD): the default run takes their first
#: configuration on every target. Every other op's default is its first configuration on one target, the
#: targets taken in turn over the registry, so the default run stays near a minute.
PER_TARGET_DEFAULT = ("attention", "linear", "grouped_linear")


def _params():
    seen: set[tuple[str, frozenset[str]]] = set()
    ops = list(REGISTRY)
    defaults = {(op, t) for op in PER_TARGET_DEFAULT for t in CONFIGS.targets}
    defaults |= {(op, CONFIGS.targets[i % len(CONFIGS.targets)]) for i, op in enumerate(ops)
                 if op not in PER_TARGET_DEFAULT}
    for cfg in CONFIGS.configs:
        if not cfg.runnable:
            continue
        launches = (cfg.op, gc.unmoded(cfg.key))
        if launches in seen:
            continue  # the same launches chosen on another target: run once
        seen.add(launches)
        default = (cfg.op, cfg.target) in defaults
        defaults.discard((cfg.op, cfg.target))
        yield pytest.param(cfg, id=cfg.id, marks=[] if default else [pytest.mark.slow])


def _varlen_params():
    """The varlen form of every attention configuration (packed sequences, one of them empty): the first per
    target by default, the rest slow."""
    seen: set[frozenset[str]] = set()
    targets: set[str] = set()
    for companion in VARLEN.values():
        if companion is None or gc.unmoded(companion.key) in seen:
            continue
        seen.add(gc.unmoded(companion.key))
        default = companion.target not in targets
        targets.add(companion.target)
        yield pytest.param(companion, id=f"{companion.id}-varlen", marks=[] if default else [pytest.mark.slow])


@pytest.mark.parametrize("cfg", [*_params(), *_varlen_params()])
def test_gpu_config_numerics(cfg):
    run = gc.run_config(cfg, check_case)
    assert run.ran == gc.unmoded(cfg.key), (
        f"the small problem ran another configuration than the bench case's:\n"
        f"  ran only: {sorted(run.ran - gc.unmoded(cfg.key))}\n  chosen only: {sorted(gc.unmoded(cfg.key) - run.ran)}")
    check = run.check
    assert check.error is None, check.error
    assert any(c.mode == "bwd" for c in check.checks) == REGISTRY[cfg.op].has_backward
    failed = [c for c in check.checks if not c.passed]
    assert not failed, "\n".join(
        f"{c.what} ({c.mode}): ours {c.err_ours:.3g} > bound {c.bound:.3g} (eager {c.err_eager:.3g})" for c in failed)


def test_every_attention_configuration_has_a_varlen_form():
    """Packed sequences run the bench configuration's kernels, tiles and paths with VARLEN=True, nothing else."""
    assert VARLEN and all(VARLEN.values()), [k for k, v in VARLEN.items() if v is None]


def test_coverage_at_least_95_percent():
    runnable, chosen = CONFIGS.coverage
    assert chosen >= 3 * len(REGISTRY) - 3, "fewer configurations than ops x targets: the enumeration lost some"
    assert runnable / chosen >= 0.95, [c.id for c in CONFIGS.configs if not c.runnable]
    for c in CONFIGS.configs:
        assert c.runnable or c.note, c.id


#: Recording at bench shapes runs no kernel (nothing for memcheck to check), and its uninitialised bench-size
#: inputs cost no memory until initcheck would fill them with its poison pattern (GiBs): without memcheck.
@pytest.mark.no_memcheck
def test_small_problem_selects_the_bench_key():
    """The enumeration's own claim, re-derived: at the bench shape with the target's SM count and at the small
    problem with its SM count, the recorded launches are the same configuration."""
    for cfg in CONFIGS.configs[:: max(1, len(CONFIGS.configs) // 12)]:
        if not cfg.runnable:
            continue
        spec = REGISTRY[cfg.op]
        bench = next(c for c in spec.bench_cases if c.name == cfg.bench_cases[0])
        assert gc.config_key(spec, bench, cfg.target, gpu_for_target(cfg.target).sm_count) == cfg.key
        with gc.small_context(cfg.op, cfg.base, cfg.small):
            assert gc.config_key(spec, cfg.small, cfg.target, cfg.small_n_sms) == cfg.key


def test_gpu_only_paths_are_among_the_configurations():
    """What the interpreter's own tables never pick is here: TMA with warp specialization on both NVIDIA targets,
    split dK/dV columns, the AMD transposed copies and XCD remap, a persistent grid, a split row."""
    runnable = [c for c in CONFIGS.configs if c.runnable]

    def has(target, *parts):
        return any(c.target == target and any(all(p in k for p in parts) for k in c.key) for c in runnable)

    for target in ("sm_90", "sm_100"):
        assert has(target, "_attn_fwd_tma_kernel", "WARP_SPECIALIZE=True")
        assert has(target, "_linear_fwd_tma_kernel", "NUM_PROGRAMS=persistent", "WARP_SPECIALIZE=True")
        assert has(target, "_grouped_gemm_kernel", "USE_TMA=True")
        assert has(target, "_attn_bwd_dkdv_kernel", "D_SPLIT=4")
    assert has("gfx942", "_attn_fwd_kernel", "V_TRANSPOSED=True", "NUM_XCDS=8", "waves_per_eu=2")
    assert has("gfx942", "_linear_bwd_kernel", "NUM_PROGRAMS=persistent")
    assert has("sm_90", "_ce_combine_kernel")


def test_gluon_is_listed_with_its_reason():
    excluded = [e for e in CONFIGS.excluded if e.op == "attention" and e.target == "sm_90"]
    assert excluded and "Gluon has no interpreter" in excluded[0].reason
    assert CONFIGS.as_dict()["excluded"][0]["name"] == excluded[0].name


def test_assumed_target_does_not_leak():
    cfg = next(c for c in CONFIGS.configs if c.runnable)
    assert runtime.arch().name == "cpu" and cfg.target != "cpu"
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.no_memcheck  # records at bench shapes, as above
def test_cli_lists_the_configurations():
    import json

    from typer.testing import CliRunner

    from wavefront.cli import build_app

    r = CliRunner().invoke(build_app(), ["inspect", "--configs", "--op", "softmax", "--targets", "sm_90,gfx942",
                                         "--json", "-"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["schema"] == gc.SCHEMA and doc["targets"] == ["sm_90", "gfx942"]
    mine = [c for c in CONFIGS.as_dict()["configs"] if c["op"] == "softmax" and c["target"] in doc["targets"]]
    assert [c["id"] for c in doc["configs"]] == [c["id"] for c in mine]
    bad = CliRunner().invoke(build_app(), ["inspect", "--configs", "--targets", "sm_75"])
    assert bad.exit_code == 2 and "--targets: unknown target 'sm_75'" in bad.output
