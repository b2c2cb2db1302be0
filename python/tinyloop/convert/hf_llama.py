"""Hugging Face `LlamaForCausalLM` folders -> `.tinyloop`.

A plain model maps exactly onto the looped family: layers 0..N-2 become pre blocks and the
last layer a one-layer loop run once (n_pre_blocks = N-1, n_loop_layers = 1,
default_loops = 1), so the forward is the Llama forward. HF Llama applies RoPE with
`rotate_half` (pairs i, i + hd/2): `pos_encoding = rope_half`, rows kept as stored.

HF names (model.layers.{i}.):
    self_attn.{q,k,v,o}_proj.weight (+ .bias when attention_bias)  -> attn.{wq,wk,wv,wo}
    mlp.{gate,up,down}_proj.weight  (+ .bias when mlp_bias)         -> mlp.{w_gate,w_up,w_down}
    input_layernorm.weight -> attn_norm, post_attention_layernorm.weight -> mlp_norm
model.embed_tokens.weight -> embed, model.norm.weight -> final_norm,
lm_head.weight -> head (absent when tie_word_embeddings).
"""
from __future__ import annotations

from .common import Job, Plan
from .config_keys import check_config_keys
from .hf_folder import HFFolder, config_float, config_int

__all__ = ["plan_llama", "llama_dims", "copy_job", "attention_jobs", "mlp_jobs", "rope_theta",
           "check_rope_scaling", "check_act"]


def copy_job(src: str, shape, dst: str) -> Job:
    return Job({src: tuple(shape)}, lambda d, s=src, t=dst: {t: d[s]}, label=dst)


def attention_jobs(hf: str, tl: str, D: int, H: int, KVH: int, hd: int, qkv_bias: bool,
                   out_bias: bool) -> list[Job]:
    """Separate q/k/v/o projections `{hf}{q,k,v,o}_proj` -> `{tl}attn.{wq,wk,wv,wo}`."""
    jobs = []
    for proj, ours, n_out, n_in, bias in (("q", "wq", H * hd, D, qkv_bias),
                                          ("k", "wk", KVH * hd, D, qkv_bias),
                                          ("v", "wv", KVH * hd, D, qkv_bias),
                                          ("o", "wo", D, H * hd, out_bias)):
        jobs.append(copy_job(f"{hf}{proj}_proj.weight", (n_out, n_in), f"{tl}attn.{ours}.weight"))
        if bias:
            jobs.append(copy_job(f"{hf}{proj}_proj.bias", (n_out,), f"{tl}attn.{ours}.bias"))
    return jobs


def mlp_jobs(hf: str, tl: str, D: int, F: int, bias: bool) -> list[Job]:
    """SwiGLU `{hf}{gate,up,down}_proj` -> `{tl}mlp.{w_gate,w_up,w_down}`."""
    jobs = []
    for proj, ours, n_out, n_in in (("gate", "w_gate", F, D), ("up", "w_up", F, D),
                                    ("down", "w_down", D, F)):
        jobs.append(copy_job(f"{hf}{proj}_proj.weight", (n_out, n_in), f"{tl}mlp.{ours}.weight"))
        if bias:
            jobs.append(copy_job(f"{hf}{proj}_proj.bias", (n_out,), f"{tl}mlp.{ours}.bias"))
    return jobs


def check_rope_scaling(cfg: dict, src: str) -> None:
    """RoPE scaling (linear, dynamic, yarn, llama3, ...) changes the frequencies: refused."""
    for key in ("rope_scaling", "rope_parameters"):
        v = cfg.get(key)
        if v is None:
            continue
        kind = v.get("rope_type", v.get("type")) if isinstance(v, dict) else v
        if kind not in (None, "default"):
            raise ValueError(f"{src}: config field '{key}' = {v!r}: RoPE scaling is not "
                             f"supported (only plain RoPE)")


def rope_theta(cfg: dict, src: str, default: float = 10000.0) -> float:
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and params.get("rope_theta") is not None:
        return config_float(params, src, "rope_theta")
    return config_float(cfg, src, "rope_theta", default)


def check_act(cfg: dict, src: str, key: str = "hidden_act") -> None:
    act = cfg.get(key, "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"{src}: config field '{key}' = {act!r}: only silu (SwiGLU) is "
                         f"supported")


def _refuse_flags(cfg: dict, src: str) -> None:
    check_rope_scaling(cfg, src)
    check_act(cfg, src)
    # pretraining_tp only splits the matmuls into slices; the function is the same.
    for key in ("sliding_window", "use_sliding_window"):
        if cfg.get(key) not in (None, False):
            raise ValueError(f"{src}: config field '{key}' = {cfg[key]!r}: sliding-window "
                             f"attention is not supported")


