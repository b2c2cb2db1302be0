"""Parcae (SandyResearch, parcae_lm) checkpoint folders -> `.tinyloop`.

From the authors' parcae_lm code (sources and what could not be established:
docs/convert.md, "Parcae"):

    e = prelude(wte(ids)); e = ln_prelude(e)              # prelude_norm
    x = s0 (like-init: truncated normal; zero: zeros)
    repeat num_steps (mean_recurrence by default):
        x = exp(-dt A) * x + dt * (e @ B^T)                # DiagonalInjection, per channel
        x = core_block(x)
    x = C(x); x = coda(x); logits = lm_head(ln_f(x))      # C: a [D, D] linear
    block: x = x + attn(norm_1 x); x = x + mlp(norm_2 x)   # TransformerPreNormBlock
    attn:  c_q / c_k / c_v; a layer with both value_embeds.{n} and attn.ve_gate adds
           2 sigmoid(ve_gate h[:32]) * value_embeds.{n}[ids] to v (n counts prelude, core and
           coda layers in order); RoPE on adjacent pairs, then (qk_norm) q and k over their
           RMS with no weight, causal softmax, c_proj
    mlp:   proj(0.5 * relu(fc x)^2)                        # BaseMLP with ReLU2
    dt = softplus(dt_bias), A = exp(A_log)

Onto the family: prelude -> pre, core_block -> loop, coda -> post; the diagonal injection
is the linear map concat(x, e) -> [diag(exp(-dt A)) | diag(dt) B], so it becomes
`inject: linear_concat` with that matrix (computed here in float64, stored float32);
ln_prelude -> `prelude_norm`, C -> `post_loop_proj`, ReLU2's 0.5 is folded into w_down
(exact: a power of two) and the MLP is `relu2`; `qk_norm` as is; value embeddings ->
`value_embed_layers` with `attn.value_embed` / `attn.value_gate`; ln_f -> final_norm.
Family extensions made for Parcae: relu2, qk_norm, prelude_norm, post_loop_proj,
value_embed_layers.

Refused: GQA (the core block's config forces n_kv_heads = n_heads there), a recurrent
width, MLP width or head count that differs from the prelude's, and every option value the
released configs do not use (docs/convert.md lists them).

The authors' save_pretrained writes config.json as their config dataclass (no
`architectures`; `model_class_name: "Parcae"`) and the weights as pytorch_model.bin, which
is not read (pickles): save the state dict as model.safetensors.
"""
from __future__ import annotations

import math

import numpy as np

from .common import BF16Array, Job, Plan, as_bf16_values
from .config_keys import check_config_keys
from .hf_folder import HFFolder, config_float, config_int
from .hf_huginn import init_state_fields
from .hf_llama import copy_job, finish_plan

__all__ = ["plan_parcae", "PARCAE_UNDERSTOOD", "PARCAE_IGNORABLE"]

# Options whose only supported value is the one the released configs use.
_FIXED = {
    "model_class_name": "Parcae",
    "block_class_name": "TransformerPreNormBlock",
    "norm_class_name": "RMSNorm",
    "mlp_class_name": "BaseMLP",
    "nonlin_name": "ReLU2",
    "bias": False,
    "qk_bias": False,
    "clip_qkv": None,
    "logit_softcap": None,
    "causal": True,
    "use_abacus": False,
    "mup_model_scaling_factor": 1,
    # Sets the embedding scale, the logit scale and the like-init std (parcae_lm
    # utils/init.py get_factor_table): 1, 1 and sqrt(2 / (5 n_embd)) for scaled-zero.
    "init_strategy": "scaled-zero",
}
_ALLOWED = {
    "attn_impl": ("flash", "sdpa"),  # the same attention; "debug-skip" would skip it
    "use_fused_head": ("pytorch", "cce"),  # lm_head a plain [V, D] Linear at inference
}

# Read and honoured (with the checks in this file).
_HONOURED = {
    "n_embd", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
    "padded_vocab_size", "padding_multiple", "block_size", "rope_settings", "norm_eps",
    "tie_embeddings", "qk_norm", "prelude_norm", "injection_type", "state_init",
    "n_layers_in_prelude", "n_layers_in_recurrent_block", "n_layers_in_coda",
    "mean_recurrence", "recurrent_embedding_dimension",
    "recurrent_intermediation_embedding_dimension", "recurrent_num_attention_heads",
}

PARCAE_UNDERSTOOD = frozenset(_HONOURED | set(_FIXED) | set(_ALLOWED))

# Cannot change the function the weights compute at inference: names, initialisation,
# training-time depth sampling and checkpointing, monitoring-only attention statistics,
# device strategy and the naive-op switch (the same functions).
PARCAE_IGNORABLE = frozenset({
    "name", "hf_config", "_is_recurrent_block_config", "init_orthogonal",
    "skip_initialization", "sampling_scheme", "mean_backprop_depth", "lockstep_n",
    "lockstep_k", "curriculum_target", "recurrent_iteration_method",
    "activation_checkpoint_impl", "debias_attention", "center_attention", "strategy",
    "simple_ops", "randomize_positions_from",
})


