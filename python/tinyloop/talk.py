"""`tinyloop talk`: the tutorial's talk program on the engine (docs/text.md, "Command line").

Type the start of a text, get a continuation; an empty line quits. Each prompt is
continued on its own (nothing carries over from an earlier prompt); only the sampling
seed sequence carries across prompts, as the tutorial's talk program keeps one generator.
"""
from __future__ import annotations

import sys


def run(model, tokenizer, args, stdin=None, stdout=None) -> int:
    import numpy as np
    from .cli import decode_kwargs
    from .text import TextStreamer

    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    print("Type the start of a text and press Enter. Empty line quits.", file=stdout, flush=True)
    n = 0
    while True:
        stdout.write("> ")
        stdout.flush()
        line = stdin.readline()
        if not line or not line.strip():
            return 0
        prompt = np.asarray(tokenizer.encode(line.rstrip("\n")).ids, dtype=np.int32)
        if prompt.size == 0:
            continue
        seed = None if args.seed is None else args.seed + n
        n += 1
        model.generate_stream(prompt, TextStreamer(tokenizer, stdout, prompt_ids=prompt), seed=seed,
                              **decode_kwargs(args))
        stdout.write("\n")
