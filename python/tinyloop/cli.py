"""The `tinyloop` command line.

    tinyloop generate [MODEL] PROMPT [--max-tokens N] [--loops L] [--temperature T] ...
    tinyloop chat [MODEL] [--system TEXT] [--max-tokens N] ...
    tinyloop inspect MODEL
    tinyloop quantize IN OUT --weights f16|bf16|int8|int4 [--group 32] [--eval-text FILE...]
    tinyloop convert SRC DST            (SRC: a .gguf file or a Hugging Face folder)
    tinyloop random-model OUT [--kind llama|huginn|ouro] [--weight-dtype f32|f16|bf16|int8|int4] [--group G]
                          [--set k=v ...]
    tinyloop talk [--model PATH] [--loops L] ...
    tinyloop perplexity MODEL FILE... [--loops 1,2,4,8,16] [--ctx 256] [--tail-fraction 0.05]
    tinyloop bench [-p 512] [-n 128] [-L 8] [-t 2] [--weight-dtype f32,f16,bf16,int8,int4] [-r 3] [--json]
    tinyloop serve [MODEL] [--host 127.0.0.1] [--port 8000] [--api-key K] [--model-name NAME] ...

A PROMPT is text when the model embeds a tokenizer (Hugging Face `tokenizers` decodes the
output as it streams), or comma-separated token ids with --ids.
"""
from __future__ import annotations

import argparse
import os
import sys

from .cli_args import add_engine_args, add_sampling_args, check_text, decode_kwargs, model_kwargs, parse_ids
from .text import TextStreamer, load_tokenizer

# The model used when none is named: the bundled looped model (docs/bundled-model.md),
# installed inside the package, or models/ of a source checkout.
_HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODEL_CANDIDATES = (
    os.path.join(_HERE, "models", "tinyloop-demo.tinyloop"),
    os.path.join(_HERE, "..", "..", "models", "tinyloop-demo.tinyloop"),
)


def _default_model() -> str | None:
    env = os.environ.get("TINYLOOP_MODEL")
    if env:
        return env
    for candidate in DEFAULT_MODEL_CANDIDATES:
        if os.path.exists(candidate):
            return os.path.abspath(candidate)
    return None


def _generate_inputs(args) -> tuple[str | None, str]:
    """`generate MODEL PROMPT` or `generate PROMPT` (the bundled model, or --model)."""
    if len(args.words) > 2 or (len(args.words) == 2 and args.model):
        raise ValueError("expected [MODEL] PROMPT (quote a prompt that has spaces)")
    model, prompt = (args.words if len(args.words) == 2 else (args.model, args.words[0]))
    if len(args.words) == 1 and prompt.endswith((".tinyloop", ".gguf")) and os.path.exists(prompt):
        raise ValueError(f"no PROMPT after the model {prompt} (generate [MODEL] PROMPT)")
    if model and model.endswith(".gguf"):
        raise ValueError(f"{model} is a GGUF file: convert it first (tinyloop convert {model} OUT.tinyloop)")
    return model or _default_model(), prompt


def cmd_generate(args) -> int:
    import numpy as np
    import tinyloop_py as tl

    path, args.prompt = _generate_inputs(args)
    if path is None:
        print("tinyloop generate: no model given and no bundled model found "
              "(pass --model PATH or set TINYLOOP_MODEL)", file=sys.stderr)
        return 2
    with tl.Model(path, **model_kwargs(args)) as model:
        tokenizer = None if args.ids else load_tokenizer(model)
        if tokenizer is None:
            if not args.ids and model.tokenizer_json() == "":
                print("(this model has no tokenizer: reading the prompt as token ids)", file=sys.stderr)
            prompt = np.array(parse_ids(args.prompt), dtype=np.int32)
            on_token = lambda t: (print(t, end=" ", flush=True), True)[1]  # noqa: E731
        else:
            prompt = np.array(tokenizer.encode(check_text("prompt", args.prompt)).ids, dtype=np.int32)
            sys.stdout.write(tokenizer.decode(prompt.tolist()))
            on_token = TextStreamer(tokenizer, prompt_ids=prompt)
        r = model.generate_stream(prompt, on_token, seed=args.seed, **decode_kwargs(args))
        print()
        n = r["tokens_emitted"]
        per_tok = r["decode_steady_ms"] / max(1, n - 1)
        print(f"[{n} tokens, prefill {r['prefill_ms']:.1f} ms, first token {r['first_token_ms']:.1f} ms, "
              f"decode {per_tok:.1f} ms/token, loops {args.loops or model.config()['default_loops']}, "
              f"mean loops {r['mean_loops']:.2f}]",
              file=sys.stderr)
    return 0


