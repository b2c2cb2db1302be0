"""llama.cpp serving N concurrent sequences in one batch: the aggregate-throughput peer of
TinyLoop's serving engine (same weights, same machine).

    python3 bench/llamacpp_batch.py                                   # bench model (L=8 unrolled, F16)
    python3 bench/llamacpp_batch.py --model smollm2                   # SmolLM2-135M-Instruct Q4_1
    python3 bench/llamacpp_batch.py --model bench --concurrency 1,4,16,64 --prompt-len 128 \\
        --n-new 128 --threads 2 --reps 1 --check
    python3 bench/llamacpp_batch.py --model my.gguf --concurrency 8 --reps 3

What it measures. C sequences, each a --prompt-len prompt of random token ids (fixed seed,
ids in [10, vocab); sequence i has the same prompt at every concurrency), are served together:
  prefill: every prompt is evaluated, whole prompts packed into llama_decode batches of at most
           --n-batch tokens, each token tagged with its sequence's id, logits requested only for
           each prompt's last token, whose argmax is the sequence's first new token;
  decode:  n_new - 1 steps, each ONE llama_decode holding one token per sequence (all C
           sequences live throughout: the workload has no early stops), greedy argmax in numpy
           over llama_get_logits_ith for every sequence.
The table gives the wall time of both phases (time.perf_counter, after a short warm-up run of
the same concurrency; batch filling and the argmax are included, as a serving engine pays for
its own sampling) and
  aggregate decode tok/s = C * n_new / decode s  (all n_new generated tokens of every sequence
                           over the decode time, although the first of them comes out of the
                           prefill: 1/n_new optimistic; "ms/step" is decode s / (n_new - 1)
                           steps, the exact per-step time)
  total tok/s            = C * n_new / (prefill s + decode s).

How. llama-cpp-python's low-level API: `Llama` only loads the model (backend init, quiet logs);
its own context is a tiny unused one, because `Llama(...)` has no n_seq_max / kv_unified
parameters (in 0.3.36 they would fall silently into **kwargs and leave n_seq_max = 1). The
serving context is made with llama_init_from_model(model, params): n_seq_max = C, kv_unified =
false (one KV stream of n_ctx / n_seq_max cells per sequence, so n_ctx = C * --ctx-per-seq gives
every sequence its own room and attention only spans a sequence's own cells; with kv_unified =
true, --kv-unified, n_ctx is one pool shared by all and every token's attention runs over all of
it, masked), n_batch = n_ubatch = max(--n-batch, C), F16 KV cache, flash attention --flash-attn
(llama.cpp's default, auto, resolves to on with this CPU build). The batch is
llama_batch_init(n, 0, 1), filled field by field; llama_memory_clear(llama_get_memory(ctx),
True) empties the KV memory before every run.

--model bench unrolls the F16 benchmark model (python/tinyloop/bench.py) to L=8 into a plain
llama-architecture GGUF with bench/compare.py's unrolled_gguf, cached next to the model in the
bench dir ($TINYLOOP_BENCH_DIR, else /tmp/tinyloop-bench) under compare.py's own file name.
--model smollm2 is the tests' cached GGUF ($TINYLOOP_CACHE, else ~/.cache/tinyloop, smollm2/).

--check serves the first --check-seqs prompts once batched and once one sequence at a time, and
reports how many sequences give identical greedy outputs (llama.cpp's batched matmuls may round
differently from batch 1, so this is reported, not asserted), where the others first diverge,
and how many distinct outputs there are (different prompts must give different outputs).

Runtime with the defaults on 2 idle AMD EPYC (AVX2) cores: all of 1,4,16,64 about 2 minutes
for the bench model (18 layers, 152M parameters, F16; C = 64 alone ~80 s: prefill ~20 s, decode
~60 s) and about 2.5 minutes for SmolLM2 (C = 64 ~100 s); --check adds ~35 s. llama.cpp's
threads spin at their barriers, so a busy machine slows it far more than its share: with a
3-job compile running beside it, C = 16 took 126 s instead of 21 s and C = 64 over 5 minutes.
Needs `pip install gguf llama-cpp-python` (built as compare.py says).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "python"))  # tinyloop (the bench model)
sys.path.insert(0, _HERE)  # compare.py (its unrolled_gguf)

import llama_cpp  # noqa: E402
from tinyloop.bench import cpu_name  # noqa: E402

LOOPS = 8  # the benchmark model's default loop depth, unrolled for llama.cpp
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
FLASH_ATTN = {"auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
              "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
              "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED}


class LlamaBatchPeer:
    """One llama.cpp model and one context serving up to n_seq_max sequences at once."""

    def __init__(self, gguf_path: str, n_seq_max: int, n_threads: int, n_ctx_per_seq: int = 512,
                 n_batch: int = 512, flash_attn: str = "auto", kv_unified: bool = False):
        self.n_seq_max, self.n_batch = n_seq_max, n_batch
        # Llama for loading only (it runs llama_backend_init and silences llama.cpp's log with
        # verbose=False). Its own context is unused, so it is made as small as it gets.
        self._llm = llama_cpp.Llama(gguf_path, n_ctx=256, n_batch=1, n_ubatch=1,
                                    n_threads=n_threads, n_threads_batch=n_threads, verbose=False)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self._llm.model))

        p = llama_cpp.llama_context_default_params()
        p.n_seq_max = n_seq_max
        # Not unified (the default): one KV stream per sequence, n_ctx / n_seq_max cells each
        # (llama.cpp pads that to a multiple of 256 and rounds n_ctx to match). Unified: one pool
        # of n_ctx cells shared by all, each token attending (masked) over every used cell.
        p.kv_unified = kv_unified
        if not kv_unified:  # pad as llama.cpp would, sparing its "n_ctx is not divisible" warning
            n_ctx_per_seq = -(-n_ctx_per_seq // 256) * 256
        p.n_ctx = n_seq_max * n_ctx_per_seq
        # A decode step holds n_seq_max tokens in one llama_decode, which llama.cpp requires to
        # fit n_batch (asserted) and, to stay one graph, n_ubatch.
        p.n_batch = p.n_ubatch = max(n_batch, n_seq_max)
        p.n_threads = p.n_threads_batch = n_threads  # batch > 1 runs on n_threads_batch
        p.flash_attn_type = FLASH_ATTN[flash_attn]
        p.no_perf = True
        self.ctx = llama_cpp.llama_init_from_model(self._llm.model, p)
        if not self.ctx:
            raise RuntimeError(f"llama_init_from_model failed ({n_seq_max} sequences)")
        self.n_ctx_seq = llama_cpp.llama_n_ctx_seq(self.ctx)  # each sequence's room, as applied
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        # One seq id per token (the third argument), room for the larger of the two batch kinds.
        self._cap = p.n_batch
        self.batch = llama_cpp.llama_batch_init(self._cap, 0, 1)

    def close(self) -> None:
        # The context before the model it was made from (the Llama owns the model).
        if self.ctx:
            llama_cpp.llama_batch_free(self.batch)
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self._llm is not None:
            self._llm.close()
            self._llm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (token, pos, seq_id, wants_logits) entries, in this order."""
        b = self.batch
        for i, (tok, pos, seq, out) in enumerate(entries):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = out
        b.n_tokens = len(entries)
        rc = llama_cpp.llama_decode(self.ctx, b)
        if rc != 0:  # 1: no KV slot, 2: aborted, < 0: invalid batch / fatal
            raise RuntimeError(f"llama_decode returned {rc} ({len(entries)} tokens)")

    def _argmax(self, i: int) -> int:
        """Greedy token from the logits of batch entry i (its index in the batch just decoded,
        not its rank among the outputs: llama.cpp maps it through output_ids)."""
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, i)
        if not ptr:
            raise RuntimeError(f"no logits for batch entry {i}")
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        tok = int(np.argmax(logits))
        if not np.isfinite(logits[tok]):
            raise RuntimeError(f"non-finite logits for batch entry {i}")
        return tok

    def _prefill_chunks(self, prompts: list[list[int]]):
        """Batches of at most n_batch (token, pos, seq, wants_logits) entries, holding whole
        prompts where they fit: in non-unified mode llama.cpp splits a batch into ubatches with
        the same token count for every sequence, so a prompt cut across two batches would make
        ragged, smaller ubatches. A prompt longer than n_batch goes alone, in n_batch pieces."""
        cur = []
        for seq, prompt in enumerate(prompts):
            n = len(prompt)
            entries = [(int(t), pos, seq, pos == n - 1) for pos, t in enumerate(prompt)]
            if cur and len(cur) + n > self.n_batch:
                yield cur
                cur = []
            while len(entries) > self.n_batch:
                yield entries[:self.n_batch]
                entries = entries[self.n_batch:]
            cur += entries
        if cur:
            yield cur

    def run(self, prompts: list[list[int]], n_new: int) -> dict:
        """Serve the prompts together, sequence i with seq id i: prefill, then n_new - 1 decode
        steps of one token per sequence; greedy. Returns the generated ids and the timings."""
        n_seq = len(prompts)
        if not 1 <= n_seq <= self.n_seq_max:
            raise ValueError(f"{n_seq} prompts for a context of {self.n_seq_max} sequences")
        if n_new < 1 or any(len(p) < 1 for p in prompts):
            raise ValueError("need n_new >= 1 and non-empty prompts")
        longest = max(len(p) for p in prompts) + n_new - 1
        if longest > self.n_ctx_seq:
            raise ValueError(f"{longest} positions per sequence > the context's {self.n_ctx_seq}")
        # Empty KV memory (data too), so every run starts from the same state.
        llama_cpp.llama_memory_clear(self.mem, True)
        outputs: list[list[int]] = [[] for _ in prompts]

        t0 = time.perf_counter()
        for chunk in self._prefill_chunks(prompts):
            self._decode(chunk)
            # Logits are overwritten by the next llama_decode: read this chunk's now.
            for i, (_, _, seq, out) in enumerate(chunk):
                if out:
                    outputs[seq].append(self._argmax(i))
        t1 = time.perf_counter()
        # Sequence ids in increasing order, one token each: non-unified llama.cpp only puts
        # consecutive ids in one ubatch, so this order keeps every step a single graph.
        lens = [len(p) for p in prompts]
        for step in range(n_new - 1):
            self._decode([(outputs[s][-1], lens[s] + step, s, True) for s in range(n_seq)])
            for s in range(n_seq):
                outputs[s].append(self._argmax(s))
        t2 = time.perf_counter()

        generated = n_seq * n_new
        prefill_s, decode_s, total_s = t1 - t0, t2 - t1, t2 - t0
        return {"outputs": outputs, "prefill_s": prefill_s, "decode_s": decode_s,
                "total_s": total_s, "generated": generated, "decode_steps": n_new - 1,
                "decode_tok_s": generated / decode_s if decode_s > 0 else float("nan"),
                # Only the tokens the decode steps made (bench/serving.py's decode_tok_s for
                # TinyLoop counts these): n_seq * (n_new - 1) / decode_s.
                "decode_step_tok_s": (generated - n_seq) / decode_s if decode_s > 0 else float("nan"),
                "total_tok_s": generated / total_s}


