"""The convergence proof: a patched model trains like the unpatched one, step for step.

Copies of one initialized model train on the same fixed synthetic corpus with AdamW:

- ``ref``: unpatched, in float64, the ground truth;
- ``eager``: unpatched, in float32 (what users run today), plus ``n_perturbed`` more unpatched float32
  runs whose initial weights are moved by one ulp in a random direction (a rounding-level change, like a
  different fp32 reduction order);
- ``patched``: wavefront-patched, in float32.

The tolerance is derived, not guessed: it is the project's accuracy rule (docs/developing.md) applied to
training. fp32 rounding perturbs training, and the unpatched fp32 runs' spread around float64 measures how
sensitive this model and optimizer are to rounding: the envelope ``env`` is the largest distance of any
unpatched fp32 run from float64. The patched run passes when its distance to float64 is at most twice
that envelope, plus a few fp32 ulps of the value:

    |patched_t - ref_t| <= 2 * max_{s <= t} env_s + 4 * eps32 * |ref_t|     (loss at step t)

and the same with the maximum over elements for the final parameters and for eval-mode logits on a
held-out batch. The running maximum reflects that rounding differences compound over steps.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field

import torch

import wavefront
from wavefront.workbench.distributed.train.data import Batches, synthetic_corpus
from wavefront.workbench.distributed.train.presets import build_model

EPS32 = torch.finfo(torch.float32).eps


@dataclass
class Agreement:
    """One compared quantity: errors vs the float64 run and the derived bound."""

    what: str
    err_eager: float
    err_patched: float
    tol: float

    @property
    def ok(self) -> bool:
        return self.err_patched <= self.tol


@dataclass
class ConvergenceResult:
    preset: str
    steps: int
    loss_ref: list[float]
    loss_eager: list[float]
    loss_patched: list[float]
    checks: list[Agreement] = field(default_factory=list)
    patch_report: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def failures(self) -> list[Agreement]:
        return [c for c in self.checks if not c.ok]

    def as_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def train_losses(model, batches, steps: int, lr: float) -> list[float]:
    """The loss of every step of plain AdamW training on `batches` (one micro-batch per step)."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=False)
    losses = []
    for step in range(steps):
        ids = batches.micro_batch(step, 0, 1, 0, batches.global_batch)
        loss = _float64_loss(model, ids) if _is_float64(model) else model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach().to(torch.float64)))
    return losses


def _is_float64(model) -> bool:
    return next(model.parameters()).dtype == torch.float64


def _float64_loss(model, ids: torch.Tensor) -> torch.Tensor:
    """The causal-LM loss of a float64 model computed in float64. transformers' loss casts the logits to
    float32 first (`logits.float()`), which would make a "float64" reference an fp32 one at the loss: the
    same mean next-token cross-entropy as its `labels=` path, without that cast."""
    out = model(input_ids=ids)
    logits = out.logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    aux = getattr(out, "aux_loss", None)  # MoE models add the router's load-balancing loss on the labels path
    if aux is not None:
        loss = loss + model.config.router_aux_loss_coef * aux
    return loss


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max())


