"""No silent acceptance: every converter names the config keys it understands.

A Hugging Face `config.json` (or GGUF metadata) may carry keys a converter has never
heard of: a new architecture flag, a scaling option, a norm switch. Ignoring such a key
produces a file whose outputs differ from the reference without a word. So each converter
declares two sets:

- `understood`: keys it reads and honours (or refuses, by value, with its own message);
- `ignorable`: keys that cannot change the model's outputs (bookkeeping such as
  `torch_dtype`, `_name_or_path`, training-only settings such as dropout, tokenizer ids
  read elsewhere).

Any other key is refused by `check_config_keys` with a message naming it. `HF_IGNORABLE`
is the bookkeeping every Hugging Face config carries; a converter adds its own on top.
docs/convert.md lists, per architecture, what is honoured, ignored and refused.
"""
from __future__ import annotations

from collections.abc import Iterable

__all__ = ["HF_IGNORABLE", "check_config_keys"]

# Keys PretrainedConfig writes into every config.json, and training / runtime settings of
# transformers that do not change the function the weights compute at inference.
HF_IGNORABLE = frozenset({
    "_name_or_path", "_attn_implementation", "_attn_implementation_autoset", "architectures",
    "model_type", "transformers_version", "torch_dtype", "dtype", "auto_map", "use_cache",
    "initializer_range", "attention_dropout", "hidden_dropout", "dropout", "embd_pdrop",
    "resid_pdrop", "attn_pdrop", "bos_token_id", "eos_token_id", "pad_token_id",
    "output_attentions", "output_hidden_states", "return_dict", "is_encoder_decoder",
    "tie_encoder_decoder", "pruned_heads", "chunk_size_feed_forward", "id2label", "label2id",
    "problem_type", "torchscript", "use_return_dict", "quantization_config_ignored",
    "pretraining_tp",  # splits matmuls into slices; the same function (hf_llama)
})


def check_config_keys(config: dict, src: str, arch: str, understood: Iterable[str],
                      ignorable: Iterable[str] = ()) -> None:
    """Raises ValueError naming the first key of `config` (sorted) that is neither
    understood nor ignorable by the `arch` converter. `src` prefixes the message."""
    known = set(understood) | set(ignorable) | HF_IGNORABLE
    unknown = sorted(k for k in config if k not in known)
    if unknown:
        more = f" (and {len(unknown) - 1} more: {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
        raise ValueError(
            f"{src}: config key '{unknown[0]}' is not understood by the {arch} converter and "
            f"could change the model's outputs{more}; refusing rather than converting a model "
            f"that may not match its reference (docs/convert.md lists the keys each "
            f"architecture honours)")