def check(peer: LlamaBatchPeer, prompts: list[list[int]], n_new: int) -> dict:
    """The prompts served batched and each alone (one sequence per run, seq id 0): how many
    sequences agree exactly; for the others, the first position where they differ. Batched
    matmuls may round differently from batch 1, so agreement is reported, not asserted."""
    batched = peer.run(prompts, n_new)["outputs"]
    alone = [peer.run([p], n_new)["outputs"][0] for p in prompts]
    diverge = []
    for a, b in zip(batched, alone):
        diverge.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None))
    return {"n": len(prompts), "agree": sum(d is None for d in diverge),
            "first_divergence": [d for d in diverge if d is not None],
            "distinct_batched": len({tuple(o) for o in batched}),
            "distinct_alone": len({tuple(o) for o in alone}),
            "batched": batched, "alone": alone}


def model_path(which: str) -> str:
    if which == "bench":
        from tinyloop import bench
        from compare import unrolled_gguf  # bench/compare.py, the same unrolled twin

        src = bench.bench_model_path("f16")
        path = os.path.splitext(src)[0] + f"-unrolled-L{LOOPS}-f16.gguf"  # compare.py's name
        if not os.path.exists(path):
            print(f"(writing {path})", file=sys.stderr)
            unrolled_gguf(src, LOOPS, path + ".tmp")
            os.replace(path + ".tmp", path)
        return path
    if which == "smollm2":
        root = os.environ.get("TINYLOOP_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tinyloop")
        path = os.path.join(root, "smollm2", SMOLLM2_GGUF)
        if not os.path.exists(path):
            sys.exit(f"{path} is missing (the tests fetch it: tests/python/smollm2.py)")
        return path
    if not os.path.exists(which):
        sys.exit(f"no such model: {which}")
    return which


