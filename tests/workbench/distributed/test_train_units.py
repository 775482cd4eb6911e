"""Pure parts of the training harness: config checks, data windows, KPI arithmetic, the SQLite store."""

from __future__ import annotations

import pytest
import torch

from wavefront.workbench.distributed.train.config import ConfigError, TrainConfig, parse_rank_step, parse_step_range
from wavefront.workbench.distributed.train.data import Batches, load_tokens, synthetic_corpus
from wavefront.workbench.distributed.train.kpi import Peak, StepRecord, compare, summarize
from wavefront.workbench.distributed.train.store import read_runs, read_steps, write_variant


@pytest.mark.parametrize(("overrides", "world", "message"), [
    ({"model": "no-such-model"}, 1, "unknown preset 'no-such-model'"),
    ({"data": "/no/such/file.bin"}, 1, "does not exist"),
    ({"global_batch": 6, "micro_batch": 2}, 2, "not divisible by world size x micro-batch = 2 x 2"),
    ({"parallel": "single"}, 2, "2 were launched"),
    ({"parallel": "fsdp2"}, 1, "needs at least 2 processes"),
    ({"parallel": "tp"}, 1, "--parallel must be one of"),
    ({"resume": True}, 1, "need --checkpoint-dir"),
    ({"variants": ("baseline", "wavefront"), "checkpoint_every": 1, "checkpoint_dir": "x"}, 1, "--compare"),
    ({"profile_steps": (3, 20)}, 1, "--profile-steps 3-20"),
    ({"seq_len": 100_000}, 1, "max_position_embeddings"),
    ({"patch_options": {"rmsnorm": True}}, 1, "unknown op(s) rmsnorm"),
    ({"gpu": "z80"}, 1, "unknown GPU 'z80'"),
    ({"inject_failure": (3, 1)}, 2, "outside the 2 launched ranks"),
    ({"store": __file__}, 1, "is not an SQLite results store"),
])
def test_bad_config_is_named(overrides, world, message):
    with pytest.raises(ConfigError, match=None) as err:
        TrainConfig(**overrides).validate(world)
    assert message in str(err.value)


def test_good_config_and_parsers():
    TrainConfig(parallel="fsdp2", global_batch=8, micro_batch=2).validate(2)
    assert TrainConfig(global_batch=8, micro_batch=2).grad_accum(2) == 2
    assert parse_step_range("3") == (3, 3) and parse_step_range("2-4") == (2, 4)
    assert parse_rank_step("1:5") == (1, 5)
    with pytest.raises(ConfigError):
        parse_rank_step("x")


def test_batches_do_not_depend_on_world_size():
    tokens = synthetic_corpus(64, 4096, seed=3)
    assert torch.equal(tokens, synthetic_corpus(64, 4096, seed=3))
    assert not torch.equal(tokens, synthetic_corpus(64, 4096, seed=4))
    b = Batches(tokens, seq_len=8, global_batch=4)
    one = torch.cat([b.micro_batch(5, 0, 1, m, 1) for m in range(4)])
    two = torch.cat([b.micro_batch(5, r, 2, m, 1) for r in range(2) for m in range(2)])
    assert torch.equal(one, two)
    assert not torch.equal(one, torch.cat([b.micro_batch(6, 0, 1, m, 1) for m in range(4)]))


def test_synthetic_corpus_is_learnable_markov_chain():
    tokens = synthetic_corpus(32, 20000, seed=0, branching=4)
    successors = {}
    for a, c in zip(tokens[:-1].tolist(), tokens[1:].tolist(), strict=True):
        successors.setdefault(a, set()).add(c)
    assert max(len(s) for s in successors.values()) <= 4


