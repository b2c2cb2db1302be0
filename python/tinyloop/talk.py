"""`tinyloop talk`: the tutorial's talk program on the engine (docs/text.md, "Command line").

Type the start of a text, get a continuation; an empty line quits. Each prompt is
continued on its own (nothing carries over from an earlier prompt); only the sampling
seed sequence carries across prompts, as the tutorial's talk program keeps one generator.
"""
from __future__ import annotations

import sys

from .cli_args import decode_kwargs
from .repl import turn_seed, typed_lines


def run(model, tokenizer, args, stdin=None, stdout=None) -> int:
    import numpy as np
    from .text import TextStreamer

    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    print("Type the start of a text and press Enter. Empty line quits.", file=stdout, flush=True)
    n = 0
    for line in typed_lines(stdin, stdout):
        prompt = np.asarray(tokenizer.encode(line).ids, dtype=np.int32)  # [T]
        if prompt.size == 0:
            continue
        seed = turn_seed(args.seed, n)
        n += 1
        model.generate_stream(prompt, TextStreamer(tokenizer, stdout, prompt_ids=prompt), seed=seed,
                              **decode_kwargs(args))
        stdout.write("\n")
    return 0
