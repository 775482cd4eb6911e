"""The vocabulary of the per-family rules: which transformers classes an op replaces, and where the
numbers the kernel needs (epsilon, activation, softcap) live. Pure data; the appliers read it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RMSNormRule:
    """Swap each module of these classes for :class:`wavefront.nn.RMSNorm`, reusing its ``weight``.

    offset=1.0 with cast="gemma" is Gemma's ``x * (1 + w)`` computed in fp32; cast="llama" rounds the
    normalized value to the input dtype before the weight multiply, as Llama's norm does; cast="gemma" with
    offset 0 is OLMo 2's ``(w * xhat).to(dtype)``; cast="input" a norm computed in the input dtype.
    """

    classes: tuple[str, ...]
    eps_attr: str = "variance_epsilon"
    offset: float = 0.0
    cast: str = "llama"


@dataclass(frozen=True)
class GatedMLPRule:
    """Swap each MLP of these classes for one that runs the fused gated activation, reusing its Linear
    children (so the state_dict keys stay ``gate_proj``/``up_proj``/``down_proj`` or ``gate_up_proj``).

    activation_from: config attributes that name the activation, first non-empty wins (Gemma 2 moved it
    from ``hidden_act`` to ``hidden_activation``). fused_gate_up: the gate and up projections are one
    Linear whose output is ``[gate, up]`` along the last dim (Phi-3).
    """

    classes: tuple[str, ...]
    activation_from: tuple[str, ...] = ("hidden_act",)
    fused_gate_up: bool = False
    optional: bool = False  # the family may have no dense MLP at all (MoE models whose every layer is sparse)
    #: config attribute holding the muP pair (gate multiplier, output multiplier): Falcon-H1's
    #: ``mlp_multipliers`` = (gate_multiplier, down_multiplier), fused into the activation kernel.
    multipliers_from: str | None = None


@dataclass(frozen=True)
class RopeRule:
    """Give each attention module of these classes a forward whose call of ``function`` (a global of the
    modeling module) goes to wavefront's RoPE kernel. Only the instance changes class; the modeling module
    and its functions are untouched."""

    attention_classes: tuple[str, ...]
    function: str = "apply_rotary_pos_emb"
    unsupported: str | None = None  # why the family's rotary embedding cannot be served (reported unmatched)


@dataclass(frozen=True)
class CausalLMLossRule:
    """Route the causal-LM loss of these ``*ForCausalLM`` classes through ``linear_cross_entropy`` in
    training, so the [tokens x vocab] logits are never materialized. softcap_from: the config attribute of
    a final-logit softcap (Gemma 2's ``final_logit_softcapping``)."""

    classes: tuple[str, ...]
    head: str = "lm_head"
    softcap_from: str | None = None


@dataclass(frozen=True)
class AttentionRule:
    """Attention modules whose attention function may be served by ``wavefront.ops.attention``.
    unsupported: why the family's attention cannot be (e.g. a logit softcap the kernel lacks)."""

    attention_classes: tuple[str, ...]
    unsupported: str | None = None


@dataclass(frozen=True)
class MoERule:
    """Sparse MoE blocks: each router of ``router_classes`` changes class to one that routes with
    ``wavefront.ops.moe_router`` (same outputs, hooks and ``isinstance`` kept, so transformers still records
    router logits for its aux loss); each experts module of ``experts_classes`` is swapped for
    :class:`wavefront.nn.MoEExperts` holding its ``gate_up_proj``/``down_proj`` Parameters.

    The router's numbers are read from the router module: ``top_k``, ``weight``; normalize_attr names its
    renormalization flag (None: always renormalized); bias_attr DeepSeek-V3's selection bias; scaling_attr
    its routed scaling factor; group_attrs its (n_group, topk_group) for group-limited routing.
    weights_dtype="logits" rounds the weights to the logits' dtype (Qwen3-MoE) instead of keeping fp32.
    """

    router_classes: tuple[str, ...]
    experts_classes: tuple[str, ...]
    score: str = "softmax"
    fp32_logits: bool = False
    normalize_attr: str | None = None
    bias_attr: str | None = None
    scaling_attr: str | None = None
    group_attrs: tuple[str, str] | None = None
    weights_dtype: str = "float32"
    activation_from: tuple[str, ...] = ("hidden_act",)


@dataclass(frozen=True)
class Fp8ProducerRule:
    """In an FP8 patch, the module at ``producer`` (relative to a decoder layer ``...layers.N``) emits the FP8
    copy of its output for the Float8Linear layers at ``consumers`` (same base). kind: "norm" (a wavefront
    RMSNorm/LayerNorm: every scaling of the recipes), "gated" (the patched gated MLP: 1x128 and 1x32 only)
    or "attention" (the wavefront attention function, attention=True: 1x128 and 1x32 only)."""

    producer: str
    consumers: tuple[str, ...]
    kind: str


#: Llama's decoder layer: each linear input is the output of a norm, the gated activation or attention.
LLAMA_FP8_PRODUCERS = (
    Fp8ProducerRule("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "norm"),
    Fp8ProducerRule("self_attn", ("self_attn.o_proj",), "attention"),
    Fp8ProducerRule("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj"), "norm"),
    Fp8ProducerRule("mlp", ("mlp.down_proj",), "gated"),
)


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.model_type values these rules cover
    rms_norm: RMSNormRule | None = None
    mlp: GatedMLPRule | None = None
    rope: RopeRule | None = None
    loss: CausalLMLossRule | None = None
    attention: AttentionRule | None = None
    moe: MoERule | None = None
    has_layer_norm: bool = False  # LayerNorm modules are matched by type (torch.nn.LayerNorm) in any family
    fp8_producers: tuple[Fp8ProducerRule, ...] = ()  # fused FP8 hand-offs of patch(fp8=...)
    #: (op, why) for ops the family has but its rules do not cover (Granite's logit scaling, GLM-4's
    #: interleaved rotary): a request for one is reported unmatched with the reason (strict mode raises), so
    #: such a model is patched with that op turned off, e.g. ``wavefront.patch(model, loss=False)``.
    unsupported: tuple[tuple[str, str], ...] = ()
    #: norm classes the family has whose semantics are not an RMSNorm/LayerNorm the kernels compute (Llama 4's
    #: weightless L2 norm of q and k): known, left running their own code, not reported as unknown norms.
    left_alone: tuple[str, ...] = ()

    def why_unsupported(self, op: str) -> str | None:
        return dict(self.unsupported).get(op)
