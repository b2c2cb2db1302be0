"""Huginn-0125 (`huginn_raven`, RavenForCausalLM) folders -> `.tinyloop`.

From seal-rg/recurrent-pretraining raven_modeling_minimal.py (docs/convert.md, "How each architecture maps"):

    e = wte(ids) * sqrt(n_embd); prelude (SandwichBlocks); s0 = like-init random state
    repeat: s = adapter(concat(s, e)); core_block layers      # inject = linear_concat
    s = ln_f(s); coda; ln_f; lm_head                          # post_loop_norm = final
    SandwichBlock: x = norm_2(x + attn(norm_1 x)); x = norm_4(x + mlp(norm_3 x))
    attn: fused Wqkv (rows q|k|v), qk_bias [2, 1, H, hd] added to q and k before RoPE on
          adjacent pairs (rope_interleaved), proj
    mlp:  fc [2F, D] = gate rows then up rows; proj(silu(gate x) * up x)

Names: transformer.{prelude,core_block,coda}.{i}.{norm_1..4, attn.Wqkv, attn.qk_bias,
attn.proj, mlp.fc, mlp.proj}.weight, transformer.{wte,adapter,ln_f}.weight, lm_head.weight
(a duplicate of wte when tied), freqs_cis (a RoPE table the engine recomputes).

qk_bias becomes the fused wqkv bias with a zero v part. The random initial state keeps
Huginn's distribution (truncated normal, std init_values.std * sqrt(n_embd), cut at 3
std) but draws from the engine's counter-based generator (docs/model-format.md), not from
torch's RNG, so it is not the same sample. As the reference draws a fresh state per forward,
the file says init_state_per_call: generate draws it from the call's seed (fresh entropy
without one), and init_scale (0 = the zero state) is a call argument as in the reference.
`state_init: zero` maps to init_state zeros exactly.
"""
from __future__ import annotations

import math

import numpy as np

from .common import Job, Plan
from .config_keys import check_config_keys
from .hf_folder import HFFolder, config_float, config_int
from .hf_llama import copy_job, finish_plan

__all__ = ["plan_huginn"]

# Huginn config fields whose only supported value is the released model's.
_FIXED = {
    "injection_type": "linear",
    "block_class_name": "SandwichBlock",
    "mlp_class_name": "GatedMLP",
    "nonlin_name": "SiLU",
    "norm_class_name": "RMSNorm_llama",
    "bias": False,
}


# Keys plan_huginn reads, or refuses by value (docs/convert.md).
HUGINN_UNDERSTOOD = frozenset(_FIXED) | {
    "n_embd", "hidden_size", "num_attention_heads", "n_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "padded_vocab_size", "vocab_size", "n_layers_in_prelude",
    "n_layers_in_recurrent_block", "n_layers_in_coda", "tie_embeddings", "tie_word_embeddings",
    "qk_bias", "rope_base", "rope_settings", "mean_recurrence", "block_size", "norm_eps",
    "state_init", "init_values", "test_time_noise"}
# Training-time settings (the iteration sampler, truncated backprop, init schemes,
# checkpointing) and derived counts: the inference forward never reads them.
# test_time_noise_type only matters with test_time_noise > 0, which is refused.
HUGINN_IGNORABLE = frozenset({
    "n_layers", "padding_multiple", "init_strategy", "init_orthogonal", "sampling_scheme",
    "mean_backprop_depth", "activation_checkpoint_impl", "effective_expected_depth",
    "architecture_class_name", "test_time_noise_type", "attn_impl"})