def _open_default(args):
    import tinyloop_py as tl

    path = args.model or _default_model()
    if path is None:
        raise FileNotFoundError("no model given and no bundled model found "
                                "(pass --model PATH or set TINYLOOP_MODEL)")
    return tl.Model(path, **model_kwargs(args))


def cmd_talk(args) -> int:
    from .talk import run

    with _open_default(args) as model:
        tokenizer = load_tokenizer(model)
        if tokenizer is None:
            print("tinyloop talk: the model has no embedded tokenizer", file=sys.stderr)
            return 2
        return run(model, tokenizer, args)


def cmd_chat(args) -> int:
    from .chat import run
    from .text import chat_template

    args.model = args.model or _default_model()
    if args.model and args.model.endswith(".gguf"):
        raise ValueError(f"{args.model} is a GGUF file: convert it first (tinyloop convert {args.model} OUT.tinyloop)")
    with _open_default(args) as model:
        tokenizer = load_tokenizer(model)
        if tokenizer is None:
            print("tinyloop chat: the model has no embedded tokenizer", file=sys.stderr)
            return 2
        return run(model, tokenizer, chat_template(args.model), args)


def cmd_serve(args) -> int:
    try:
        import fastapi, outlines_core, uvicorn  # noqa: F401,E401
    except ImportError as e:
        raise RuntimeError(f"the server needs {e.name}: pip install fastapi uvicorn outlines-core "
                           "(versions: requirements-dev.txt)") from None
    from .server.serve import run

    args.model = args.model or _default_model()
    if args.model is None:
        raise FileNotFoundError("no model given and no bundled model found (pass MODEL or set TINYLOOP_MODEL)")
    if args.model.endswith(".gguf"):
        raise ValueError(f"{args.model} is a GGUF file: convert it first (tinyloop convert {args.model} OUT.tinyloop)")
    return run(args)


def cmd_perplexity(args) -> int:
    from .perplexity import main_args

    return main_args(args)


def cmd_inspect(args) -> int:
    from tinyloop.format import read_model

    contents = read_model(args.model)
    print(f"file: {args.model} ({os.path.getsize(args.model) / 2**20:.2f} MiB)")
    print("config:")
    for k, v in contents.config.items():
        print(f"  {k}: {v}")
    n_tok = ""
    if contents.tokenizer_json:
        from tokenizers import Tokenizer
        n_tok = f" ({Tokenizer.from_str(contents.tokenizer_json).get_vocab_size()} tokens)"
    print(f"tokenizer: {'embedded' + n_tok if contents.tokenizer_json else 'none'}")
    print(f"chat template: {'embedded' if contents.chat_template else 'none'}")
    print(f"format_version: {contents.metadata.get('format_version')}")
    # bytes per stored dtype (a quantized weight's .scales/.offsets count with their own dtype)
    by_dtype: dict = {}
    for name, (begin, end) in contents.offsets.items():
        by_dtype[contents.dtypes[name]] = by_dtype.get(contents.dtypes[name], 0) + end - begin
    n_params = sum(int(a.size) * (2 if contents.dtypes[n] == "U8" else 1)
                   for n, a in contents.tensors.items() if not n.endswith((".scales", ".offsets")))
    print(f"parameters: {n_params:,}; bytes by dtype: "
          + ", ".join(f"{d} {b / 2**20:.2f} MiB" for d, b in sorted(by_dtype.items())))
    print("tensors:")
    for name, a in contents.tensors.items():
        dtype = contents.dtypes[name]
        if dtype in ("I8", "U8"):  # quantized weight: its logical type, shape and group
            from tinyloop.quantize import group_size
            kind = "int8" if dtype == "I8" else "int4"
            K = a.shape[1] * (2 if dtype == "U8" else 1)
            sdt = contents.dtypes[name + ".scales"]
            print(f"  {name:40s} {kind:5s} {[a.shape[0], K]} group {group_size(name, contents.tensors)}"
                  f", {sdt} scales{' and offsets' if dtype == 'U8' else ''}")
        elif not name.endswith((".scales", ".offsets")) or name.rsplit(".", 1)[0] not in contents.tensors:
            print(f"  {name:40s} {dtype:5s} {list(a.shape)}")
    return 0