def llama_dims(c: dict, src: str) -> tuple[int, int, int, int, int, int, int]:
    """(D, H, KVH, hd, F, N, V) of a Llama-style HF config (Llama and Ouro share the fields)."""
    D = config_int(c, src, "hidden_size")
    H = config_int(c, src, "num_attention_heads")
    KVH = config_int(c, src, "num_key_value_heads", default=H)
    hd = config_int(c, src, "head_dim", default=D // H if D % H == 0 else -1)
    if hd <= 0:
        raise ValueError(f"{src}: config field 'head_dim' is missing and hidden_size {D} is "
                         f"not a multiple of num_attention_heads {H}")
    F = config_int(c, src, "intermediate_size")
    N = config_int(c, src, "num_hidden_layers")
    V = config_int(c, src, "vocab_size")
    return D, H, KVH, hd, F, N, V


# Keys plan_llama reads, or refuses by value (docs/convert.md).
LLAMA_UNDERSTOOD = frozenset({
    "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
    "num_hidden_layers", "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta",
    "rope_scaling", "rope_parameters", "hidden_act", "attention_bias", "mlp_bias",
    "tie_word_embeddings", "sliding_window", "use_sliding_window"})
# Keys that cannot change what a Llama checkpoint computes in transformers' LlamaForCausalLM:
# SmolLM2's nanotron leftovers (`is_llama_config`, `rope_interleaved`, which transformers'
# Llama never reads: it always rotates halves) and generation-only settings.
LLAMA_IGNORABLE = frozenset({"is_llama_config", "rope_interleaved",
                             "num_logits_to_keep", "tokenizer_class"})


def plan_llama(folder: HFFolder) -> Plan:
    c, src = folder.config, folder.path
    check_config_keys(c, src, "Llama", LLAMA_UNDERSTOOD, LLAMA_IGNORABLE)
    _refuse_flags(c, src)
    D, H, KVH, hd, F, N, V = llama_dims(c, src)
    if N < 1:
        raise ValueError(f"{src}: config field 'num_hidden_layers' must be >= 1, got {N}")
    attn_bias = bool(c.get("attention_bias", False))
    mlp_bias = bool(c.get("mlp_bias", False))
    tied = bool(c.get("tie_word_embeddings", False))
    config = dict(
        dim=D, vocab_size=V, n_heads=H, n_kv_heads=KVH, head_dim=hd, ffn_dim=F,
        n_pre_blocks=N - 1, n_loop_layers=1, n_post_blocks=0, default_loops=1,
        max_seq_len=config_int(c, src, "max_position_embeddings", default=2048),
        norm_type="rmsnorm", norm_eps=config_float(c, src, "rms_norm_eps", 1e-6),
        norm_placement="pre", attn_qkv_bias=attn_bias, attn_out_bias=attn_bias,
        mlp_bias=mlp_bias, pos_encoding="rope_half", rope_theta=rope_theta(c, src),
        mlp="swiglu", tie_embeddings=tied, final_norm=True,
        bos_id=folder.bos_id(), eos_ids=folder.eos_ids())
    jobs = [copy_job("model.embed_tokens.weight", (V, D), "embed.weight")]
    for i in range(N):
        hf, tl = f"model.layers.{i}.", (f"pre.{i}." if i < N - 1 else "loop.0.")
        jobs.append(copy_job(hf + "input_layernorm.weight", (D,), tl + "attn_norm.weight"))
        jobs += attention_jobs(hf + "self_attn.", tl, D, H, KVH, hd, attn_bias, attn_bias)
        jobs.append(copy_job(hf + "post_attention_layernorm.weight", (D,), tl + "mlp_norm.weight"))
        jobs += mlp_jobs(hf + "mlp.", tl, D, F, mlp_bias)
    jobs.append(copy_job("model.norm.weight", (D,), "final_norm.weight"))
    return finish_plan(folder, config, jobs, tied, V, D)


def finish_plan(folder: HFFolder, config: dict, jobs: list, tied: bool, V: int, D: int,
                rope_tables: set | None = None, unused: frozenset | set = frozenset()) -> Plan:
    """The end every Hugging Face converter shares (Llama, Ouro, Nanbeige, Huginn, Parcae):
    the head (or a tied checkpoint's duplicate skipped); persisted RoPE tables skipped and
    left out of the float check (rope_tables; default: Llama's rotary_emb.inv_freq buffers);
    `unused` source tensors skipped; every other tensor must be float."""
    if rope_tables is None:
        rope_tables = {n for n in folder.shapes if n.endswith("rotary_emb.inv_freq")}
    ignored = set(rope_tables) | set(unused)
    if tied:
        ignored.add("lm_head.weight")  # some checkpoints store the tied copy too
    else:
        jobs.append(copy_job("lm_head.weight", (V, D), "head.weight"))
    folder.check_float(set(folder.shapes) - set(rope_tables))
    return Plan(src=folder.path, config=config, jobs=jobs, source_shapes=folder.shapes,
                load=folder.load, ignored=ignored, tokenizer_json=folder.tokenizer_json(),
                chat_template=folder.chat_template())
