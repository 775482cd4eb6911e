"""`wavefront train` on a device mesh: the layout's validation (before any work, exit 2), plan files, and
loss parity of tensor-parallel (TP2) and TP2 x FSDP2 (4 processes) runs with one process, with and without
wavefront's kernels, within a derived tolerance (``convergence.loss_envelope``: twice the spread of
rounding-perturbed fp32 runs around float64, plus 4 ulps of the loss).

The kernel-launch counts prove that wavefront's kernels ran on the tensor-parallel shards: a kernel that
fell back to eager code under DTensor (or a patched module bypassed by the plan) changes the counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

EPS32 = 2.0 ** -23


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    src = str(Path(__file__).resolve().parents[3] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _train(tmp_path: Path, *args: str, name: str = "out.json", stdin: str | None = None, timeout: float = 400) -> dict:
    cmd = [sys.executable, "-m", "wavefront", "train", *args, "--store", "", "--json", name]
    r = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=timeout, input=stdin)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((tmp_path / name).read_text())


def _losses(doc: dict) -> dict[str, list[float]]:
    return {v["variant"]: [s["loss"] for s in v["steps"]] for v in doc["variants"]}


def _assert_parity(ref: list[float], got: list[float], envelope: list[float], what: str) -> None:
    assert len(ref) == len(got) == len(envelope)
    for t, (a, b, env) in enumerate(zip(ref, got, envelope, strict=True)):
        tol = 2 * env + 4 * EPS32 * abs(a)
        assert abs(a - b) <= tol, f"{what} step {t}: |{b} - {a}| = {abs(a - b):.3g} > {tol:.3g}"


# ---- validation: every rank, before any work --------------------------------------------------------------


def _validate(world: int, model: str = "tiny-llama", **kw):
    from wavefront.workbench.distributed.train.config import TrainConfig

    TrainConfig(**{"seq_len": 8, "global_batch": 4, "micro_batch": 1, "store": None, "model": model, **kw}
                ).validate(world)


@pytest.mark.parametrize(("world", "kw", "message"), [
    (4, {"tp": 3}, "world size 4 is not divisible by tp x pp x cp x dp-replicate = 3 x 1 x 1 x 1 = 3"),
    (8, {"tp": 8}, "--tp 8: the model's attention heads (4) is not divisible by 8"),
    (4, {"tp": 4}, "--tp 4: the model's KV heads (2) is not divisible by 4"),
    (2, {"tp": 2, "seq_len": 7}, "--seq-len 7 is not divisible by tp x cp = 2 x 1"),
    (4, {"pp": 4}, "--pp 4 x --vpp 1 = 4 stages, but the model has only 2 layers"),
    (4, {"tp": 2, "dp_shard": 1}, "the mesh pp 1 x dp_replicate 1 x dp_shard 1 x cp 1 x tp 2 = 2 ranks, but 4"),
    (4, {"tp": 2, "global_batch": 3}, "--global-batch 3 is not divisible by data-parallel ranks x micro-batch = 2"),
    (2, {"pp": 2, "global_batch": 1}, "1 micro-batch(es) per step cannot fill 2 stages"),
    (2, {"pp": 2, "vpp": 2}, "--vpp 2 needs a multi-stage schedule"),
    (2, {"tp": 2, "parallel": "ddp"}, "build a device mesh: use --parallel auto or mesh, not ddp"),
    (2, {"cp": 2}, "--cp > 1 needs ring attention"),
])
def test_bad_layouts_are_refused_naming_the_numbers(world, kw, message):
    from wavefront.workbench.distributed.train.config import ConfigError

    with pytest.raises(ConfigError) as e:
        _validate(world, **kw)
    assert message in str(e.value)


def test_good_layouts_resolve_the_data_parallel_rest():
    from wavefront.workbench.distributed.train.mesh import Layout, validate
    from wavefront.workbench.distributed.train.presets import build_config

    lay = validate(Layout(tp=2), 8, build_config("tiny-llama"), seq_len=8, global_batch=8, micro_batch=1)
    assert (lay.dp_shard, lay.dp, lay.world_size) == (4, 4, 8) and lay.label() == "dp_shard4 tp2"
    lay = validate(Layout(pp=2, vpp=2, pp_schedule="interleaved-1f1b"), 2,
                   build_config("tiny-llama", num_hidden_layers=4), seq_len=8, global_batch=4, micro_batch=1)
    assert lay.n_stages == 4 and lay.dp == 1


def _plan_doc(**config) -> dict:
    base = {"tp": 1, "sp": False, "pp": 1, "vpp": 1, "cp": 1, "dp": 1, "zero": 0, "micro_batch": 1, "shard": 0,
            "zero_bubble": False, "label": "x"}
    return {"schema": "wavefront.plan/1", "plans": [{"config": {**base, **config}}]}


@pytest.mark.parametrize(("config", "expected"), [
    ({"tp": 2, "dp": 2, "zero": 3, "micro_batch": 2}, {"tp": 2, "dp_shard": 2, "dp_replicate": 1, "micro": 2}),
    ({"dp": 4, "zero": 1}, {"dp_shard": 1, "dp_replicate": 4}),
    ({"dp": 4, "zero": 3, "shard": 2}, {"dp_shard": 2, "dp_replicate": 2}),
    ({"pp": 2, "vpp": 2}, {"pp": 2, "vpp": 2, "pp_schedule": "interleaved-1f1b"}),
    ({"pp": 2, "zero_bubble": True}, {"pp": 2, "vpp": 2, "pp_schedule": "zbv"}),
])
def test_plan_documents_map_onto_the_mesh(config, expected):
    from wavefront.workbench.distributed.train.mesh import from_plan_document

    lay, micro = from_plan_document(_plan_doc(**config), 0, "p.json")
    for k, v in expected.items():
        assert (micro if k == "micro" else getattr(lay, k)) == v, k


def test_bad_plan_input_exits_2(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from wavefront.cli import build_app

    monkeypatch.chdir(tmp_path)
    for var in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "p.json").write_text(json.dumps(_plan_doc(tp=2)))
    (tmp_path / "bad.json").write_text("{")
    cases = [(["--plan", "p.json", "--plan-rank", "3"], "--plan-rank 3: the plan file lists 1 plan(s)"),
             (["--plan", "bad.json"], "--plan bad.json: not JSON"),
             (["--plan", "p.json"], "the mesh pp 1 x dp_replicate 1 x dp_shard 1 x cp 1 x tp 2 = 2 ranks, but 1"),
             (["--tp", "2"], "world size 1 is not divisible by tp x pp x cp x dp-replicate = 2 x 1 x 1 x 1 = 2")]
    for args, message in cases:
        r = CliRunner().invoke(build_app(), ["train", *args, "--store", ""])
        assert r.exit_code == 2, r.output
        assert message in " ".join(r.stderr.split()) and "Traceback" not in r.output


# ---- loss parity on gloo -----------------------------------------------------------------------------------

SMALL = ["--seq-len", "8", "--global-batch", "2", "--warmup-steps", "0", "--lr", "1e-2", "--timeout", "120"]


def _envelope(model: str, steps: int) -> list[float]:
    from wavefront.workbench.distributed.train.convergence import loss_envelope

    return loss_envelope(model, steps=steps, seq_len=8, global_batch=2, lr=1e-2)


def _parity(tmp_path: Path, model: str, steps: int, layouts: list[tuple[int, list[str]]]) -> None:
    args = ["--model", model, "--compare", "baseline,wavefront", "--steps", str(steps), *SMALL]
    single = _train(tmp_path, *args, "--micro-batch", "2", name="single.json")
    ref = _losses(single)
    envelope = _envelope(model, steps)
    launches = single["variants"][1]["kernel_launches"]
    assert launches and all(n > 0 for n in launches.values())
    for nproc, mesh_args in layouts:
        doc = _train(tmp_path, *args, "--nproc-per-node", str(nproc), *mesh_args, name=f"mesh{nproc}.json")
        assert doc["provenance"]["layout"]["world_size"] == nproc
        for variant, losses in _losses(doc).items():
            _assert_parity(ref[variant], losses, envelope, f"{model} {' '.join(mesh_args)} {variant}")
        assert doc["variants"][1]["kernel_launches"] == launches, "every wavefront kernel ran on the shards"


def test_tensor_parallel_loss_parity_llama(tmp_path):
    _parity(tmp_path, "tiny-llama", 2, [(2, ["--tp", "2", "--micro-batch", "2"])])


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3"])
def test_mesh_loss_parity_20_steps(tmp_path, model):
    _parity(tmp_path, model, 20, [(2, ["--tp", "2", "--micro-batch", "2"]),
                                  (4, ["--tp", "2", "--dp-shard", "2", "--micro-batch", "1"])])