def _nudge_one_ulp(model, seed: int) -> None:
    """Move every fp32 weight one ulp up or down (random direction, fixed by the seed)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            up = torch.rand(p.shape, generator=gen) < 0.5
            target = torch.where(up, torch.full_like(p, float("inf")), torch.full_like(p, float("-inf")))
            p.copy_(torch.nextafter(p, target))


def run_convergence(preset: str, *, steps: int = 20, batch: int = 1, seq_len: int = 8, lr: float = 1e-2,
                    seed: int = 0, n_perturbed: int = 2, patch_options: dict | None = None,
                    **config_overrides) -> ConvergenceResult:
    """Train ref/eager/patched copies of a tiny preset (config fields overridable, e.g.
    num_hidden_layers=1); see the module docstring for the criterion."""
    base = build_model(preset, seed=seed, **config_overrides)
    ref = copy.deepcopy(base).to(torch.float64)
    eager = copy.deepcopy(base)
    perturbed = [copy.deepcopy(base) for _ in range(n_perturbed)]
    for i, m in enumerate(perturbed):
        _nudge_one_ulp(m, seed + 1 + i)
    patched = copy.deepcopy(base)
    report = wavefront.patch(patched, **(patch_options or {}))

    corpus = synthetic_corpus(base.config.get_text_config().vocab_size, 4096, seed=seed)
    batches = Batches(corpus, seq_len, batch)
    loss_ref = train_losses(ref, batches, steps, lr)
    unpatched32 = [eager, *perturbed]
    loss_runs = [train_losses(m, batches, steps, lr) for m in unpatched32]
    loss_eager = loss_runs[0]
    loss_patched = train_losses(patched, batches, steps, lr)

    result = ConvergenceResult(preset, steps, loss_ref, loss_eager, loss_patched, patch_report=report.as_dict())
    running = 0.0
    for t, (r, p) in enumerate(zip(loss_ref, loss_patched, strict=True)):
        env = max(abs(run[t] - r) for run in loss_runs)
        running = max(running, env)
        result.checks.append(Agreement(f"loss step {t}", env, abs(p - r), 2 * running + 4 * EPS32 * abs(r)))

    ref_params = dict(ref.named_parameters())
    runs_params = [dict(m.named_parameters()) for m in unpatched32]
    env = worst_patched = scale = 0.0
    for name, p in patched.named_parameters():
        env = max(env, *(_max_abs(run[name], ref_params[name]) for run in runs_params))
        worst_patched = max(worst_patched, _max_abs(p, ref_params[name]))
        scale = max(scale, float(ref_params[name].detach().abs().max()))
    result.checks.append(Agreement("final parameters", env, worst_patched, 2 * env + 4 * EPS32 * scale))

    held_out = torch.stack([batches.sample(10_000 + i) for i in range(batch)])
    with torch.no_grad():
        for m in (ref, *unpatched32, patched):
            m.eval()
        logits_ref = ref(input_ids=held_out).logits
        env = max(_max_abs(m(input_ids=held_out).logits, logits_ref) for m in unpatched32)
        err_p = _max_abs(patched(input_ids=held_out).logits, logits_ref)
    result.checks.append(Agreement("eval logits", env, err_p, 2 * env + 4 * EPS32 * float(logits_ref.abs().max())))
    return result


def loss_envelope(preset: str, *, steps: int, seq_len: int, global_batch: int, lr: float, seed: int = 0,
                  n_perturbed: int = 2) -> list[float]:
    """The rounding envelope of the harness's own run (same corpus, batches, AdamW): per step, the running
    maximum over unpatched fp32 runs (one as built, `n_perturbed` moved by one ulp) of their loss distance
    from a float64 run. Two fp32 runs that differ only by rounding (a different reduction order, e.g. split
    over tensor-parallel ranks) lie within ``2 * envelope[t]`` of each other, plus a few ulps of the loss."""
    base = build_model(preset, seed=seed, attn_implementation="sdpa")
    corpus = synthetic_corpus(base.config.vocab_size, max(1 << 16, 2 * seq_len * global_batch), seed=seed)
    batches = Batches(corpus, seq_len, global_batch)
    ref = copy.deepcopy(base).to(torch.float64)
    if hasattr(ref.config, "_experts_implementation"):  # MoE experts: torch._grouped_mm has no float64
        ref.config._experts_implementation = "eager"
    loss_ref = train_losses(ref, batches, steps, lr)
    runs = [copy.deepcopy(base) for _ in range(1 + n_perturbed)]
    for i, m in enumerate(runs[1:]):
        _nudge_one_ulp(m, seed + 1 + i)
    losses = [train_losses(m, batches, steps, lr) for m in runs]
    out, running = [], 0.0
    for t, r in enumerate(loss_ref):
        running = max(running, *(abs(run[t] - r) for run in losses))
        out.append(running)
    return out
