"""Training KPIs: per-step records, the run summary, and the measurements they need (device peak,
memory, energy, price), each labelled with where its number came from.

Conventions (formulas in wavefront.workbench.kpi; sources in ../shared/facts/training-math.md):

- tokens/s = global tokens per step / step time (slowest rank); per device = that / world size.
- MFU = tokens/s x model FLOPs per token (PaLM: 6N + 12 L H Q T) / (devices x dense peak). HFU adds the
  forward recomputed by activation checkpointing (8N-style, ``recompute="full"``).
- Dense peak: the device table's BF16 (bf16 autocast) or TF32/FP32 figure for the detected GPU, or
  ``--peak-tflops``. A CPU has no table entry, so the harness *measures* one: the best of several timed
  fp32 matmuls in the same process and thread setting, labelled "measured". MFU on a CPU running the
  Triton interpreter is a correctness-run figure, not a performance one.
- Step time split: forward (model + loss), backward compute, exposed communication, optimizer. Exposed
  communication is the tail of backward after the last gradient was computed: from the moment the
  gradient reaches the input embeddings' output (the last layer backward visits; only the embedding
  gather is left) until backward returns, which is when DDP's final all-reduce / FSDP's final
  reduce-scatter has been waited for. On a single process it is 0 by definition (the tail is counted as
  backward). FSDP all-gathers not hidden behind compute show up in forward/backward, not here.
- Memory: peak bytes allocated on the GPU (torch.cuda.max_memory_allocated, max over ranks); on a CPU,
  the process's peak resident set size sampled every 5 ms (includes the Python runtime; labelled).
- Energy per step: from the GPU's energy counter (NVML total energy, amdsmi energy count) read across the
  measured window, or modeled from board power (kpi.modeled_energy_j) and labelled "modeled"; None on a
  CPU without a readable counter.
- $/step and $/Mtok: devices x $/device-hour x step time; the device table's dated default price or
  ``--price-per-hour``; None on a CPU without a price.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass, field

import torch

from wavefront.shapes import ModelDims
from wavefront.workbench import kpi
from wavefront.workbench.hardware import get_gpu, gpu_from_device_name


@dataclass
class StepRecord:
    step: int
    loss: float
    step_s: float
    fwd_s: float
    bwd_s: float
    comm_s: float  # exposed communication
    opt_s: float
    tokens: int  # global tokens this step
    tokens_per_s: float
    tokens_per_s_per_device: float
    mfu: float | None
    hfu: float | None
    measured: bool  # counted in the summary (not warm-up, not profiled)
    bubble_s: float | None = None  # pipeline idle time (part of comm_s): waiting for peers, p2p transfers
    moe_imbalance: float | None = None  # MoE: max / mean tokens per expert, pooled over layers (expert_parallel.py)
    #: the fused loss (a patched model): the fraction of non-ignored next tokens predicted right (argmax) and the
    #: z-loss term in the loss (0 unless the head's z_loss coefficient is set), both from the loss kernel's pass
    token_accuracy: float | None = None
    z_loss: float | None = None


@dataclass
class Peak:
    tflops: float | None  # dense peak per device
    source: str  # "device table: ...", "--peak-tflops", "measured: ...", or why there is none


@dataclass
class Summary:
    variant: str
    steps_measured: int
    step_s_median: float
    step_s_mean: float
    fwd_s: float
    bwd_s: float
    comm_s: float
    opt_s: float
    tokens_per_s: float
    tokens_per_s_per_device: float
    mfu: float | None
    hfu: float | None
    peak: Peak
    flops_per_token: float
    hw_flops_per_token: float
    n_params: int
    peak_mem_bytes: int
    peak_mem_kind: str
    cost_per_step: float | None
    cost_per_mtok: float | None
    price_source: str
    energy_per_step_j: float | None
    energy_kind: str
    final_loss: float
    patch: dict | None = None
    #: the last step's token accuracy and z-loss term, where the fused loss computed them (StepRecord)
    final_token_accuracy: float | None = None
    final_z_loss: float | None = None
    notes: list[str] = field(default_factory=list)
    bubble_s: float | None = None  # pipeline idle time per step (part of comm_s), where measured
    #: the planner's prediction for the same plan on this machine, and predicted vs measured (predict.py)
    prediction: dict | None = None
    #: --fp8: the swapped layers' FLOPs against the FP8 peak and the rest against the bf16 peak (train/fp8.py);
    #: ``mfu`` stays every FLOP against the bf16 peak
    mfu_fp8: float | None = None
    #: communication per mesh dimension from the profiled step(s): {dim: {comm_s, exposed_s}} (train/overlap.py)
    comm_by_dim: dict | None = None
    fp8: dict | None = None  # recipe, FP8 FLOPs per token, layers swapped, both peaks and their sources
    #: MoE: load imbalance (max / mean tokens per expert) over the measured steps, overall and per layer, the worst
    #: step's, and the tokens per expert (train/expert_parallel.py); MFU and HFU then count active parameters
    moe_imbalance: float | None = None
    moe: dict | None = None


def flops_per_token(config, seq_len: int, n_matmul_params: int, recompute: str) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) per token for a transformers config, PaLM convention."""
    if hasattr(config, "get_text_config"):  # a vision-language model: the text tower's dimensions
        config = config.get_text_config()
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    dims = ModelDims(name=config.model_type, hidden=config.hidden_size, ffn_hidden=config.intermediate_size,
                     n_layers=config.num_hidden_layers, n_heads=heads,
                     n_kv_heads=getattr(config, "num_key_value_heads", None) or heads, head_dim=head_dim,
                     vocab=config.vocab_size, seq_len=seq_len,
                     tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)))
    model_f = kpi.flops_per_token(dims, seq_len, n_params=n_matmul_params)
    hw_f = kpi.hardware_flops_per_token(dims, seq_len, recompute=recompute, n_params=n_matmul_params)
    return model_f, hw_f


