"""Ouro (`ouro`, OuroForCausalLM) folders -> `.tinyloop`.

From modeling_ouro.py (docs/convert.md, "How each architecture maps"): the whole layer stack is the loop,
run total_ut_steps times, with no re-injection, and the final norm applied after EVERY
iteration (its output feeds the next one):

    h = embed(ids)
    repeat L: h = layers(h); h = norm(h)        # loop_norm = true, final_norm = false
    logits = lm_head(h)
    layer: h = h + input_layernorm_2(attn(input_layernorm h))
           h = h + post_attention_layernorm_2(mlp(post_attention_layernorm h))
    attn: q/k/v/o projections, HF rotate_half RoPE (rope_half); mlp: SwiGLU
    early_exit_gate: Linear(D -> 1, bias) on each iteration's h  -> exit_gate

The gate's rule (OuroForCausalLM.forward; docs/convert.md "Ouro" has the sources):
config.json's `early_exit_step` (0-based, used when 0 <= step < total_ut_steps) wins over
`early_exit_threshold` (OuroConfig's default 1.0 when the key is absent; null = the last
step). They become the file's exit_gate_mode / exit_gate_threshold / exit_gate_step, which
generate and score honour by default, as the reference does.

Names: model.embed_tokens.weight, model.layers.{i}.self_attn.{q,k,v,o}_proj.weight,
model.layers.{i}.mlp.{gate,up,down}_proj.weight, model.layers.{i}.{input_layernorm,
input_layernorm_2, post_attention_layernorm, post_attention_layernorm_2}.weight,
model.norm.weight, model.early_exit_gate.{weight,bias}, lm_head.weight.
"""
from __future__ import annotations

from .common import Plan
from .config_keys import check_config_keys
from .hf_folder import HFFolder, config_float, config_int
from .hf_llama import (finish_plan, attention_jobs, check_act, check_rope_scaling, copy_job, llama_dims, mlp_jobs,
                       rope_theta)

__all__ = ["plan_ouro", "OURO_UNDERSTOOD", "OURO_IGNORABLE"]

# Keys plan_ouro reads, or refuses by value (docs/convert.md, "Ouro"). `sliding_window` and
# `max_window_layers` only act through `use_sliding_window` / `layer_types`, refused when
# they ask for sliding windows.
OURO_UNDERSTOOD = frozenset({
    "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
    "num_hidden_layers", "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta",
    "rope_scaling", "rope_parameters", "hidden_act", "attention_bias", "tie_word_embeddings",
    "use_sliding_window", "sliding_window", "max_window_layers", "layer_types", "total_ut_steps",
    "early_exit_threshold", "early_exit_step"})
# `chunk_size`: OuroForCausalLM stores it and never uses it in the forward.
OURO_IGNORABLE = frozenset({"chunk_size"})

# OuroConfig.__init__'s default when config.json has no early_exit_threshold.
_REFERENCE_THRESHOLD = 1.0


def _gate_rule(c: dict, src: str, loops: int) -> dict:
    """The exit gate's default rule, as OuroForCausalLM.forward picks it from the config:
    `exit_at_step` (config early_exit_step) first when 0 <= step < total_ut_steps, else
    `exit_threshold` (config early_exit_threshold) when not None, else the last step."""
    step = c.get("early_exit_step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise ValueError(f"{src}: config field 'early_exit_step' = {step!r}: expected an integer or null")
    q = c.get("early_exit_threshold", _REFERENCE_THRESHOLD)
    if q is not None and (isinstance(q, bool) or not isinstance(q, (int, float)) or q != q):
        raise ValueError(f"{src}: config field 'early_exit_threshold' = {q!r}: expected a number or null")
    if step is not None and 0 <= step < loops:
        # 0-based index into the reference's per-step list -> iterations run (1-based).
        return dict(exit_gate_mode="step", exit_gate_step=step + 1)
    if q is None or q > 1:
        # No threshold, or one the CDF (at most 1) never reaches: the last step's logits.
        return dict(exit_gate_mode="off")
    # A threshold <= 0 is reached at the first step, exactly as 0 is.
    return dict(exit_gate_mode="threshold", exit_gate_threshold=float(max(q, 0.0)))


def _refuse(c: dict, src: str) -> None:
    check_rope_scaling(c, src)
    check_act(c, src)
    if c.get("use_sliding_window"):
        raise ValueError(f"{src}: config field 'use_sliding_window' = true: sliding-window "
                         f"attention is not supported")
    kinds = set(c.get("layer_types") or [])
    if kinds - {"full_attention"}:
        raise ValueError(f"{src}: config field 'layer_types' has {sorted(kinds - {'full_attention'})}: "
                         f"only full_attention is supported")


def plan_ouro(folder: HFFolder) -> Plan:
    c, src = folder.config, folder.path
    check_config_keys(c, src, "Ouro", understood=OURO_UNDERSTOOD, ignorable=OURO_IGNORABLE)
    _refuse(c, src)
    D, H, KVH, hd, F, N, V = llama_dims(c, src)
    tied = bool(c.get("tie_word_embeddings", False))
    # Bias flags as in Qwen2-style configs; Ouro's released models have none.
    qkv_bias = all(f"model.layers.0.self_attn.{p}_proj.bias" in folder.shapes for p in "qkv") \
        if c.get("attention_bias") is None else bool(c["attention_bias"])
    loops = config_int(c, src, "total_ut_steps", default=4)
    config = dict(
        dim=D, vocab_size=V, n_heads=H, n_kv_heads=KVH, head_dim=hd, ffn_dim=F,
        n_pre_blocks=0, n_loop_layers=N, n_post_blocks=0,
        default_loops=loops,
        max_seq_len=config_int(c, src, "max_position_embeddings", default=2048),
        norm_type="rmsnorm", norm_eps=config_float(c, src, "rms_norm_eps", 1e-6),
        norm_placement="ouro_sandwich", attn_qkv_bias=qkv_bias, pos_encoding="rope_half",
        rope_theta=rope_theta(c, src), mlp="swiglu", loop_norm=True, final_norm=False,
        exit_gate=True, tie_embeddings=tied, bos_id=folder.bos_id(), eos_ids=folder.eos_ids(),
        **_gate_rule(c, src, loops))
    jobs = [copy_job("model.embed_tokens.weight", (V, D), "embed.weight")]
    for i in range(N):
        hf, tl = f"model.layers.{i}.", f"loop.{i}."
        jobs += [copy_job(hf + "input_layernorm.weight", (D,), tl + "attn_norm.weight"),
                 copy_job(hf + "input_layernorm_2.weight", (D,), tl + "attn_post_norm.weight"),
                 copy_job(hf + "post_attention_layernorm.weight", (D,), tl + "mlp_norm.weight"),
                 copy_job(hf + "post_attention_layernorm_2.weight", (D,),
                          tl + "mlp_post_norm.weight")]
        jobs += attention_jobs(hf + "self_attn.", tl, D, H, KVH, hd, qkv_bias, False)
        jobs += mlp_jobs(hf + "mlp.", tl, D, F, False)
    jobs += [copy_job("model.norm.weight", (D,), "loop_norm.weight"),
             copy_job("model.early_exit_gate.weight", (1, D), "exit_gate.weight"),
             copy_job("model.early_exit_gate.bias", (1,), "exit_gate.bias")]
    return finish_plan(folder, config, jobs, tied, V, D)