def _ints(s: str) -> list[int]:
    return [int(v) for v in s.split(",") if v != ""]


def _fmt(v: list[float], digits: int) -> str:
    m = statistics.fmean(v)
    return f"{m:.{digits}f} ± {statistics.stdev(v):.{digits}f}" if len(v) > 1 else f"{m:.{digits}f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bench", help="bench, smollm2 or a .gguf path (default bench)")
    ap.add_argument("--concurrency", type=_ints, default=[1, 4, 16, 64],
                    help="sequences served together, comma-separated (default 1,4,16,64)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--n-new", type=int, default=128, help="tokens generated per sequence")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1, help="timed runs per concurrency (after a warm-up)")
    ap.add_argument("--n-batch", type=int, default=512, help="prefill batch, tokens (default 512)")
    ap.add_argument("--ctx-per-seq", type=int, default=512,
                    help="KV cells per sequence (at least prompt + n_new; default 512)")
    ap.add_argument("--flash-attn", choices=sorted(FLASH_ATTN), default="auto")
    ap.add_argument("--kv-unified", action="store_true",
                    help="one KV pool shared by all sequences (default: one stream per sequence)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true",
                    help="also compare batched against one-at-a-time greedy outputs")
    ap.add_argument("--check-seqs", type=int, default=8, help="sequences --check compares (default 8)")
    args = ap.parse_args(argv)
    if args.prompt_len < 1 or args.n_new < 2 or args.reps < 1 or min(args.concurrency) < 1:
        ap.error("need --prompt-len >= 1, --n-new >= 2, --reps >= 1, concurrency >= 1")
    ctx_per_seq = max(args.ctx_per_seq, args.prompt_len + args.n_new)

    path = model_path(args.model)
    cmax = max(max(args.concurrency), args.check_seqs if args.check else 0)
    print(f"llama.cpp (llama-cpp-python {llama_cpp.__version__}) batched serving: "
          f"{os.path.basename(path)}; CPU {cpu_name()}, {args.threads} threads; "
          f"prompt {args.prompt_len}, {args.n_new} new tokens per sequence, greedy; "
          f"n_batch {args.n_batch}, flash_attn {args.flash_attn}, "
          f"KV {'unified' if args.kv_unified else 'one stream per sequence'}, {args.reps} rep(s)", flush=True)

    rows = []
    prompts = None
    for c in args.concurrency:
        with LlamaBatchPeer(path, c, args.threads, ctx_per_seq, args.n_batch, args.flash_attn,
                            args.kv_unified) as peer:
            if prompts is None:  # sequence i has the same prompt at every concurrency
                rng = np.random.default_rng(args.seed)
                prompts = rng.integers(10, peer.n_vocab, size=(cmax, args.prompt_len)).tolist()
            # Warm-up: the same concurrency, short (touches the weights, sizes the buffers).
            peer.run([p[:8] for p in prompts[:c]], 2)
            samples = [peer.run(prompts[:c], args.n_new) for _ in range(args.reps)]
        r = {k: [s[k] for s in samples] for k in ("prefill_s", "decode_s", "decode_tok_s", "total_tok_s")}
        r["ms_step"] = [1e3 * s["decode_s"] / s["decode_steps"] for s in samples]
        rows.append((c, r))
        print(f"(C={c}: prefill {statistics.fmean(r['prefill_s']):.2f} s, decode "
              f"{statistics.fmean(r['decode_s']):.2f} s)", file=sys.stderr, flush=True)

    print(f"load average {os.getloadavg()[0]:.1f}")
    print("| concurrency | prefill s | decode s | aggregate decode tok/s | total tok/s | ms/step |")
    print("|---:|---:|---:|---:|---:|---:|")
    for c, r in rows:
        print(f"| {c} | {_fmt(r['prefill_s'], 2)} | {_fmt(r['decode_s'], 2)} | "
              f"{_fmt(r['decode_tok_s'], 1)} | {_fmt(r['total_tok_s'], 1)} | {_fmt(r['ms_step'], 1)} |")

    if args.check:
        n = args.check_seqs
        with LlamaBatchPeer(path, n, args.threads, ctx_per_seq, args.n_batch, args.flash_attn,
                            args.kv_unified) as peer:
            got = check(peer, prompts[:n], args.n_new)
        print(f"\ncheck: {got['agree']}/{got['n']} sequences identical batched ({n} at once) and "
              f"alone, {args.n_new} greedy tokens each; first divergences at "
              f"{sorted(got['first_divergence']) or '-'}; distinct outputs: "
              f"{got['distinct_batched']} batched, {got['distinct_alone']} alone")
        for s, o in enumerate(got["batched"][:3]):
            print(f"  seq {s} batched: {o[:12]} ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