def matmul_params(model) -> int:
    """Parameters that take part in matmuls: all minus an untied input-embedding table (a lookup)."""
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    tied = out is not None and getattr(out, "weight", None) is emb
    return total if tied else total - emb.numel()


def measure_cpu_peak_tflops(n: int = 512, repeats: int = 5) -> Peak:
    """Best fp32 matmul rate of this process with its current thread setting (a CPU has no table peak)."""
    a = torch.randn(n, n)
    b = torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    tflops = 2 * n**3 / best / 1e12
    return Peak(tflops, f"measured: best of {repeats} fp32 {n}^3 matmuls in this process "
                        f"({torch.get_num_threads()} thread(s)); CPU interpreter run, not a performance figure")


def device_peak(device: torch.device, gpu_key: str | None, override: float | None, bf16: bool) -> tuple[Peak, object]:
    """The dense peak and the device-table row (None on CPU or an unknown GPU)."""
    row = None
    if device.type == "cuda":
        try:
            row = get_gpu(gpu_key) if gpu_key else gpu_from_device_name(torch.cuda.get_device_name(device))
        except ValueError as e:
            if override is None:
                return Peak(None, f"not applicable: {e}; pass --peak-tflops"), None
    elif gpu_key:
        row = get_gpu(gpu_key)
    if override is not None:
        return Peak(override, "--peak-tflops"), row
    if row is not None:
        dtype = "bf16" if bf16 else ("tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32")
        try:
            return Peak(row.peak_tflops(dtype), f"device table: {row.name} dense {dtype}"), row
        except ValueError as e:
            return Peak(None, f"not applicable: {e}"), row
    return measure_cpu_peak_tflops(), None


