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


def _train(tmp_path: Path, *args: str, name: str = "out.json", stdin: str | None = None, store: str = "",
           timeout: float = 400) -> dict:
    cmd = [sys.executable, "-m", "wavefront", "train", *args, "--store", store, "--json", name]
    r = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=timeout, input=stdin)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((tmp_path / name).read_text())


def _losses(doc: dict) -> dict[str, list[float]]:
    return {v["variant"]: [s["loss"] for s in v["steps"]] for v in doc["variants"]}


def _assert_same_kernels(tp: dict[str, int], one: dict[str, int]) -> None:
    """Every wavefront kernel ran on the tensor-parallel shards as often as in one process, and the loss went
    vocabulary-parallel: the shard-statistics kernel once per chunk of the fused loss (its CE kernel then
    runs in backward only)."""
    assert one.get("_ce_kernel", 0) > 0 and "_vocab_shard_stats_kernel" not in one
    assert tp == {**one, "_vocab_shard_stats_kernel": one["_ce_kernel"]}, (tp, one)


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
    (4, {"cp": 2, "pp": 2}, "--cp > 1 runs with data parallelism only so far: drop --pp and --tp"),
    (2, {"tp": 2, "variants": ("baseline", "compile")}, "--compare compile with --tp/--pp"),
    (2, {"pp": 2, "checkpoint_every": 1, "checkpoint_dir": "ck"}, "--pp: checkpointing a pipeline's stages"),
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
    timeout = 400 if steps < 5 else 2400  # the 20-step runs interpret every kernel on a shared CPU
    single = _train(tmp_path, *args, "--micro-batch", "2", name="single.json", timeout=timeout)
    ref = _losses(single)
    envelope = _envelope(model, steps)
    launches = single["variants"][1]["kernel_launches"]
    assert launches and all(n > 0 for n in launches.values())
    for nproc, mesh_args in layouts:
        doc = _train(tmp_path, *args, "--nproc-per-node", str(nproc), *mesh_args, name=f"mesh{nproc}.json",
                     timeout=timeout)
        assert doc["provenance"]["layout"]["world_size"] == nproc
        for variant, losses in _losses(doc).items():
            _assert_parity(ref[variant], losses, envelope, f"{model} {' '.join(mesh_args)} {variant}")
        _assert_same_kernels(doc["variants"][1]["kernel_launches"], launches)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3"])
def test_mesh_loss_parity_20_steps(tmp_path, model):
    _parity(tmp_path, model, 20, [(2, ["--tp", "2", "--micro-batch", "2"]),
                                  (4, ["--tp", "2", "--dp-shard", "2", "--micro-batch", "1"])])


# ---- pipeline parallelism ----------------------------------------------------------------------------------


def test_layers_are_cut_in_order_with_the_remainder_first():
    from wavefront.workbench.distributed.train.mesh import Layout
    from wavefront.workbench.distributed.train.pipeline import split_layers, stages_of_rank

    assert split_layers(5, 2) == [range(0, 3), range(3, 5)]
    assert split_layers(4, 4) == [range(i, i + 1) for i in range(4)]
    with pytest.raises(ValueError, match="cannot cut 2 layers into 3 stages"):
        split_layers(2, 3)
    assert stages_of_rank(0, Layout(pp=2, vpp=2, pp_schedule="interleaved-1f1b")) == [0, 2]
    assert stages_of_rank(0, Layout(pp=2, vpp=2, pp_schedule="zbv")) == [0, 3], "a V: first and last stage"


def _model_dir(tmp_path: Path, n_layers: int) -> str:
    from wavefront.workbench.distributed.train.presets import build_config

    path = tmp_path / f"llama{n_layers}"
    build_config("tiny-llama", num_hidden_layers=n_layers).save_pretrained(path)
    return str(path)