def cmd_random_model(args) -> int:
    from tinyloop.random_model import main as random_main

    argv = [args.out, "--kind", args.kind, "--seed", str(args.seed), "--weight-dtype", args.weight_dtype,
            "--group", str(args.group), "--scale-dtype", args.scale_dtype]
    for s in args.set or []:
        argv += ["--set", s]
    return random_main(argv)


def cmd_convert(args) -> int:
    from tinyloop.convert import convert

    out = convert(args.src, args.dst, progress=not args.quiet)
    print(f"wrote {out} ({os.path.getsize(out) / 2**20:.2f} MiB)", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tinyloop", description="TinyLoop: run looped transformer models")
    sub = ap.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="continue a prompt, streaming the output")
    g.add_argument("words", nargs="+", metavar="[MODEL] PROMPT",
                   help="a .tinyloop file (default: the bundled model) and the prompt")
    g.add_argument("--model", default=None, help="a .tinyloop file (same as the MODEL argument)")
    g.add_argument("--ids", action="store_true", help="the prompt is comma-separated token ids")
    add_sampling_args(g)
    add_engine_args(g)
    g.set_defaults(func=cmd_generate)

    t = sub.add_parser("talk", help="type the start of a text, get a continuation (empty line quits)")
    t.add_argument("--model", default=None, help="a .tinyloop file (default: the bundled model)")
    add_sampling_args(t)
    add_engine_args(t)
    t.set_defaults(func=cmd_talk)

    c = sub.add_parser("chat", help="a conversation through the model's chat template (empty line quits)")
    c.add_argument("model", nargs="?", default=None, help="a .tinyloop file (default: the bundled model)")
    c.add_argument("--system", default=None, help="a system message (templates that take one)")
    add_sampling_args(c)
    add_engine_args(c)
    c.set_defaults(func=cmd_chat, max_tokens=256)

    sv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (docs/server.md)")
    from .server.serve import add_arguments as serve_arguments  # no server imports until it runs
    serve_arguments(sv)
    sv.set_defaults(func=cmd_serve)

    p = sub.add_parser("perplexity", help="perplexity of text files at one or more loop depths")
    p.add_argument("model")
    p.add_argument("files", nargs="+")
    p.add_argument("--loops", default="1,2,4,8,16", help="comma-separated loop depths")
    p.add_argument("--ctx", type=int, default=256, help="tokens per scored window")
    p.add_argument("--tail-fraction", type=float, default=None,
                   help="score only the last fraction of each file (0.05: the bundled model's held-out slice)")
    p.add_argument("--max-windows", type=int, default=None)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_perplexity)

    i = sub.add_parser("inspect", help="print a model file's config and tensors")
    i.add_argument("model")
    i.set_defaults(func=cmd_inspect)

    cv = sub.add_parser("convert", help="GGUF file or Hugging Face folder -> .tinyloop (docs/convert.md)")
    cv.add_argument("src", help="a .gguf file (llama) or a Hugging Face folder (Llama, Huginn-0125, Ouro)")
    cv.add_argument("dst", help="the .tinyloop file to write")
    cv.add_argument("--quiet", action="store_true", help="no progress bar")
    cv.set_defaults(func=cmd_convert)

    r = sub.add_parser("random-model", help="write a model with random weights (tests, benchmarks)")
    r.add_argument("out")
    r.add_argument("--kind", default="huginn", choices=["llama", "huginn", "ouro"])
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--weight-dtype", default="f32", choices=["f32", "f16", "bf16", "int8", "int4"])
    r.add_argument("--group", type=int, default=32, help="int8/int4: columns per scale (0: one group a row)")
    r.add_argument("--scale-dtype", default="f32", choices=["f32", "f16"], help="int8/int4: scale/offset dtype")
    r.add_argument("--set", action="append", help="config override key=value (repeatable)")
    r.set_defaults(func=cmd_random_model)

    from tinyloop import quantize_file as quantize_mod  # numpy-only at import
    qz = sub.add_parser("quantize", help="rewrite a model's weights as f16/bf16/int8/int4, with a KL/top-1 report")
    quantize_mod.add_arguments(qz)
    qz.set_defaults(func=quantize_mod.main_args)

    from tinyloop import bench  # numpy-only at import; the engine is imported when it runs
    bn = sub.add_parser("bench", help="pp/tg tokens per second, llama-bench style (tinyloop.bench)")
    bench.add_arguments(bn)
    bn.set_defaults(func=bench.run)

    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, RuntimeError, OSError, OverflowError, MemoryError) as e:
        # One line, no traceback, for any bad input (issue 16).
        print(f"tinyloop {args.cmd}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
