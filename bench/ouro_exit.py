"""Ouro's exit gate: decode time per token with the threshold rule against always running
every loop (docs/loop-depth.md "Exit gate", docs/benchmarks.md "Ouro exit gate").

    TINYLOOP_NUM_THREADS=1 PYTHONPATH=build python3 bench/ouro_exit.py        # as in docs/benchmarks.md

A random Ouro-shaped model (the `ouro` preset: the whole stack looped, sandwich norms, a
norm after every loop, an exit gate), at 4 loops. Its gate is random too: bias and weight
scale are set so that the threshold rule stops decoded tokens after 2-3 loops on average
(the printed mean). Both settings run in the same process, interleaved, greedy, no EOS
stop; decode ms/token = decode_steady_ms / (tokens_emitted - 1), the fastest of the
repeats (and the median).

token agreement: the share of decoded tokens equal to the argmax of what the reference
computes for the same prefix, `score(prompt + decoded[:k], **same rule)` (teacher-forced:
every loop of every token runs, full K/V, then the rule picks, as in OuroForCausalLM). For
the gate this measures the latest KV rule's effect on later tokens; for "off" it is the
floor set by fp16 K/V against score's float32 K/V. On a random model this is mechanics
only, not a quality number.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile

import numpy as np

import tinyloop_py as tl
from tinyloop.config import preset_config
from tinyloop.format import write_model
from tinyloop.random_model import random_tensors


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown CPU"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def write_gated_model(path: str, args) -> None:
    cfg = preset_config("ouro", dim=args.dim, n_heads=args.dim // 64, ffn_dim=3 * args.dim,
                        n_loop_layers=args.layers, vocab_size=args.vocab, max_seq_len=1024,
                        default_loops=args.loops)
    t = random_tensors(cfg, seed=0)
    rng = np.random.default_rng(1)
    # The loop state is RMS-normed (entries ~1): a weight of std s / sqrt(D) gives gate logits
    # of std ~s around the bias, so lambda varies from token to token and loop to loop.
    t["exit_gate.weight"] = (rng.standard_normal((1, args.dim)) * args.gate_std / np.sqrt(args.dim)).astype(np.float32)
    t["exit_gate.bias"] = np.array([args.gate_bias], np.float32)
    write_model(path, cfg, t)


def decode_ms(model, prompts, max_tokens, **kw) -> tuple[float, float, list]:
    """(mean decode ms/token, mean loops per decode step, the generated sequences)."""
    ms, loops, seqs = [], [], []
    for p in prompts:
        r = model.generate_stream(p, lambda t: True, max_tokens=max_tokens, stop_at_eos=False, **kw)
        ms.append(r["decode_steady_ms"] / max(1, r["tokens_emitted"] - 1))
        loops.extend(r["loops_per_token"][1:])
        seqs.append(r["tokens"])
    return float(np.mean(ms)), float(np.mean(loops)), seqs


def agreement(model, prompts, seqs, **kw) -> float:
    """Share of decoded tokens equal to the reference rule's argmax for the same prefix."""
    same = total = 0
    for p, seq in zip(prompts, seqs):
        logits = model.score(np.array(seq[:-1], np.int32), **kw)  # [len - 1, V]
        want = logits[len(p) - 1:].argmax(axis=1)
        got = np.array(seq[len(p):])
        same += int((want == got).sum())
        total += len(got)
    return same / total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4, help="loop layers (Ouro: all of them)")
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--loops", type=int, default=4)
    ap.add_argument("--threshold", type=float, default=0.7, help="exit_gate_threshold")
    ap.add_argument("--gate-bias", type=float, default=-0.6)
    ap.add_argument("--gate-std", type=float, default=1.5)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ouro.tinyloop")
        write_gated_model(path, args)
        rng = np.random.default_rng(2)
        prompts = [rng.integers(3, args.vocab, size=32).astype(np.int32) for _ in range(args.prompts)]
        gate = dict(exit_gate="threshold", exit_gate_threshold=args.threshold)
        full = dict(exit_gate="off")
        # The same rule with the reference's full K/V: every loop runs, the rule only picks.
        gate_full = dict(gate, exit_gate_kv="full")
        settings = (("gate", gate), ("full", full), ("gate_full", gate_full))
        with tl.Model(path) as model:
            decode_ms(model, prompts[:1], 8, **gate)  # warm-up
            times = {name: [] for name, _ in settings}
            mean_loops, agree = {}, {}
            for _ in range(args.repeats):  # interleaved: drift hits both alike
                for name, kw in settings:
                    t, ml, seqs = decode_ms(model, prompts, args.max_tokens, **kw)
                    times[name].append(t)
                    mean_loops[name] = ml
                    rule = {k: v for k, v in kw.items() if k != "exit_gate_kv"}  # score has no kv choice
                    agree[name] = agreement(model, prompts, seqs, **rule)
    best = {k: min(v) for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"CPU: {cpu_name()}  threads: {os.environ.get('TINYLOOP_NUM_THREADS', 'default')}")
    print(f"model: ouro preset dim {args.dim}, {args.layers} loop layers, vocab {args.vocab}, "
          f"loops {args.loops}; threshold {args.threshold}")
    for k, label in (("full", "always all loops"), ("gate", "exit gate threshold"),
                     ("gate_full", "gate, exit_gate_kv=full")):
        print(f"  {label:24s} decode {best[k]:.3f} ms/token (median {med[k]:.3f}), "
              f"mean loops per decode step {mean_loops[k]:.2f}, token agreement with the "
              f"reference {agree[k]:.3f}")
    print(f"ratio gate / full: {best['gate'] / best['full']:.3f} (median {med['gate'] / med['full']:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