def _refuse(c: dict, src: str) -> None:
    check_config_keys(c, src, "Huginn", HUGINN_UNDERSTOOD, HUGINN_IGNORABLE)
    for key, want in _FIXED.items():
        if key in c and c[key] != want:
            raise ValueError(f"{src}: config field '{key}' = {c[key]!r} is not supported "
                             f"(only {want!r})")
    if c.get("test_time_noise", 0) not in (0, 0.0, None):
        raise ValueError(f"{src}: config field 'test_time_noise' = {c['test_time_noise']!r} "
                         f"is not supported (only 0)")
    rope = c.get("rope_settings") or {}
    if rope.get("rope_condense_ratio", 1) != 1:
        raise ValueError(f"{src}: config field 'rope_settings.rope_condense_ratio' is not "
                         f"supported (only 1)")
    if rope.get("use_rope", True) is not True:
        raise ValueError(f"{src}: config field 'rope_settings.use_rope' = {rope['use_rope']!r} "
                         f"is not supported (only true)")
    unknown = sorted(set(rope) - {"rope_condense_ratio", "use_rope", "rope_base"})
    if unknown:
        raise ValueError(f"{src}: config key 'rope_settings.{unknown[0]}' is not understood by "
                         f"the Huginn converter and could change the model's outputs")


def init_state_fields(c: dict, src: str, like_init_std, per_call: bool) -> dict:
    """The family's initial-state fields for the recurrent-pretraining config's `state_init`
    (Huginn's, and Parcae's, which keeps it): "zero" -> the zero state; "like-init" -> a
    truncated normal of std like_init_std() (called only then), drawn afresh every forward
    when per_call. Any other value is refused by name."""
    kind = c.get("state_init", "like-init")
    if kind == "zero":
        return dict(init_state="zeros")
    if kind != "like-init":
        raise ValueError(f"{src}: config field 'state_init' = {kind!r} is not supported "
                         f"(like-init or zero)")
    fields = dict(init_state="random", init_state_std=like_init_std(), init_state_seed=0)
    if per_call:
        fields["init_state_per_call"] = True
    return fields


def _init_state(c: dict, src: str, D: int, embed_scale: float) -> dict:
    def std() -> float:
        # initialize_state: trunc_normal(std * init_scale) * emb_scale, redrawn every forward
        iv = c.get("init_values") or {}
        return float(iv.get("std", math.sqrt(2.0 / (5.0 * D)))) * embed_scale

    return init_state_fields(c, src, std, per_call=True)


def _qk_bias_job(hf: str, tl: str, H: int, hd: int) -> Job:
    """qk_bias [2, 1, H, hd] -> wqkv.bias [(3H) hd]: q part, k part, zero v part."""
    def build(d, name=hf + "attn.qk_bias"):
        b = np.asarray(d[name], dtype=np.float32).reshape(2, H * hd)  # [2, H hd]
        return {tl + "attn.wqkv.bias": np.concatenate([b[0], b[1], np.zeros(H * hd, np.float32)])}
    return Job({hf + "attn.qk_bias": (2, 1, H, hd)}, build, label=tl + "attn.wqkv.bias")


def _fc_job(hf: str, tl: str, D: int, F: int) -> Job:
    """fc [2F, D] (gate rows, then up rows) -> w_gate [F, D], w_up [F, D]."""
    def build(d, name=hf + "mlp.fc.weight"):
        fc = d[name]  # [2F, D]
        return {tl + "mlp.w_gate.weight": fc[:F], tl + "mlp.w_up.weight": fc[F:]}
    return Job({hf + "mlp.fc.weight": (2 * F, D)}, build, label=tl + "mlp.fc")


def _block_jobs(hf: str, tl: str, D: int, H: int, hd: int, F: int, qk_bias: bool) -> list[Job]:
    jobs = [copy_job(hf + "norm_1.weight", (D,), tl + "attn_norm.weight"),
            copy_job(hf + "norm_2.weight", (D,), tl + "attn_post_norm.weight"),
            copy_job(hf + "norm_3.weight", (D,), tl + "mlp_norm.weight"),
            copy_job(hf + "norm_4.weight", (D,), tl + "mlp_post_norm.weight"),
            copy_job(hf + "attn.Wqkv.weight", (3 * H * hd, D), tl + "attn.wqkv.weight")]
    if qk_bias:
        jobs.append(_qk_bias_job(hf, tl, H, hd))
    jobs += [copy_job(hf + "attn.proj.weight", (D, H * hd), tl + "attn.wo.weight"),
             _fc_job(hf, tl, D, F),
             copy_job(hf + "mlp.proj.weight", (D, F), tl + "mlp.w_down.weight")]
    return jobs


