"""Nanbeige4.2 (`nanbeige`, NanbeigeForCausalLM) folders -> `.tinyloop`.

From the authors' modeling_nanbeige.py / configuration_nanbeige.py (sources in
docs/convert.md, "Nanbeige4.2"): a Llama-style stack of `num_hidden_layers` pre-norm layers
(GQA, explicit head_dim, rotate_half RoPE, SwiGLU) run `num_loops` times with shared
weights; each (loop, layer) has its own KV. NanbeigeModel.forward:

    h = embed(ids)
    repeat num_loops: h = layers(h); if not skip_loop_final_norm: h = norm(h)
    if skip_loop_final_norm: h = norm(h)                      # once, after the last loop
    logits = lm_head(h)

So the norm is applied exactly once after every loop, the last included, and its output
feeds the next loop; there is no second norm before the head. That is the family's
`loop_norm` (model.norm -> loop_norm, final_norm off), as for Ouro. With
skip_loop_final_norm the loops run bare and model.norm is the final norm. Both are exact:
no family extension.

`loop_loss_weights`, when non-empty, makes the HF model run len(loop_loss_weights) + 1
loops instead of num_loops (NanbeigeModel._get_num_loops): honoured as default_loops.

Names: model.embed_tokens.weight, model.layers.{i}.{input_layernorm,
post_attention_layernorm}.weight, model.layers.{i}.self_attn.{q,k,v,o}_proj.weight (+ .bias
with attention_bias), model.layers.{i}.mlp.{gate,up,down}_proj.weight (+ .bias with
mlp_bias), model.norm.weight, lm_head.weight (absent or a duplicate when tied).

The authors' config class carries many research options (n-gram embeddings, hyper
connections, LoopSplit, depth attention, q/k layernorm). The released model has them all
off; each is refused by name when on, and its sub-options (which do nothing while it is
off) are listed as understood.
"""
from __future__ import annotations

from .common import Plan
from .config_keys import check_config_keys
from .hf_folder import HFFolder, config_float, config_int
from .hf_llama import (finish_plan, attention_jobs, check_act, check_rope_scaling, copy_job, llama_dims,
                       mlp_jobs, rope_theta)

__all__ = ["plan_nanbeige", "NANBEIGE_UNDERSTOOD", "NANBEIGE_IGNORABLE"]

# Keys this converter reads and honours.
_HONOURED = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "kv_channels", "hidden_act",
    "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
    "tie_word_embeddings", "attention_bias", "mlp_bias", "num_loops", "loop_loss_weights",
    "skip_loop_final_norm",
}

# Research features of NanbeigeConfig and the value that turns each off (the released
# model's); any other value is refused by name.
_FEATURES_OFF = {
    "qk_layernorm": False,
    "enable_double_loop_split": False,
    "enable_hyper_connection": False,
    "enable_mhc": False,
    "enable_h_res_identity": False,
    "mhc_identity_nohresparam": False,
    "enable_depth_attention": False,
    "ngram_insert_all_layers": False,
    "loop_share_kv": False,
    "mhc_diff_for_loop": False,
}

# N-gram embeddings are on only when all three are set (NanbeigeModel.__init__).
_NGRAM_SWITCHES = ("emb_neighbor_num", "emb_split_num", "ngram_vocab_size_ratio")

# Sub-options that the modeling code reads only while their feature is on (refused above),
# so with the feature off they cannot change the outputs.
_INERT_WHEN_OFF = {
    "ngram_mod_force_prime", "ngram_embedding_hidden_size", "ngram_fused_mode",
    "emb_tp_num", "ngram_compressed_tokenizer", "skip_ngram_for_input",
    "ngram_layer_downproject_size", "loop_middle_layers", "loop_middle_repeats",
    "mhc_double_stream_position_for_loop", "num_residual_streams", "mhc_sinkhorn_iterations",
    "mhc_init_gating_factor", "depth_attention_stride", "depth_attention_recent_window",
    "depth_attention_static_anchor_once",
}

NANBEIGE_UNDERSTOOD = frozenset(_HONOURED | set(_FEATURES_OFF) | set(_NGRAM_SWITCHES) |
                                {"insert_ngram_layer_idx"} | _INERT_WHEN_OFF)
NANBEIGE_IGNORABLE = frozenset()  # everything else ignorable is in HF_IGNORABLE


