#!/usr/bin/env python3
"""Print the held-out loss table of docs/bundled-model.md from a run's final_eval.json.

    python3 tools/train/card_table.py tools/train/.cache/run/final_eval.json
"""
import json
import math
import sys

path = sys.argv[1] if len(sys.argv) > 1 else "tools/train/.cache/run/final_eval.json"
r = json.load(open(path))
print(f"steps {r['steps']}, training wall time {r['train_minutes']:.1f} min, "
      f"{r['eval_windows']} windows x {r['context']} tokens, stopped early: {r['stopped_early']}\n")
print("| L | held-out loss (nats/token) | perplexity |")
print("| --- | --- | --- |")
for L, v in sorted(r["held_out_loss"].items(), key=lambda kv: int(kv[0])):
    print(f"| {L} | {v:.4f} | {math.exp(v):.2f} |")