def _refuse_options(c: dict, src: str) -> None:
    for key, want in _FIXED.items():
        if key in c and c[key] != want:
            raise ValueError(f"{src}: config field '{key}' = {c[key]!r} is not supported "
                             f"(only {want!r}, as in the released Parcae configs)")
    for key, allowed in _ALLOWED.items():
        if key in c and c[key] not in allowed:
            raise ValueError(f"{src}: config field '{key}' = {c[key]!r} is not supported "
                             f"(one of {list(allowed)})")
    rope = c.get("rope_settings") or {}
    if not isinstance(rope, dict):
        raise ValueError(f"{src}: config field 'rope_settings': expected an object, got {rope!r}")
    if rope.get("use_rope", True) is not True or rope.get("rope_condense_ratio", 1) != 1:
        raise ValueError(f"{src}: config field 'rope_settings' = {rope!r}: only use_rope true "
                         f"with rope_condense_ratio 1 is supported")


def _dims(c: dict, src: str) -> tuple[int, int, int, int]:
    """(D, H, F, V): the recurrent block must have the prelude's width, MLP and heads."""
    D = config_int(c, src, "n_embd")
    H = config_int(c, src, "num_attention_heads")
    F = config_int(c, src, "intermediate_size")
    for key, want in (("recurrent_embedding_dimension", D),
                      ("recurrent_intermediation_embedding_dimension", F),
                      ("recurrent_num_attention_heads", H), ("num_key_value_heads", H)):
        if c.get(key) not in (None, want):
            why = ("the core block's config sets n_kv_heads = its head count, so grouped-query "
                   "attention would differ between the core and the prelude / coda"
                   if key == "num_key_value_heads" else "the family has one width per model")
            raise ValueError(f"{src}: config field '{key}' = {c[key]!r} differs from {want}: "
                             f"not supported ({why})")
    if D % H:
        raise ValueError(f"{src}: n_embd {D} is not a multiple of num_attention_heads {H}")
    V = c.get("padded_vocab_size")
    if V is None:  # Config.__post_init__: vocab_size rounded up to padding_multiple
        v, m = config_int(c, src, "vocab_size"), config_int(c, src, "padding_multiple", default=512)
        V = v if v % m == 0 else v + m - v % m
    elif isinstance(V, bool) or not isinstance(V, int):
        raise ValueError(f"{src}: config field 'padded_vocab_size': expected an integer, got {V!r}")
    return D, H, F, V


def _init_state(c: dict, src: str, D: int) -> dict:
    # initialize_state: trunc_normal(std = init.get_std("embedding")) * emb_scale, cut at
    # 3 std; for scaled-zero the std is sqrt(2 / (5 n_embd)) and emb_scale is 1. Drawn once.
    return init_state_fields(c, src, lambda: math.sqrt(2.0 / (5.0 * D)), per_call=False)


def _diagonal_inject_job(D: int) -> Job:
    """A_log [D], dt_bias [D], B [D, D] -> inject.weight [D, 2D] = [diag(decay) | diag(dt) B],
    so that inject(concat(x, e)) = decay * x + dt * (e B^T), the DiagonalInjection."""
    names = ("transformer.adapter.A_log", "transformer.adapter.dt_bias", "transformer.adapter.B")

    def build(d):
        a_log, dt_bias, B = (np.asarray(d[n], np.float64) for n in names)  # [D], [D], [D, D]
        dt = np.logaddexp(0.0, dt_bias)  # softplus, without overflow
        decay = np.exp(-dt * np.exp(a_log))  # [D]
        w = np.concatenate([np.diag(decay), dt[:, None] * B], axis=1)  # [D, 2D]
        return {"inject.weight": w.astype(np.float32)}
    return Job(dict(zip(names, ((D,), (D,), (D, D)), strict=True)), build, label="inject.weight")


def _half_down_job(hf: str, tl: str, D: int, F: int) -> Job:
    """mlp.proj [D, F] * 0.5 -> w_down: ReLU2's 0.5 moved into the next linear. Halving is
    exact in float32 for every weight above 2^-125; BF16 storage stays BF16."""
    def build(d, name=hf + "mlp.proj.weight"):
        w = np.asarray(d[name], np.float32) * np.float32(0.5)
        return {tl + "mlp.w_down.weight": as_bf16_values(w) if isinstance(d[name], BF16Array) else w}
    return Job({hf + "mlp.proj.weight": (D, F)}, build, label=tl + "mlp.w_down.weight")