def _refuse_features(c: dict, src: str) -> None:
    for key, off in _FEATURES_OFF.items():
        if c.get(key, off) not in (off, None):
            raise ValueError(f"{src}: config field '{key}' = {c[key]!r}: this Nanbeige option "
                             f"is not supported (only {off!r}, as in the released model)")
    if all(c.get(k) is not None for k in _NGRAM_SWITCHES):
        raise ValueError(f"{src}: config fields {', '.join(_NGRAM_SWITCHES)} turn on n-gram "
                         f"embeddings ('emb_neighbor_num' = {c['emb_neighbor_num']!r}), which "
                         f"are not supported")
    if c.get("insert_ngram_layer_idx"):
        raise ValueError(f"{src}: config field 'insert_ngram_layer_idx' = "
                         f"{c['insert_ngram_layer_idx']!r}: n-gram layer fusion is not supported")


def _default_loops(c: dict, src: str) -> int:
    weights = c.get("loop_loss_weights")
    if weights is not None and not isinstance(weights, list):
        raise ValueError(f"{src}: config field 'loop_loss_weights': expected a list, got "
                         f"{weights!r}")
    if weights:
        return len(weights) + 1  # NanbeigeModel._get_num_loops overrides num_loops then
    loops = config_int(c, src, "num_loops", default=1)
    if loops < 1:
        raise ValueError(f"{src}: config field 'num_loops' must be >= 1, got {loops}")
    return loops


def _skip_loop_final_norm(c: dict, src: str) -> bool:
    v = c.get("skip_loop_final_norm", False)
    if not isinstance(v, bool):
        raise ValueError(f"{src}: config field 'skip_loop_final_norm': expected true or false, "
                         f"got {v!r}")
    return v


def plan_nanbeige(folder: HFFolder) -> Plan:
    c, src = folder.config, folder.path
    check_config_keys(c, src, "Nanbeige", understood=NANBEIGE_UNDERSTOOD,
                      ignorable=NANBEIGE_IGNORABLE)
    _refuse_features(c, src)
    check_rope_scaling(c, src)
    check_act(c, src)
    D, H, KVH, hd, F, N, V = llama_dims(c, src)
    if c.get("kv_channels") not in (None, hd):
        # Megatron's name for the head size; the HF code reads head_dim. A checkpoint where
        # they disagree has an unclear provenance: refuse rather than pick one.
        raise ValueError(f"{src}: config field 'kv_channels' = {c['kv_channels']!r} differs "
                         f"from head_dim {hd}")
    skip = _skip_loop_final_norm(c, src)
    attn_bias = bool(c.get("attention_bias", False))
    mlp_bias = bool(c.get("mlp_bias", False))
    tied = bool(c.get("tie_word_embeddings", False))
    config = dict(
        dim=D, vocab_size=V, n_heads=H, n_kv_heads=KVH, head_dim=hd, ffn_dim=F,
        n_pre_blocks=0, n_loop_layers=N, n_post_blocks=0, default_loops=_default_loops(c, src),
        max_seq_len=config_int(c, src, "max_position_embeddings", default=2048),
        norm_type="rmsnorm", norm_eps=config_float(c, src, "rms_norm_eps", 1e-6),
        norm_placement="pre", attn_qkv_bias=attn_bias, attn_out_bias=attn_bias,
        mlp_bias=mlp_bias, pos_encoding="rope_half", rope_theta=rope_theta(c, src),
        mlp="swiglu", loop_norm=not skip, final_norm=skip, tie_embeddings=tied,
        bos_id=folder.bos_id(), eos_ids=folder.eos_ids())
    jobs = [copy_job("model.embed_tokens.weight", (V, D), "embed.weight")]
    for i in range(N):
        hf, tl = f"model.layers.{i}.", f"loop.{i}."
        jobs.append(copy_job(hf + "input_layernorm.weight", (D,), tl + "attn_norm.weight"))
        jobs += attention_jobs(hf + "self_attn.", tl, D, H, KVH, hd, attn_bias, attn_bias)
        jobs.append(copy_job(hf + "post_attention_layernorm.weight", (D,), tl + "mlp_norm.weight"))
        jobs += mlp_jobs(hf + "mlp.", tl, D, F, mlp_bias)
    # One norm, two roles: after every loop (loop_norm), or once before the head.
    jobs.append(copy_job("model.norm.weight", (D,), "final_norm.weight" if skip else "loop_norm.weight"))
    return finish_plan(folder, config, jobs, tied, V, D)
