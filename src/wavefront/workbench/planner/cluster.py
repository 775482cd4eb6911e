"""The cluster: GPUs from the device table, how many per node, and what the links deliver.

Collective time uses the nccl-tests conventions (../shared/facts/training-math.md, "Collective bandwidth"):
with S the size nccl-tests divides by (the buffer for all_reduce, the full array for all_gather,
reduce_scatter and all_to_all, the message for broadcast and send/recv) and busbw the bus bandwidth of the
link the group runs on,

    t(S, n) = alpha + factor(n) * S / busbw,   factor = 2(n-1)/n all_reduce, (n-1)/n all_gather,
                                               reduce_scatter, all_to_all, 1 broadcast and send/recv.

alpha is the per-collective latency of the link (constant in n: an approximation that holds for NCCL's
tree/LL protocols at small sizes; the ring latency term grows with n). A `wavefront comm` calibration
file replaces (alpha, busbw) per collective with fitted values.

Rank layout (Megatron order, tensor parallel innermost): tp, then cp, then dp, then pp outermost. A group
of size g whose members are `stride` ranks apart stays inside a node when g * stride <= GPUs per node.
A group that spans nodes runs hierarchically, as NCCL's tree/NVLS-SHARP and ring-per-rail algorithms do
on rail-optimised fabrics (one NIC per GPU, every GPU of a node on its own rail): k = GPUs per node /
stride members share each node; the collective runs inside the node over the k members (scale-up link)
and across the g / k nodes on S / k bytes per member, each member on its own NIC:

    t = t_intra(S, k) + t_inter(S / k, g / k)

With k = 1 (a data-parallel group strided by a whole node of tensor parallelism) this is the flat
inter-node collective. Without the hierarchy an 8-GPU-per-node data-parallel group was charged one NIC's
bandwidth for the whole buffer, 8x too slow (issue #18, item 5). A `wavefront comm` inter-node
calibration replaces the whole formula with its fit (it measured the hierarchy as it is).

Defaults (override any of them on the command line; calibrate them with `wavefront comm`):
- intra-node busbw = 0.8 x the per-direction scale-up bandwidth of the device table. 0.8 is the ratio of the
  370 GB/s NCCL all-reduce busbw quoted for H100 NVLink (training-math.md, "Communication volume", sanity
  example) to NVLink4's 450 GB/s per direction; applied to every part as an assumption.
- inter-node: 200 Gb/s HDR InfiniBand per A100 (DGX A100 / Selene, Narayanan et al. 2021 Sec. 5: eight
  200 Gb/s HCAs per 8-GPU server), 400 Gb/s per GPU for H100/H200/B200/MI300-class parts (torchtitan
  benchmarks/llama3_h100_202412_torchtitan.md: "400 Gb/s per GPU"), times the same 0.8 efficiency.
- latency: 10 us intra-node, 25 us inter-node per collective (assumed typical NCCL small-message latencies).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from wavefront.workbench.hardware import GPU, get_gpu
from wavefront.workbench.planner.comm_model import Calibration, bus_factor

LINK_EFFICIENCY = 0.8
INTRA_LATENCY_US = 10.0
INTER_LATENCY_US = 25.0
#: Per-GPU inter-node NIC bandwidth, Gb/s, by device-table key (sources in the module docstring).
NIC_GBITS_PER_GPU = {"a100": 200.0}
DEFAULT_NIC_GBITS = 400.0


@dataclass(frozen=True)
class Link:
    """What one class of link delivers to a collective: bus bandwidth and per-collective latency."""

    busbw_gbps: float
    latency_us: float
    source: str = "default"

    def __post_init__(self) -> None:
        if not self.busbw_gbps > 0:
            raise ValueError(f"link bandwidth must be > 0 GB/s, got {self.busbw_gbps}")
        if self.latency_us < 0:
            raise ValueError(f"link latency must be >= 0 us, got {self.latency_us}")

    def time_s(self, collective: str, size_bytes: float, n: int) -> float:
        if n <= 1 and collective != "send_recv":
            return 0.0
        return self.latency_us * 1e-6 + bus_factor(collective, n) * size_bytes / (self.busbw_gbps * 1e9)


@dataclass(frozen=True)
class Cluster:
    gpu: GPU
    n_gpus: int
    gpus_per_node: int
    intra: Link
    inter: Link
    #: `wavefront comm` calibrations (at most one per domain); their fits win over intra/inter.
    calibrations: tuple[Calibration, ...] = field(default=())
    price_per_gpu_hour: float | None = None
    power_fraction: float = 0.75  # of board power while training (kpi.modeled_energy_j)
    #: Collectives across nodes run hierarchically (module docstring); False: flat, one NIC's bandwidth
    #: for the whole buffer (what the planner assumed before, and what 2021 DeepSpeed ZeRO-3 reached).
    hierarchical: bool = True
    nics_per_node: int = 0  # 0: one per GPU (rail-optimised)
    # collective_s and all_to_all_s memo: (collective, bytes, group, stride[, inter-node fraction]) -> s
    _seconds: dict[tuple[str, float, int, int] | tuple[str, float, int, int, float | None], float] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.n_gpus < 1 or self.gpus_per_node < 1:
            raise ValueError(f"n_gpus and gpus_per_node must be >= 1, got {self.n_gpus}, {self.gpus_per_node}")
        if self.n_gpus > self.gpus_per_node and self.n_gpus % self.gpus_per_node:
            raise ValueError(f"{self.n_gpus} GPUs do not fill whole nodes of {self.gpus_per_node}")

    @property
    def n_nodes(self) -> int:
        return max(1, self.n_gpus // self.gpus_per_node)

    @property
    def label(self) -> str:
        return f"{self.n_gpus}x{self.gpu.key}"

    def link(self, collective: str, group: int, stride: int) -> Link:
        """The link a group of `group` ranks spaced `stride` apart runs a collective on."""
        domain = "intra" if group * stride <= self.gpus_per_node else "inter"
        for cal in self.calibrations:
            if cal.domain == domain:
                fit = cal.fit_for(collective, group)
                if fit is not None:
                    return Link(fit.busbw_gbps, fit.alpha_us, f"calibrated: {cal.backend} on {cal.device}, "
                                                              f"{fit.group_size} ranks")
        return self.intra if domain == "intra" else self.inter

    def collective_s(self, collective: str, size_bytes: float, group: int, stride: int) -> float:
        """Seconds of one collective over `group` ranks `stride` apart (module docstring: hierarchical
        across nodes, each node's k members working on S/k through their own NICs)."""
        if group <= 1:
            return 0.0
        key = (collective, size_bytes, group, stride)
        cached = self._seconds.get(key)
        if cached is None:
            cached = self._seconds[key] = self._collective_s(collective, size_bytes, group, stride)
        return cached

    def _collective_s(self, collective: str, size_bytes: float, group: int, stride: int) -> float:
        if (group * stride <= self.gpus_per_node or collective == "send_recv" or not self.hierarchical
                or any(c.domain == "inter" for c in self.calibrations)):
            return self.link(collective, group, stride).time_s(collective, size_bytes, group)
        per_node = max(1, min(group, self.gpus_per_node // stride))
        nodes = max(1, group // per_node)
        inner = 0.0
        if per_node > 1:
            inner = self.link(collective, per_node, stride).time_s(collective, size_bytes, per_node)
        outer = self.inter.time_s(collective, size_bytes / per_node, nodes) if nodes > 1 else 0.0
        return inner + outer

    def all_to_all_s(self, size_bytes: float, group: int, stride: int = 1,
                     inter_fraction: float | None = None) -> float:
        """Seconds of one all-to-all (expert-parallel dispatch or combine) of `size_bytes` per rank over
        `group` ranks `stride` apart. Inside a node it is the nccl-tests all_to_all on the scale-up link.
        Across nodes an all-to-all reduces nothing, so the hierarchical formula (S/k per member) does not
        apply: each rank sends (k-1)/g of its bytes to its node's k members over the scale-up link and
        (g-k)/g to other nodes through its own NIC (one NIC per GPU, rails), the two at the same time:

            t = alpha_inter + max((k-1)/g S / busbw_intra, (g-k)/g S / busbw_inter)

        A `wavefront comm` inter-node calibration of all_to_all replaces the inter-node part's link.
        inter_fraction replaces (g-k)/g: the share of S that crosses nodes (a dispatcher that sends a token
        once per node moves less, Training.ep_dispatch)."""
        if group <= 1:
            return 0.0
        key = ("a2a", size_bytes, group, stride, inter_fraction)
        cached = self._seconds.get(key)
        if cached is None:
            if group * stride <= self.gpus_per_node:
                cached = self.link("all_to_all", group, stride).time_s("all_to_all", size_bytes, group)
            else:
                k = max(1, min(group, self.gpus_per_node // stride))
                intra, inter = self.link("all_to_all", k, stride), self.link("all_to_all", group, stride)
                cached = inter.latency_us * 1e-6 + max((k - 1) / group * size_bytes / (intra.busbw_gbps * 1e9),
                                                       ((group - k) / group if inter_fraction is None
                                                        else inter_fraction) * size_bytes / (inter.busbw_gbps * 1e9))
            self._seconds[key] = cached
        return cached

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu.key, "gpu_name": self.gpu.name, "n_gpus": self.n_gpus,
            "gpus_per_node": self.gpus_per_node, "n_nodes": self.n_nodes,
            "intra": vars(self.intra), "inter": vars(self.inter),
            "calibrations": [{"domain": c.domain, "backend": c.backend, "device": c.device,
                              "world_size": c.world_size, "created_utc": c.created_utc} for c in self.calibrations],
            "price_per_gpu_hour": self.price_per_gpu_hour, "power_fraction": self.power_fraction,
            "hierarchical": self.hierarchical, "nics_per_node": self.nics_per_node or self.gpus_per_node,
        }


_GPUS_RE = re.compile(r"^\s*(\d+)\s*[xX*]\s*([A-Za-z0-9._-]+)\s*$")


def parse_gpus(text: str) -> tuple[int, GPU]:
    """"64xh100" -> (64, the H100 row). Unknown GPUs list the known ones (hardware.get_gpu)."""
    match = _GPUS_RE.match(text)
    if not match:
        raise ValueError(f"--gpus must look like COUNTxGPU (e.g. 64xh100), got {text!r}")
    count = int(match.group(1))
    if count < 1:
        raise ValueError(f"--gpus count must be >= 1, got {count}")
    return count, get_gpu(match.group(2))


def default_links(gpu: GPU, gpus_per_node: int = 8, nics_per_node: int = 0,
                  nic_gbits: float | None = None) -> tuple[Link, Link]:
    """Default links; the inter-node link is one GPU's share of its node's NICs (rails)."""
    intra = Link(LINK_EFFICIENCY * gpu.scaleup_gbps_per_dir, INTRA_LATENCY_US,
                 f"default: {LINK_EFFICIENCY} x {gpu.scaleup_gbps_per_dir:g} GB/s scale-up per direction")
    nic_gbits = nic_gbits or NIC_GBITS_PER_GPU.get(gpu.key, DEFAULT_NIC_GBITS)
    nics = nics_per_node or gpus_per_node
    share = nics / gpus_per_node
    inter = Link(LINK_EFFICIENCY * nic_gbits / 8.0 * share, INTER_LATENCY_US,
                 f"default: {LINK_EFFICIENCY} x {nic_gbits:g} Gb/s NIC x {nics} NICs / {gpus_per_node} GPUs per node")
    return intra, inter


def make_cluster(gpus: str | tuple[int, GPU], *, gpus_per_node: int = 8, intra_gbps: float | None = None,
                 inter_gbps: float | None = None, intra_latency_us: float | None = None,
                 inter_latency_us: float | None = None, price_per_gpu_hour: float | None = None,
                 power_fraction: float = 0.75, calibrations: tuple[Calibration, ...] = (),
                 nics_per_node: int = 0, nic_gbits: float | None = None, hierarchical: bool = True,
                 hbm_gb: float | None = None, hbm_tbps: float | None = None) -> Cluster:
    """A cluster from "64xh100"-style text, with default links unless given; `calibrations` (from
    planner.comm_model.load_calibration, one per domain) replace the links of their domain."""
    n, gpu = parse_gpus(gpus) if isinstance(gpus, str) else gpus
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
    if nics_per_node < 0 or (nic_gbits is not None and nic_gbits <= 0):
        raise ValueError(f"nics_per_node must be >= 0 and nic_gbits > 0, got {nics_per_node}, {nic_gbits}")
    for name, value in (("hbm_gb", hbm_gb), ("hbm_tbps", hbm_tbps)):
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    if hbm_gb is not None or hbm_tbps is not None:
        gpu = replace(gpu, hbm_gb=hbm_gb or gpu.hbm_gb, hbm_tbps=hbm_tbps or gpu.hbm_tbps,
                      source=gpu.source + "; capacity/bandwidth overridden by the user")
    intra, inter = default_links(gpu, min(gpus_per_node, n), nics_per_node, nic_gbits)
    if intra_gbps is not None or intra_latency_us is not None:
        intra = replace(intra, busbw_gbps=intra_gbps or intra.busbw_gbps,
                        latency_us=intra.latency_us if intra_latency_us is None else intra_latency_us,
                        source="user")
    if inter_gbps is not None or inter_latency_us is not None:
        inter = replace(inter, busbw_gbps=inter_gbps or inter.busbw_gbps,
                        latency_us=inter.latency_us if inter_latency_us is None else inter_latency_us,
                        source="user")
    price = price_per_gpu_hour if price_per_gpu_hour is not None else gpu.price_per_hour
    domains = [c.domain for c in calibrations]
    if len(set(domains)) != len(domains):
        raise ValueError(f"at most one calibration per domain (intra, inter); got domains {domains}")
    return Cluster(gpu, n, min(gpus_per_node, n), intra, inter, tuple(calibrations), price, power_fraction,
                   hierarchical, nics_per_node)
