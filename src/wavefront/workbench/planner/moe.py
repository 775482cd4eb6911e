"""Mixture-of-experts models for the planner: the expert layout, multi-head latent attention, the presets.

A MoE layer replaces the dense MLP by a router and E experts, each a gated MLP of width `expert_ffn`, of
which every token visits `top_k`; `n_shared` shared experts (DeepSeek-V3) see every token; the first
`first_dense` layers keep a dense MLP of width ModelDims.ffn_hidden (DeepSeek-V3's first_k_dense_replace).

Parameters per MoE layer: attention + router h*E + E * 3*h*f_e (routed) + n_shared * 3*h*f_e (shared).
Active parameters per token: attention + router + (top_k + n_shared) * 3*h*f_e. The MFU numerator counts
active parameters only (6 x active matmul parameters + the attention term per token; the PaLM convention
applied to what a token computes): Megatron-Bridge's "Model TFLOP/sec/GPU" and DeepSeek-V3's report count
the same way.

Expert parallelism (ep): Megatron-Core's "MoE parallel folding" (arXiv:2504.14960): the experts of every
MoE layer are split over ep ranks carved out of the tp x cp x dp ranks of the attention part (ep divides
tp*cp*dp; expert tensor parallelism 1, as in the Megatron-Bridge recipes), so each GPU holds E/ep whole
experts and the expert-data-parallel degree is tp*cp*dp/ep. Tokens leave each rank in a dispatch
all-to-all over the ep group and come back in a combine all-to-all (each twice: forward and backward).

Multi-head latent attention (DeepSeek-V2/V3, arXiv:2412.19437 Sec. 2.1.1): queries through a low-rank
q_lora_rank bottleneck, keys and values from one kv_lora_rank latent plus a shared rope key; per head the
query/key dim is qk_nope + qk_rope and the value dim v_head. Weights (d_in, d_out): q_a (h, q_lora),
q_b (q_lora, H*(nope+rope)), kv_a (h, kv_lora+rope), kv_b (kv_lora, H*(nope+v)), o (H*v, h).

Presets (configs named in each source) are planner-local: the kernel library's shapes table stays dense.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

from wavefront.shapes import ModelDims


@dataclass(frozen=True)
class MoE:
    """Expert layout of a MoE model (module docstring)."""

    n_experts: int
    top_k: int
    expert_ffn: int
    n_shared: int = 0
    first_dense: int = 0
    n_group: int = 0  # node-limited routing: experts in n_group groups, a token's top_k within topk_group of them
    topk_group: int = 0  # (DeepSeek-V3: 8 and 4, "each token is sent to at most 4 nodes"); 0: no limit

    def __post_init__(self) -> None:
        if self.n_experts < 1 or not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"MoE needs n_experts >= 1 and 1 <= top_k <= n_experts, got {self.n_experts}, "
                             f"{self.top_k}")
        if self.expert_ffn < 1 or self.n_shared < 0 or self.first_dense < 0:
            raise ValueError("MoE expert_ffn must be >= 1, n_shared and first_dense >= 0")
        if self.n_group < 0 or not 0 <= self.topk_group <= max(self.n_group, 0):
            raise ValueError(f"MoE needs 0 <= topk_group <= n_group, got {self.topk_group}, {self.n_group}")

    def remote_nodes_per_token(self, nodes: int) -> float:
        """Expected other nodes one token's top_k experts sit on, experts spread evenly over `nodes` nodes
        and routed uniformly: R (1 - (1 - 1/R)^top_k) nodes reached of the R it may reach (all nodes, or under
        node-limited routing the topk_group groups' share of them; with groups as wide as nodes or wider, the
        chance a node holds one of the topk_group groups), less its own node's share. What an all-to-all that
        sends a token once per node moves across nodes (DeepEP's normal kernels; DeepSeek-V3, Sec. 3.2.2)."""
        if nodes <= 1:
            return 0.0
        if self.n_group and self.topk_group and nodes <= self.n_group and self.n_group % nodes == 0:
            per_node = self.n_group // nodes
            reached = nodes * (1.0 - _choose(self.n_group - per_node, self.topk_group)
                               / _choose(self.n_group, self.topk_group))
        else:
            r = float(nodes) if not (self.n_group and self.topk_group) else min(
                float(nodes), self.topk_group * nodes / self.n_group)
            reached = r * (1.0 - (1.0 - 1.0 / r) ** self.top_k)
        return reached * (nodes - 1) / nodes

    def experts_params(self, hidden: int, n: int) -> int:
        """Weights of `n` experts, routed or shared alike: each a gated MLP of width expert_ffn (gate and up
        h -> f_e, down f_e -> h: 3 h f_e)."""
        return n * 3 * hidden * self.expert_ffn

    @property
    def shared_ffn(self) -> int:
        """Width of the shared experts taken together, one dense gated MLP (0 without them)."""
        return self.n_shared * self.expert_ffn


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention dimensions (module docstring)."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope: int
    qk_rope: int
    v_head: int

    @property
    def qk_head(self) -> int:
        return self.qk_nope + self.qk_rope

    def linear_shapes(self, hidden: int, n_heads: int) -> list[tuple[int, int]]:
        """(d_in, d_out) of the attention block's weight matmuls, unsplit (q_lora_rank 0: an uncompressed
        query projection, as DeepSeek-V2-Lite; its first entry is then an empty (h, 0) matmul)."""
        q_in = self.q_lora_rank or hidden
        return [(hidden, self.q_lora_rank), (q_in, n_heads * self.qk_head),
                (hidden, self.kv_lora_rank + self.qk_rope), (self.kv_lora_rank, n_heads * (self.qk_nope + self.v_head)),
                (n_heads * self.v_head, hidden)]


@dataclass(frozen=True)
class MoEModel:
    dims: ModelDims
    moe: MoE
    mla: MLA | None = None


#: MoE presets. dims.ffn_hidden is the dense MLP width of the first_dense layers (unused without them).
MOE_MODELS: dict[str, MoEModel] = {
    "mixtral-8x7b": MoEModel(
        ModelDims("mixtral-8x7b", 4096, 14336, 32, 32, 8, 128, 32000, 32768,
                  source="mistralai/Mixtral-8x7B-v0.1 config.json (num_local_experts 8, num_experts_per_tok 2, "
                         "intermediate_size 14336, max_position_embeddings 32768)"),
        MoE(n_experts=8, top_k=2, expert_ffn=14336)),
    "qwen3-30b-a3b": MoEModel(
        ModelDims("qwen3-30b-a3b", 2048, 6144, 48, 32, 4, 128, 151936, 4096,
                  source="Qwen/Qwen3-30B-A3B config.json (num_experts 128, num_experts_per_tok 8, "
                         "moe_intermediate_size 768, head_dim 128); 4,096-token pre-training stage of the Qwen3 "
                         "report (arXiv:2505.09388, Sec. 3.2)"),
        MoE(n_experts=128, top_k=8, expert_ffn=768)),
    "qwen3-235b-a22b": MoEModel(
        ModelDims("qwen3-235b-a22b", 4096, 12288, 94, 64, 4, 128, 151936, 4096,
                  source="Qwen/Qwen3-235B-A22B config.json (num_experts 128, num_experts_per_tok 8, "
                         "moe_intermediate_size 1536, head_dim 128)"),
        MoE(n_experts=128, top_k=8, expert_ffn=1536)),
    "deepseek-v3": MoEModel(
        ModelDims("deepseek-v3", 7168, 18432, 61, 128, 128, 192, 129280, 4096,
                  source="deepseek-ai/DeepSeek-V3 config.json (n_routed_experts 256, num_experts_per_tok 8, "
                         "n_shared_experts 1, moe_intermediate_size 2048, first_k_dense_replace 3, q_lora_rank "
                         "1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128); "
                         "n_group 8, topk_group 4); 4K pre-training sequence (arXiv:2412.19437, Sec. 4.2); the "
                         "MTP module is not modelled"),
        MoE(n_experts=256, top_k=8, expert_ffn=2048, n_shared=1, first_dense=3, n_group=8, topk_group=4),
        MLA(q_lora_rank=1536, kv_lora_rank=512, qk_nope=128, qk_rope=64, v_head=128)),
}


def _choose(n: int, k: int) -> float:
    return float(comb(n, k)) if 0 <= k <= n else 0.0


def get_moe_model(name: str) -> MoEModel | None:
    return MOE_MODELS.get(name)