class MemoryMeter:
    """Peak memory over a window: the CUDA allocator's peak, or the sampled peak RSS on a CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self._peak_rss = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def kind(self) -> str:
        if self.device.type == "cuda":
            return "torch.cuda.max_memory_allocated (max over ranks)"
        return "CPU process peak RSS sampled every 5 ms (max over ranks; includes the Python runtime)"

    @staticmethod
    def _rss() -> int:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            import resource  # lazy: Unix only

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self._peak_rss = max(self._peak_rss, self._rss())

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        self._peak_rss = self._rss()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def stop(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return max(self._peak_rss, self._rss())


class EnergyMeter:
    """Cumulative device energy in joules from NVML or amdsmi; ``kind`` says which, None when neither."""

    def __init__(self, device: torch.device):
        self._read = None
        self.kind = "none"
        if device.type != "cuda":
            return
        index = device.index if device.index is not None else torch.cuda.current_device()
        try:
            import pynvml  # lazy: optional pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            self._read = lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3  # mJ -> J
            self.kind = "measured: NVML total energy counter"
            return
        except Exception:
            pass
        try:
            import amdsmi  # lazy: optional amdsmi

            amdsmi.amdsmi_init()
            handle = amdsmi.amdsmi_get_processor_handles()[index]

            def read() -> float:
                e = amdsmi.amdsmi_get_energy_count(handle)
                return e["energy_accumulator"] * e["counter_resolution"] / 1e6  # uJ -> J

            read()
            self._read = read
            self.kind = "measured: amdsmi energy counter"
        except Exception:
            pass

    def read(self) -> float | None:
        return self._read() if self._read is not None else None


def summarize(variant: str, records: list[StepRecord], *, peak: Peak, model_flops: float, hw_flops: float,
              n_params: int, world_size: int, peak_mem_bytes: int, peak_mem_kind: str, device_row,
              price_override: float | None, energy_window_j: float | None, energy_kind: str,
              is_gpu: bool) -> Summary:
    """Summary KPIs over the measured steps (all steps when none is marked measured)."""
    measured = [r for r in records if r.measured] or records
    step_times = [r.step_s for r in measured]
    total_s = sum(step_times)
    tokens = sum(r.tokens for r in measured)
    tps = tokens / total_s
    mean_step = total_s / len(measured)

    def util(flops: float) -> float | None:
        return kpi.utilization(tps, flops, world_size, peak.tflops) if peak.tflops else None

    price, price_source = price_override, "--price-per-hour"
    if price is None and device_row is not None and device_row.price_per_hour is not None:
        price, price_source = device_row.price_per_hour, (f"device table default for {device_row.name} "
                                                          f"(mid-2026 on-demand, training-math.md)")
    if price is None:
        price_source = "none: no $/hour for this device; pass --price-per-hour"
    cost = kpi.cost_per_step(world_size, price, mean_step) if price is not None else None
    cost_mtok = kpi.cost_per_million_tokens(world_size, price, mean_step, tokens / len(measured)) \
        if price is not None else None

    energy, kind = None, "none: no energy counter and no board power for this device"
    if energy_window_j is not None:
        energy, kind = energy_window_j / len(measured), energy_kind
    elif is_gpu and device_row is not None:
        energy = kpi.modeled_energy_j(world_size, device_row.tdp_w, mean_step)
        kind = f"modeled: {world_size} x {device_row.tdp_w:.0f} W board power x 0.75 x step time"

    notes = []
    if not is_gpu:
        notes.append("CPU run: wall times are correctness runs, not performance figures")
    return Summary(
        variant=variant, steps_measured=len(measured), step_s_median=statistics.median(step_times),
        step_s_mean=mean_step, fwd_s=statistics.fmean(r.fwd_s for r in measured),
        bwd_s=statistics.fmean(r.bwd_s for r in measured), comm_s=statistics.fmean(r.comm_s for r in measured),
        opt_s=statistics.fmean(r.opt_s for r in measured), tokens_per_s=tps,
        tokens_per_s_per_device=tps / world_size, mfu=util(model_flops), hfu=util(hw_flops), peak=peak,
        flops_per_token=model_flops, hw_flops_per_token=hw_flops, n_params=n_params,
        peak_mem_bytes=peak_mem_bytes, peak_mem_kind=peak_mem_kind, cost_per_step=cost, cost_per_mtok=cost_mtok,
        price_source=price_source, energy_per_step_j=energy, energy_kind=kind, final_loss=records[-1].loss,
        final_token_accuracy=records[-1].token_accuracy, final_z_loss=records[-1].z_loss,
        notes=notes, bubble_s=statistics.fmean(bubbles) if (bubbles := [r.bubble_s for r in measured
                                                                         if r.bubble_s is not None]) else None)


def compare(baseline: Summary, patched: Summary, base_losses: list[float], patched_losses: list[float]) -> dict:
    """Side-by-side ratios (patched / baseline) and how closely the two loss curves agree."""
    diffs = [abs(a - b) for a, b in zip(base_losses, patched_losses, strict=False)]
    return {
        "tokens_per_s_ratio": patched.tokens_per_s / baseline.tokens_per_s,
        "step_s_ratio": patched.step_s_mean / baseline.step_s_mean,
        "peak_mem_ratio": patched.peak_mem_bytes / baseline.peak_mem_bytes if baseline.peak_mem_bytes else None,
        "max_abs_loss_diff": max(diffs) if diffs else None,
        "final_loss_diff": patched.final_loss - baseline.final_loss,
    }