def _pipeline_parity(tmp_path: Path, n_layers: int, steps: int, variants: str, layouts: list[list[str]]) -> None:
    model = _model_dir(tmp_path, n_layers)
    args = ["--model", model, "--compare", variants, "--steps", str(steps), "--seq-len", "8", "--global-batch", "4",
            "--warmup-steps", "0", "--lr", "1e-2", "--timeout", "120"]
    timeout = 400 if steps < 5 else 2400
    ref = _losses(_train(tmp_path, *args, "--micro-batch", "4", name="single.json", timeout=timeout))
    from wavefront.workbench.distributed.train.convergence import loss_envelope

    envelope = loss_envelope(model, steps=steps, seq_len=8, global_batch=4, lr=1e-2)
    for i, mesh_args in enumerate(layouts):
        nproc = 4 if "--tp" in mesh_args and "--pp" in mesh_args else 2
        doc = _train(tmp_path, *args, "--nproc-per-node", str(nproc), "--micro-batch", "1", *mesh_args,
                     name=f"pp{i}.json", timeout=timeout)
        for v in doc["variants"]:
            _assert_parity(ref[v["variant"]], [s["loss"] for s in v["steps"]], envelope,
                           f"{n_layers} layers {' '.join(mesh_args)} {v['variant']}")
            bubbles = [s["bubble_s"] for s in v["steps"]]
            if "--pp" not in mesh_args:
                assert bubbles == [None] * steps
            elif "zbv" in mesh_args:
                assert bubbles == [None] * steps, "no bubble figure where backward is split"
            else:
                assert all(0 <= b <= s["comm_s"] + 1e-9 for b, s in zip(bubbles, v["steps"], strict=True))
            if v["variant"] == "wavefront":
                assert v["kernel_launches"].get("_norm_fwd_kernel", 0) > 0, "wavefront's norm ran on stage 0"


def test_uneven_pp2_loss_parity(tmp_path):
    """1F1B over 3 layers cut 2 + 1 trains like one process (TP2's gradients are checked against float64
    below; its 20-step curves are in the slow tests)."""
    _pipeline_parity(tmp_path, 3, 2, "baseline", [["--pp", "2"]])


@pytest.mark.slow
def test_tp2_cli_loss_parity_short(tmp_path):
    _pipeline_parity(tmp_path, 3, 2, "baseline", [["--tp", "2", "--micro-batch", "2"]])


@pytest.mark.slow
def test_pipeline_schedules_loss_parity_20_steps(tmp_path):
    _pipeline_parity(tmp_path, 4, 20, "baseline,wavefront", [
        ["--pp", "2"], ["--pp", "2", "--vpp", "2", "--pp-schedule", "interleaved-1f1b"],
        ["--pp", "2", "--vpp", "2", "--pp-schedule", "zbv"], ["--pp", "2", "--tp", "2"]])


# ---- wavefront kernels on tensor-parallel shards -----------------------------------------------------------