def plan_huginn(folder: HFFolder) -> Plan:
    c, src = folder.config, folder.path
    _refuse(c, src)
    D = config_int(c, src, "n_embd", "hidden_size")
    H = config_int(c, src, "num_attention_heads", "n_heads")
    KVH = config_int(c, src, "num_key_value_heads", default=H)
    if KVH != H:
        # qk_bias [2, 1, H, hd] is added to k [.., KVH, hd]: only defined for KVH == H.
        raise ValueError(f"{src}: config field 'num_key_value_heads' = {KVH}: Huginn "
                         f"grouped-query attention is not supported (must equal {H})")
    if D % H:
        raise ValueError(f"{src}: n_embd {D} is not a multiple of num_attention_heads {H}")
    hd = D // H  # the modeling code splits q as n_embd and views heads of n_embd / H
    if c.get("head_dim") not in (None, hd):
        raise ValueError(f"{src}: config field 'head_dim' = {c['head_dim']} differs from "
                         f"n_embd / num_attention_heads = {hd}")
    F = config_int(c, src, "intermediate_size")
    V = config_int(c, src, "padded_vocab_size", "vocab_size")
    n_pre = config_int(c, src, "n_layers_in_prelude")
    n_loop = config_int(c, src, "n_layers_in_recurrent_block")
    n_post = config_int(c, src, "n_layers_in_coda")
    tied = bool(c.get("tie_embeddings", c.get("tie_word_embeddings", True)))
    qk_bias = bool(c.get("qk_bias", False))
    embed_scale = math.sqrt(D)  # _init_func: embed_scale = sqrt(n_embd)
    # init_values.embed_scale: whether the modeling code reads a stored value or recomputes
    # sqrt(n_embd) could not be established, so only the value both readings agree on passes.
    stored = (c.get("init_values") or {}).get("embed_scale")
    if stored is not None and not math.isclose(float(stored), embed_scale, rel_tol=1e-6):
        raise ValueError(f"{src}: config field 'init_values.embed_scale' = {stored!r} differs "
                         f"from sqrt(n_embd) = {embed_scale:.6g}: not supported")
    theta = c.get("rope_base", (c.get("rope_settings") or {}).get("rope_base", 50000.0))
    config = dict(
        dim=D, vocab_size=V, n_heads=H, n_kv_heads=H, head_dim=hd, ffn_dim=F,
        n_pre_blocks=n_pre, n_loop_layers=n_loop, n_post_blocks=n_post,
        default_loops=config_int(c, src, "mean_recurrence", default=32),
        max_seq_len=config_int(c, src, "block_size", default=4096),
        norm_type="rmsnorm", norm_eps=config_float(c, src, "norm_eps", 1e-6),
        norm_placement="huginn_sandwich", qkv_fused=True, attn_qkv_bias=qk_bias,
        pos_encoding="rope_interleaved", rope_theta=float(theta), mlp="swiglu",
        embed_scale=embed_scale, inject="linear_concat", post_loop_norm="final",
        final_norm=True, tie_embeddings=tied, bos_id=folder.bos_id(),
        eos_ids=folder.eos_ids(), **_init_state(c, src, D, embed_scale))
    jobs = [copy_job("transformer.wte.weight", (V, D), "embed.weight"),
            copy_job("transformer.adapter.weight", (D, 2 * D), "inject.weight")]
    for group, n, ours in (("prelude", n_pre, "pre"), ("core_block", n_loop, "loop"),
                           ("coda", n_post, "post")):
        for i in range(n):
            jobs += _block_jobs(f"transformer.{group}.{i}.", f"{ours}.{i}.", D, H, hd, F, qk_bias)
    jobs.append(copy_job("transformer.ln_f.weight", (D,), "final_norm.weight"))
    # freqs_cis: a RoPE table the model registers as a persistent buffer. A tied released
    # checkpoint stores the head's copy too (skipped).
    return finish_plan(folder, config, jobs, tied, V, D, rope_tables={"freqs_cis"})
