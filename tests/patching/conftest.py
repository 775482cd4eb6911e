"""Tiny models of every patched family, built locally from the harness presets (nothing downloaded)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from wavefront.workbench.distributed.train.presets import TINY_BY_FAMILY, build_model  # noqa: E402

FAMILIES = sorted(TINY_BY_FAMILY)

#: The final norm's path where it is not ``model.norm``.
_FINAL_NORM = {"falcon_h1": "model.final_layernorm", "qwen3_vl": "model.language_model.norm",
               "qwen2_5_vl": "model.language_model.norm"}


def final_norm_path(family: str) -> str:
    return _FINAL_NORM.get(family, "model.norm")


#: A patch that swaps only the norms (isolates them from RoPE, MLP, MoE and loss in some tests).
NORMS_ONLY = {"rope": False, "mlp": False, "moe": False, "loss": False}


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    return request.param


def _tiny(family: str, seed: int = 0, **overrides):
    return build_model(TINY_BY_FAMILY[family], seed=seed, **overrides)


@pytest.fixture
def tiny():
    """tiny(family, seed=0, **config_overrides) -> a freshly initialized tiny causal LM of that family (config
    fields overridable, e.g. num_hidden_layers=1 where one layer holds every module a test exercises)."""
    return _tiny


@pytest.fixture
def norms_only() -> dict:
    return dict(NORMS_ONLY)


def _uncovered(family: str) -> set[str]:
    """The ops a family has that its rules refuse (reported unmatched when requested): GLM-4's RoPE, Granite's loss."""
    from wavefront.patching.rules import family_for

    rules = family_for(family)  # the tiny presets are keyed by model_type
    out = {op for op, _ in rules.unsupported}
    for op in ("rope", "attention"):
        rule = getattr(rules, op)
        if rule is not None and rule.unsupported:
            out.add(op)
    return out


@pytest.fixture(autouse=True)
def single_thread():
    """One intra-op thread: on a shared 2-core machine OpenMP's spinning threads slow tiny models 100x."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def uncovered():
    """uncovered(family) -> the ops the family has that its rules refuse (GLM-4's RoPE, Granite's loss)."""
    return _uncovered


@pytest.fixture
def final_norm():
    """final_norm(family) -> the path of the model's final norm ("model.norm" but for Falcon-H1 and the VL models)."""
    return final_norm_path