def test_load_tokens_formats_and_errors(tmp_path):
    import numpy as np

    np.save(tmp_path / "t.npy", np.arange(50, dtype=np.int32))
    assert load_tokens(tmp_path / "t.npy", vocab_size=64).tolist() == list(range(50))
    np.arange(50, dtype=np.uint16).tofile(tmp_path / "t.bin")
    assert load_tokens(tmp_path / "t.bin", vocab_size=64)[-1] == 49
    with pytest.raises(ValueError, match=r"span \[0, 49\] but the model's vocabulary is \[0, 10\)"):
        load_tokens(tmp_path / "t.bin", vocab_size=10)
    (tmp_path / "t.txt").write_text("héllo")
    assert load_tokens(tmp_path / "t.txt", vocab_size=256).tolist() == list("héllo".encode())
    with pytest.raises(ValueError, match="UTF-8 bytes"):
        load_tokens(tmp_path / "t.txt", vocab_size=128)


def _records(step_s: list[float], tokens: int = 1000) -> list[StepRecord]:
    return [StepRecord(i, 2.0 - i * 0.1, s, s / 2, s / 4, s / 8, s / 8, tokens, tokens / s, tokens / s / 2, None, None,
                       measured=i > 0) for i, s in enumerate(step_s)]


def test_summary_arithmetic_and_labels():
    from wavefront.workbench.hardware import get_gpu

    h100 = get_gpu("h100")
    s = summarize("wavefront", _records([9.0, 1.0, 3.0]), peak=Peak(100.0, "test"), model_flops=1e9, hw_flops=1.5e9,
                  n_params=10, world_size=2, peak_mem_bytes=123, peak_mem_kind="k", device_row=h100,
                  price_override=None, energy_window_j=None, energy_kind="none", is_gpu=True)
    assert s.steps_measured == 2 and s.step_s_mean == 2.0
    assert s.tokens_per_s == pytest.approx(2000 / 4.0)
    assert s.mfu == pytest.approx(500 * 1e9 / (2 * 100e12))
    assert s.hfu == pytest.approx(1.5 * s.mfu)
    assert s.cost_per_step == pytest.approx(2 * 2.99 * 2.0 / 3600)
    assert s.cost_per_mtok == pytest.approx(s.cost_per_step / 1000 * 1e6)
    assert s.energy_per_step_j == pytest.approx(2 * 700 * 0.75 * 2.0) and s.energy_kind.startswith("modeled")
    measured = summarize("w", _records([1.0, 1.0]), peak=Peak(None, "n/a"), model_flops=1, hw_flops=1, n_params=1,
                         world_size=1, peak_mem_bytes=1, peak_mem_kind="k", device_row=None, price_override=0.5,
                         energy_window_j=30.0, energy_kind="measured: NVML", is_gpu=False)
    assert measured.mfu is None and measured.energy_per_step_j == 30.0 and measured.cost_per_step > 0
    assert any("not performance figures" in n for n in measured.notes)
    ratios = compare(measured, s, [1.0, 2.0], [1.5, 2.0])
    assert ratios["max_abs_loss_diff"] == 0.5 and ratios["tokens_per_s_ratio"] == pytest.approx(500 / 1000)


def test_store_round_trip(tmp_path):
    db = tmp_path / "r.sqlite"
    recs = [r.__dict__ for r in _records([1.0, 2.0])]
    write_variant(db, run_id="r1", variant="baseline", status="ok", provenance={"world_size": 2}, config={"model": "m"},
                  summary={"tokens_per_s": 5.0, "peak": {"tflops": 1.0, "source": "s"}}, steps=recs)
    write_variant(db, run_id="r1", variant="wavefront", status="failed: x", provenance={}, config={}, summary=None,
                  steps=recs[:1])
    runs = {r["variant"]: r for r in read_runs(db)}
    assert runs["baseline"]["tokens_per_s"] == 5.0 and runs["baseline"]["world_size"] == 2
    assert runs["wavefront"]["status"] == "failed: x"
    assert [s["step"] for s in read_steps(db, "r1", "baseline")] == [0, 1]
