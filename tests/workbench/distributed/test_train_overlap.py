"""`wavefront train` overlap options (train/overlap.py): FSDP2 prefetch and resharding, async TP's refusals,
and the exposed communication per mesh dimension measured from a profiled step of a 2-process gloo run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from wavefront.workbench.distributed.train import overlap
from wavefront.workbench.distributed.train.mesh import Layout


def _layout(**kw) -> Layout:
    base = {"tp": 1, "pp": 1, "cp": 1, "dp_shard": 1, "dp_replicate": 1, "vpp": 1, "pp_schedule": "1f1b",
            "source": "options"}
    return Layout(**{**base, **kw})


def test_reshard_values_parse_and_bad_ones_name_the_option():
    assert overlap.parse_reshard("true") is True and overlap.parse_reshard("False") is False
    assert overlap.parse_reshard("2") == 2
    for bad in ("maybe", "0", "-1"):
        with pytest.raises(ValueError, match="--reshard-after-forward"):
            overlap.parse_reshard(bad)


@pytest.mark.parametrize(("kw", "message"), [
    ({"async_tp": True, "layout": _layout(tp=2), "variants": ("compile",)}, "--async-tp needs CUDA"),
    ({"async_tp": True, "layout": _layout(dp_shard=2), "variants": ("compile",), "cuda": True},
     "it needs --tp > 1"),
    ({"async_tp": True, "layout": _layout(tp=2), "variants": ("wavefront",), "cuda": True},
     "it runs on the compiled model"),
    ({"fsdp_prefetch": 1, "layout": _layout(dp_replicate=2)}, "does not shard with FSDP2"),  # --parallel ddp
    ({"fsdp_prefetch": 1, "layout": _layout()}, "does not shard with FSDP2"),  # --parallel single
    ({"fsdp_prefetch": 1, "layout": _layout(tp=2)}, "does not shard with FSDP2"),
    ({"reshard_after_forward": "3", "layout": _layout(dp_shard=4)}, "must divide the shard degree 4"),
    ({"fsdp_prefetch": 1, "layout": _layout(pp=2, dp_shard=2)}, "not applied to pipeline stages"),
])
def test_overlap_options_that_cannot_run_are_refused(kw, message):
    args = {"fsdp_prefetch": 0, "reshard_after_forward": True, "async_tp": False, "layout": _layout(),
            "variants": ("wavefront",), "cuda": False, **kw}
    assert any(message in p for p in overlap.problems(**args)), overlap.problems(**args)


def test_good_overlap_options_pass():
    assert overlap.problems(fsdp_prefetch=2, reshard_after_forward=2, async_tp=False,
                            layout=_layout(dp_shard=4), variants=("wavefront",), cuda=False) == []
    assert overlap.problems(fsdp_prefetch=0, reshard_after_forward=True, async_tp=True,
                            layout=_layout(tp=2), variants=("baseline", "compile"), cuda=True) == []


class _Layer:
    def __init__(self, i: int):
        self.i, self.fwd, self.bwd = i, [], []

    def set_modules_to_forward_prefetch(self, mods):
        self.fwd = [m.i for m in mods]

    def set_modules_to_backward_prefetch(self, mods):
        self.bwd = [m.i for m in mods]


def test_prefetch_links_the_next_layers_forward_and_the_previous_ones_backward():
    layers = [_Layer(i) for i in range(4)]
    assert overlap.set_prefetch(layers, 2) == 10
    assert [x.fwd for x in layers] == [[1, 2], [2, 3], [3], []]
    assert [x.bwd for x in layers] == [[], [0], [1, 0], [2, 1]]
    assert overlap.set_prefetch([_Layer(0)], 0) == 0


def test_collectives_are_attributed_to_mesh_dimensions():
    fsdp = {"dp_shard": 2}
    assert overlap._dim_of_cpu_op("gloo:all_gather", True, fsdp) == "dp_shard"
    hsdp = {"dp_shard": 2, "dp_replicate": 2}
    assert overlap._dim_of_cpu_op("c10d::allreduce_", True, hsdp) == "dp_replicate"
    assert overlap._dim_of_cpu_op("c10d::_reduce_scatter_base_", True, hsdp) == "dp_shard"
    assert overlap._dim_of_cpu_op("gloo:all_reduce", True, hsdp) == "unattributed"
    assert overlap._dim_of_cpu_op("gloo:all_reduce", False, {"tp": 2, "dp_shard": 2}) == "tp"
    assert overlap._dim_of_cpu_op("gloo:send", False, {"tp": 2, "pp": 2}) == "pp"
    assert overlap._dim_of_cpu_op("gloo:all_reduce", False, {"tp": 2, "cp": 2}) == "unattributed"
    pgs = {"7": "mesh_tp"}
    assert overlap._dim_of_group({"pg_desc": "mesh_dp_shard"}, pgs) == "dp_shard"
    assert overlap._dim_of_group({"pg_name": "7"}, pgs) == "tp"
    assert overlap._dim_of_group({"pg_desc": "default_pg"}, pgs) is None
    assert overlap._dim_of_group({}, pgs) == "unattributed"


def test_across_ranks_keeps_the_slowest_rank_and_only_dimensions_present():
    ranks = [{"tp": {"comm_s": 1.0, "exposed_s": 0.5}}, {"tp": {"comm_s": 2.0, "exposed_s": 0.25}}]
    flats = []
    overlap.across_ranks(ranks[1], lambda v: flats.append(v) or v)  # what rank 1 contributes

    def reduce_max(v):  # rank 0's view of an all-reduce MAX with rank 1
        return [max(x, y) for x, y in zip(v, flats[0], strict=True)]

    assert overlap.across_ranks(ranks[0], reduce_max) == {"tp": {"comm_s": 2.0, "exposed_s": 0.5}}


def test_async_tp_on_a_cpu_exits_2_with_one_line(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from typer.testing import CliRunner

    from wavefront.cli import build_app

    monkeypatch.chdir(tmp_path)
    for var in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(var, raising=False)
    r = CliRunner().invoke(build_app(), ["train", "--async-tp", "--store", ""])
    assert r.exit_code == 2 and "--async-tp needs CUDA" in " ".join(r.stderr.split()) and "Traceback" not in r.output
    r = CliRunner().invoke(build_app(), ["train", "--reshard-after-forward", "often", "--store", ""])
    assert r.exit_code == 2 and "--reshard-after-forward: expected true, false or an integer" in " ".join(
        r.stderr.split())


def _train(tmp_path: Path, *args: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[3] / "src"),
                                         env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, "-m", "wavefront", "train", "--model", "tiny-llama", "--no-patch", "--seq-len", "8",
           "--global-batch", "2", "--micro-batch", "1", "--steps", "2", "--warmup-steps", "0", "--nproc-per-node",
           "2", "--profile-steps", "1", "--timeout", "120", "--store", "", "--json", "out.json", *args]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((tmp_path / "out.json").read_text())


def _check_split(doc: dict, active: str) -> None:
    split = doc["variants"][0]["summary"]["comm_by_dim"]
    assert set(split) == {active}, split  # no time for inactive dimensions (nor unattributed collectives)
    assert split[active]["comm_s"] > 0 and 0 <= split[active]["exposed_s"] <= split[active]["comm_s"]


def test_fsdp2_prefetch_run_reports_exposed_comm_for_dp_shard_only(tmp_path):
    doc = _train(tmp_path, "--dp-shard", "2", "--fsdp-prefetch", "1", "--reshard-after-forward", "false")
    assert doc["config"]["fsdp_prefetch"] == 1 and doc["config"]["reshard_after_forward"] is False
    _check_split(doc, "dp_shard")


@pytest.mark.slow
def test_tp2_run_reports_exposed_comm_for_tp_only(tmp_path):
    _check_split(_train(tmp_path, "--tp", "2", "--micro-batch", "2"), "tp")
