"""The command-line options that `generate`, `talk` and `chat` share, and what they turn
into: Model(...) options, generate() keyword arguments, checked prompt text and token ids.

Kept apart from cli.py so that the subcommand modules (chat.py, talk.py) use them without
importing the command line back (tests/python/test_import_graph.py keeps the package
acyclic).
"""
from __future__ import annotations

import argparse


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """Sampling, depth and exit-gate options of `generate`, `talk` and `chat`."""
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--loops", type=int, default=None, help="loop depth L (default: the model's)")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=50)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--repetition-penalty", type=float, default=1.1)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--init-scale", type=float, default=None,
                   help="random initial loop state (Huginn): multiplier of its std, 0 = zero state "
                        "(default 1; drawn per call from --seed)")
    p.add_argument("--cache-window", type=int, default=0)
    p.add_argument("--max-seq-len", type=int, default=None)
    # Ouro's learned exit gate (docs/loop-depth.md "Exit gate"); unset = the model file's rule.
    p.add_argument("--exit-gate", default=None, choices=["off", "threshold", "step", "weighted"],
                   help="exit gate rule of a model that has one (default: the model file's, "
                        "i.e. the converted config.json's)")
    p.add_argument("--exit-gate-threshold", type=float, default=None,
                   help="threshold rule: exit at the first loop whose exit probability CDF >= this")
    p.add_argument("--exit-gate-step", type=int, default=None,
                   help="step rule: exit after this many loops")
    p.add_argument("--exit-gate-kv", default=None, choices=["latest", "full"],
                   help="latest (default): an exited token stops looping, its skipped KV slots copy its "
                        "last loop's; full: every loop runs as in the reference (no saving)")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Model and search options of `generate`, `talk` and `chat` (docs/kv-cache.md,
    docs/beam-search.md)."""
    p.add_argument("--kv-mode", default=None,
                   choices=["fp16", "fp32", "int8", "h_fp16", "h_int8", "h_int4"],
                   help="KV cache storage (default fp16, or the TINYLOOP_KV_* variables)")
    p.add_argument("--kv-loop-slots", type=int, default=0,
                   help="recurrence-shared KV: B slot groups for all loop iterations (0: one per iteration)")
    p.add_argument("--quant-activations", default=None, choices=["f32", "q8"],
                   help="int8/int4 weight matmuls: llama.cpp's int8 rows (q8, the default on x86 with "
                        "AVX512-VNNI or AVX2) or exact float inputs (f32)")
    p.add_argument("--beam-size", type=int, default=0,
                   help="beam search with this many beams (>= 2; sampling flags are then ignored)")
    p.add_argument("--length-penalty", type=float, default=1.0, help="beam search length penalty")
    p.add_argument("--no-mmap", action="store_true",
                   help="read the weights into memory instead of mapping the file (docs/limits.md)")


def model_kwargs(args) -> dict:
    """Model(...) options of add_engine_args (absent attributes: the engine's defaults)."""
    kw = dict(max_seq_len=getattr(args, "max_seq_len", None), kv_mode=getattr(args, "kv_mode", None),
              quant_activations=getattr(args, "quant_activations", None))
    if getattr(args, "no_mmap", False):
        kw["use_mmap"] = False
    return kw


def parse_ids(text: str) -> list[int]:
    """--ids: comma-separated token ids, each in [0, 2^31) (the model checks its vocabulary)."""
    ids = []
    for t in text.replace(" ", "").split(","):
        if not t:
            continue
        try:
            v = int(t)
        except ValueError:
            raise ValueError(f"--ids: {t!r} is not a token id (expected comma-separated integers)") from None
        if not 0 <= v < 2**31:
            raise ValueError(f"--ids: token id {v} is outside [0, vocab_size)")
        ids.append(v)
    return ids


def check_text(what: str, text: str) -> str:
    """Command-line text that is not valid UTF-8 (Python keeps its bytes as surrogates) is
    refused by name rather than failing deep inside the tokenizer."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"the {what} is not valid UTF-8 (byte {text[e.start].encode('utf-8', 'surrogateescape')!r} "
                         f"at {e.start})") from None
    return text


def decode_kwargs(args) -> dict:
    """generate / generate_stream options shared by generate, talk and chat: sampling
    (add_sampling_args) and search / KV (add_engine_args). Absent attributes are left out, so the
    engine's defaults apply."""
    names = ("max_tokens", "loops", "temperature", "top_k", "top_p", "repetition_penalty",
             "cache_window", "kv_loop_slots", "beam_size", "length_penalty")
    kw = {n: getattr(args, n) for n in names if hasattr(args, n)}
    if getattr(args, "init_scale", None) is not None:
        kw["init_scale"] = args.init_scale
    for name in ("exit_gate", "exit_gate_threshold", "exit_gate_step", "exit_gate_kv"):
        if getattr(args, name, None) is not None:
            kw[name] = getattr(args, name)
    return kw