@pytest.mark.parametrize("model", ["tiny-qwen3", pytest.param("tiny-llama", marks=pytest.mark.slow)])
def test_wavefront_kernels_run_on_the_shards_and_gradients_pass_the_accuracy_rule(model):
    """Every gradient of a TP2 forward/backward with wavefront patched in (vocabulary-parallel fused loss
    included), against float64: at most twice eager fp32's error plus 4 ulps of the largest value; and rank 0
    launches exactly the wavefront kernels one process does (a kernel that fell back to eager code under
    DTensor would be missing), plus the vocabulary-parallel loss's statistics kernel."""
    worker = Path(__file__).with_name("tp_check.py")
    r = subprocess.run([sys.executable, str(worker), model], env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    _assert_same_kernels(doc["tp_counts"], doc["one_counts"])
    for kernel in ("_norm_fwd_kernel", "_norm_bwd_kernel", "_rope_kernel", "_glu_fwd_kernel", "_glu_bwd_kernel"):
        assert doc["tp_counts"].get(kernel, 0) > 0, kernel
    for name, g in doc["grads"].items():
        assert g["err"] <= 2 * g["eager"] + 4 * EPS32 * g["scale"], (name, g)
    norms = [n for n in doc["grads"] if "norm" in n]
    assert sorted(doc["partial"]) == sorted(norms), "every norm weight's gradient is summed over the tp group"


# ---- the planner's plan, run and predicted -----------------------------------------------------------------


@pytest.mark.slow
def test_plan_json_piped_into_train_on_4_processes_prints_predicted_vs_measured(tmp_path):
    """`wavefront plan --json - | wavefront train --plan -`: the planner's best TP2 plan runs on 4 gloo
    ranks, and the run reports the planner's prediction for that plan on this machine beside its KPIs."""
    model = _model_dir(tmp_path, 2)
    plan = subprocess.run([sys.executable, "-m", "wavefront", "plan", "--model", f"{model}/config.json", "--gpus",
                           "4xh100", "--seq-len", "8", "--global-batch-tokens", "64", "--micro-batch", "2", "--fix",
                           "tp=2", "--json", "-"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert plan.returncode == 0, plan.stderr[-2000:]
    best = json.loads(plan.stdout)["plans"][0]["config"]
    doc = _train(tmp_path, "--plan", "-", "--nproc-per-node", "4", "--model", model, "--no-patch", "--seq-len", "8",
                 "--global-batch", "8", "--steps", "2", "--warmup-steps", "0", store="r.sqlite",
                 stdin=plan.stdout)
    layout = doc["provenance"]["layout"]
    assert (layout["tp"], layout["dp"]) == (best["tp"], best["dp"])
    assert layout["world_size"] == 4 and doc["config"]["micro_batch"] == best["micro_batch"]
    summary = doc["variants"][0]["summary"]
    pred = summary["prediction"]
    assert pred["ok"] and pred["plan"].startswith(f"tp2+sp pp1 dp{best['dp']}")
    dev = pred["device"]
    assert dev["matmul_tflops"] > 0 and dev["mem_gbps"] > 0 and dev["allreduce_busbw_gbps"] > 0
    rows = pred["vs_measured"]
    assert rows["step_s"]["measured"] == pytest.approx(summary["step_s_mean"])
    assert rows["step_s"]["predicted"] == pytest.approx(pred["time"]["step_s"]) and rows["step_s"]["predicted"] > 0
    assert rows["step_s"]["ratio"] == pytest.approx(rows["step_s"]["predicted"] / rows["step_s"]["measured"])
    import sqlite3

    con = sqlite3.connect(tmp_path / "r.sqlite")
    try:
        stored = [json.loads(cell) for row in con.execute("SELECT * FROM train_runs") for cell in row
                  if isinstance(cell, str) and cell.startswith("{") and '"prediction"' in cell]
    finally:
        con.close()
    assert stored and stored[0]["prediction"]["vs_measured"] == rows, "the results store keeps the comparison"


# ---- checkpoints across meshes, two "nodes" ------------------------------------------------------------------

RESUME = ["--no-patch", "--seq-len", "8", "--global-batch", "4", "--steps", "4", "--warmup-steps", "0", "--lr", "1e-2",
          "--timeout", "120"]


@pytest.mark.slow
def test_checkpoint_of_a_tp2_run_resumes_on_a_tp2_x_fsdp2_mesh(tmp_path):
    """DCP reshards: a TP2 run stopped after step 1 continues on TP2 x FSDP2 (4 processes), and the whole
    loss curve matches one uninterrupted process within the rounding envelope."""
    ref = _losses(_train(tmp_path, *RESUME, "--micro-batch", "4", name="single.json"))["baseline"]
    ckpt = ["--checkpoint-dir", "ck", "--checkpoint-every", "1"]
    cmd = [sys.executable, "-m", "wavefront", "train", *RESUME, "--micro-batch", "2", "--nproc-per-node", "2", "--tp",
           "2", *ckpt, "--inject-failure", "0:2", "--store", ""]
    stopped = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=400)
    assert stopped.returncode != 0 and "injected failure" in stopped.stderr
    doc = _train(tmp_path, *RESUME, "--micro-batch", "1", "--nproc-per-node", "4", "--tp", "2", "--dp-shard", "2",
                 *ckpt, "--resume", name="resumed.json")
    v = doc["variants"][0]
    assert v["resumed_from_step"] == 1 and [s["step"] for s in v["steps"]] == [2, 3]
    from wavefront.workbench.distributed.train.convergence import loss_envelope

    envelope = loss_envelope("tiny-llama", steps=4, seq_len=8, global_batch=4, lr=1e-2)
    _assert_parity(ref, v["history_losses"] + [s["loss"] for s in v["steps"]], envelope, "resumed on another mesh")


@pytest.mark.slow
def test_two_nodes_of_two_processes_with_c10d_rendezvous(tmp_path):
    """Two torchrun invocations (--nnodes 2, c10d rendezvous on this machine) run one TP2 x FSDP2 job."""
    from wavefront.workbench.distributed.launch import free_port

    endpoint = f"127.0.0.1:{free_port()}"
    args = ["--seq-len", "8", "--global-batch", "4", "--micro-batch", "1", "--steps", "2", "--warmup-steps", "0",
            "--no-patch", "--tp", "2", "--dp-shard", "2", "--store", "", "--timeout", "120"]
    procs = []
    for node in range(2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
               "--node-rank", str(node), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "wf-test",
               "-m", "wavefront", "train", *args, *(["--json", "out.json"] if node == 0 else [])]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["provenance"]["world_size"] == 4 and doc["provenance"]["layout"]["label"] == "dp_shard2 tp2"
    assert len(doc["variants"][0]["steps"]) == 2


def test_prediction_for_a_layout_uses_the_measured_device():
    """The planner sees the run's plan (ZeRO from the data-parallel kind) and this machine's rates: halving the
    matmul rate doubles the predicted compute; the comparison divides by what the run measured."""
    from types import SimpleNamespace

    from wavefront.workbench.distributed.train import predict
    from wavefront.workbench.distributed.train.mesh import Layout
    from wavefront.workbench.distributed.train.presets import build_config

    assert predict.plan_config(Layout(tp=2, dp_shard=2), 2, "none").zero == 3
    cfg = predict.plan_config(Layout(tp=2, dp_shard=2, dp_replicate=2), 1, "full")
    assert (cfg.zero, cfg.shard, cfg.dp, cfg.recompute) == (3, 2, 4, "full")
    assert predict.plan_config(Layout(dp_shard=1, dp_replicate=4), 1, "none").zero == 0
    assert predict.plan_config(Layout(pp=2, vpp=2, pp_schedule="zbv", dp_shard=1), 1, "none").zero_bubble
    dev = predict.MeasuredDevice(0.05, 10.0, 3.0, 100.0, 1.0, 16.0, 1, "test")
    config = build_config("tiny-llama")
    kw = dict(world=2, seq_len=32, global_batch=8, micro_batch=2)
    fast = predict.predict(dev, config, Layout(tp=2, dp_shard=1), **kw)
    slow = predict.predict(predict.MeasuredDevice(0.025, 10.0, 3.0, 100.0, 1.0, 16.0, 1, "test"), config,
                           Layout(tp=2, dp_shard=1), **kw)
    assert fast["ok"] and fast["plan"].startswith("tp2+sp pp1 dp1")
    assert fast["time"]["tp_comm_s"] > 0 and fast["time"]["dp_comm_s"] == 0
    assert slow["time"]["compute_s"] > 1.5 * fast["time"]["compute_s"]
    summary = SimpleNamespace(step_s_mean=2.0, fwd_s=0.5, bwd_s=1.0, comm_s=0.25, opt_s=0.25, bubble_s=None,
                              tokens_per_s=128.0)
    rows = predict.compare(fast, summary)
    assert rows["step_s"]["ratio"] == pytest.approx(fast["time"]["step_s"] / 2.0)
    assert rows["bubble_s"]["measured"] is None and rows["bubble_s"]["ratio"] is None
    line = predict.describe("baseline", {**fast, "vs_measured": rows})[0]
    assert "predicted vs measured" in line and "bubble 0 vs n/a" in line