def _block_jobs(hf: str, tl: str, D: int, F: int) -> list[Job]:
    return [copy_job(hf + "norm_1.weight", (D,), tl + "attn_norm.weight"),
            copy_job(hf + "attn.c_q.weight", (D, D), tl + "attn.wq.weight"),
            copy_job(hf + "attn.c_k.weight", (D, D), tl + "attn.wk.weight"),
            copy_job(hf + "attn.c_v.weight", (D, D), tl + "attn.wv.weight"),
            copy_job(hf + "attn.c_proj.weight", (D, D), tl + "attn.wo.weight"),
            copy_job(hf + "norm_2.weight", (D,), tl + "mlp_norm.weight"),
            copy_job(hf + "mlp.fc.weight", (F, D), tl + "mlp.w_up.weight"),
            _half_down_job(hf, tl, D, F)]


def _value_embedding(folder: HFFolder, hf: str, tl: str, n: int, V: int, D: int, H: int):
    """Layer n's value embedding: jobs when the checkpoint has both its table
    value_embeds.{n} [V, D] and its gate {hf}attn.ve_gate [H, 32] (the authors' mixer uses
    them only together), else no jobs and the lone tensor's name, unused."""
    table, gate = f"value_embeds.{n}.weight", hf + "attn.ve_gate.weight"
    present = [name for name in (table, gate) if name in folder.shapes]
    if len(present) < 2:
        return [], set(present)
    return [copy_job(table, (V, D), tl + "attn.value_embed.weight"),
            copy_job(gate, (H, 32), tl + "attn.value_gate.weight")], set()


def _inject(c: dict, src: str, D: int) -> tuple[dict, list[Job]]:
    kind = c.get("injection_type", "diagonal")
    if kind == "diagonal":
        return dict(inject="linear_concat"), [_diagonal_inject_job(D)]
    if kind == "linear":  # adapter(cat([x, e])): columns state first, as linear_concat
        return dict(inject="linear_concat"), [
            copy_job("transformer.adapter.adapter.weight", (D, 2 * D), "inject.weight")]
    if kind == "add":
        return dict(inject="add"), []
    raise ValueError(f"{src}: config field 'injection_type' = {kind!r} is not supported "
                     f"(diagonal, linear or add)")


def plan_parcae(folder: HFFolder) -> Plan:
    c, src = folder.config, folder.path
    check_config_keys(c, src, "Parcae", understood=PARCAE_UNDERSTOOD, ignorable=PARCAE_IGNORABLE)
    _refuse_options(c, src)
    D, H, F, V = _dims(c, src)
    n_pre = config_int(c, src, "n_layers_in_prelude")
    n_loop = config_int(c, src, "n_layers_in_recurrent_block")
    n_post = config_int(c, src, "n_layers_in_coda")
    tied = bool(c.get("tie_embeddings", False))
    prelude_norm = bool(c.get("prelude_norm", False))
    inject, inject_jobs = _inject(c, src, D)
    theta = (c.get("rope_settings") or {}).get("rope_base", 50_000)
    jobs = [copy_job("transformer.wte.weight", (V, D), "embed.weight")] + inject_jobs
    value_layers, unused = [], set()
    n = 0  # the layer's index over prelude, core and coda (value_embeds.{n})
    for group, count, ours in (("prelude", n_pre, "pre"), ("core_block", n_loop, "loop"),
                               ("coda", n_post, "post")):
        for i in range(count):
            hf, tl = f"transformer.{group}.{i}.", f"{ours}.{i}."
            jobs += _block_jobs(hf, tl, D, F)
            ve_jobs, lone = _value_embedding(folder, hf, tl, n, V, D, H)
            jobs += ve_jobs
            value_layers += [n] if ve_jobs else []
            unused |= lone
            n += 1
    config = dict(
        dim=D, vocab_size=V, n_heads=H, n_kv_heads=H, head_dim=D // H, ffn_dim=F,
        n_pre_blocks=n_pre, n_loop_layers=n_loop, n_post_blocks=n_post,
        default_loops=config_int(c, src, "mean_recurrence", default=32),
        max_seq_len=config_int(c, src, "block_size", default=4096),
        norm_type="rmsnorm", norm_eps=config_float(c, src, "norm_eps", 1e-5),
        norm_placement="pre", qk_norm=bool(c.get("qk_norm", False)),
        pos_encoding="rope_interleaved", rope_theta=float(theta), mlp="relu2",
        prelude_norm=prelude_norm, post_loop_proj=True, final_norm=True,
        tie_embeddings=tied, value_embed_layers=value_layers, bos_id=folder.bos_id(),
        eos_ids=folder.eos_ids(), **inject, **_init_state(c, src, D))
    if prelude_norm:
        jobs.append(copy_job("transformer.ln_prelude.weight", (D,), "prelude_norm.weight"))
    jobs += [copy_job("transformer.C.weight", (D, D), "post_loop_proj.weight"),
             copy_job("transformer.ln_f.weight", (D,), "final_norm.weight")]
    # freqs_cis: a RoPE table the model registers as a persistent buffer; unused: a value
    # table without its layer's gate, or a gate without its table, which the authors'
    # attention never reads. A tied state dict holds the head's copy under both names.
    return finish_plan(folder, config, jobs, tied, V, D, rope_tables={"freqs_cis"}, unused=unused)
