#!/usr/bin/env python3
"""Depth report: what more loops buy, measured by the engine (issue 19's pictures).

    python3 tools/depth_report.py --model models/tinyloop-demo.tinyloop \\
        --task add --task-format pad --carry-bias 0.5 --task-size 4 --n 1000 \\
        --depths 1,2,4,8,16,32 --out-dir docs/images --json depth-report.json

Every number comes from the installed engine (`tinyloop_py`, `tinyloop`); only the problems
come from the trainer's task generator (tools/train/tasks.py, imported by path):

1. Exact match on the held-out problems (`tasks.heldout_set`) at each L: the prompt encoded
   with the model's own tokenizer, greedy generation through `tl.Engine` (all problems of a
   depth submitted together, so they share forward steps), stopped at the newline or after
   len(answer) + 1 tokens; the completion is right when its text is the answer followed by
   the newline that ends it (`exact_match`). For addition, also split by the longest carry
   chain of each problem.
2. Held-out English perplexity at each L: the last --tail-fraction of each --corpus file,
   as `tinyloop perplexity --tail-fraction 0.05` computes it (python/tinyloop/perplexity.py).
3. Early exit at --exit-loops (default: the model's default_loops): for each setting of
   --early-exit, exact match and mean loops per answer token on the same problems, and the
   loops each answer token of one --example problem stopped at (docs/loop-depth.md,
   "Early exit").

Writes three PNGs to --out-dir (depth-accuracy.png, depth-perplexity.png,
depth-early-exit.png), all numbers to --json, and prints markdown tables for
docs/bundled-model.md. Progress bars go to stderr.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import importlib.util
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models", "tinyloop-demo.tinyloop")
DEFAULT_CORPUS = os.path.join(ROOT, "..", "shared", "data", "corpus", "*.txt")

# The keys of an --early-exit setting -> the engine's early_exit_* kwargs (docs/loop-depth.md).
EXIT_KEYS = {"patience": "early_exit_patience", "tau": "early_exit_tau", "min_L": "early_exit_min_L",
             "peek_every": "early_exit_peek_every", "margin": "early_exit_logit_margin"}
DEFAULT_EXIT_SETTINGS = ("patience=1,tau=0.05", "patience=1,tau=0.01", "patience=2,tau=0.001",
                         "patience=1,margin=3")
PNG_NAMES = {"accuracy": "depth-accuracy.png", "perplexity": "depth-perplexity.png",
             "early_exit": "depth-early-exit.png"}


# ----------------------------------------------------------------------------- inputs

def load_tasks():
    """tools/train/tasks.py as a module (it needs only numpy; the trainer's JAX is not
    imported)."""
    path = os.path.join(ROOT, "tools", "train", "tasks.py")
    spec = importlib.util.spec_from_file_location("depth_report_tasks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_depths(text: str) -> list[int]:
    try:
        depths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--depths: expected comma-separated integers, got {text!r}") from None
    if not depths or min(depths) < 1:
        raise ValueError(f"--depths: every depth must be >= 1, got {text!r}")
    return depths


def parse_exit_setting(text: str) -> dict:
    """'patience=1,tau=0.05' -> {'early_exit_patience': 1, 'early_exit_tau': 0.05}."""
    kwargs = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or key not in EXIT_KEYS:
            raise ValueError(f"--early-exit {text!r}: expected key=value pairs with keys "
                             f"{', '.join(EXIT_KEYS)}, got {part.strip()!r}")
        kwarg = EXIT_KEYS[key]
        try:
            kwargs[kwarg] = float(value) if key in ("tau", "margin") else int(value)
        except ValueError:
            raise ValueError(f"--early-exit {text!r}: {key} must be a number, got {value!r}") from None
    if kwargs.get("early_exit_patience", 0) < 1:
        raise ValueError(f"--early-exit {text!r}: needs patience >= 1 (patience 0 turns early exit off)")
    return kwargs


def corpus_files(patterns: list[str]) -> list[str]:
    """The corpus files in name order (the order of docs/bundled-model.md's held-out stream)."""
    files = sorted({f for p in patterns for f in glob.glob(p)})
    if not files:
        raise FileNotFoundError(f"--corpus: no file matches {patterns}")
    return files


def longest_carry_chain(prompt: str) -> int:
    """The longest run of consecutive carries of an addition prompt `a+b=` (0: no carry);
    zero-padded operands read the same as unpadded ones."""
    a, b = (int(x) for x in prompt.rstrip("=").split("+"))
    best = run = carry = 0
    while a or b:
        carry = int(a % 10 + b % 10 + carry >= 10)
        run = run + 1 if carry else 0
        best = max(best, run)
        a, b = a // 10, b // 10
    return best


def pick_example(problems: list[tuple[str, str]], chains: list[int] | None, choice: str | None) -> int:
    """Index of the problem whose per-token loops are drawn: --example as an index or a
    held-out prompt; by default the first problem with the longest carry chain of the set."""
    if choice is None:
        return chains.index(max(chains)) if chains else 0
    prompts = [p for p, _ in problems]
    if choice in prompts:
        return prompts.index(choice)
    try:
        index = int(choice)
    except ValueError:
        raise ValueError(f"--example {choice!r}: neither an index nor one of the {len(problems)} "
                         f"held-out prompts (e.g. {prompts[0]!r})") from None
    if not 0 <= index < len(problems):
        raise ValueError(f"--example {index}: out of range for {len(problems)} held-out problems")
    return index


# ----------------------------------------------------------------------------- scoring

def exact_match(completion: str, answer: str) -> bool:
    """The greedy completion is exactly the answer followed by the newline that ends it, as
    the trainer scores it (tools/train/tasks.py eval_arrays: every answer character and the
    newline). A shorter or longer answer, junk after it, or no newline is wrong."""
    return completion.split("\n", 1)[0] == answer and "\n" in completion


def token_label(tokenizer, token_id: int) -> str:
    """A token's text for an axis label: whitespace made visible, special tokens by name."""
    text = tokenizer.decode([token_id])
    if not text:
        text = tokenizer.id_to_token(token_id) or f"<{token_id}>"
    return text.replace("\n", "\\n").replace(" ", "\u2423")


class TaskRunner:
    """Greedy answers of the held-out problems through one tl.Engine."""

    def __init__(self, engine, tokenizer, problems: list[tuple[str, str]], window: int):
        import tinyloop_py as tl

        self.tl, self.engine, self.tokenizer, self.window = tl, engine, tokenizer, window
        self.problems = problems
        self.prompt_ids = [tokenizer.encode(p).ids for p, _ in problems]
        for (p, _), ids in zip(problems, self.prompt_ids):
            if not ids:
                raise ValueError(f"prompt {p!r} encodes to no tokens")
        newline = tokenizer.encode("\n").ids
        # A tokenizer that merges "\n" with something else stops on max_tokens instead.
        self.stop = [newline] if len(newline) == 1 else None

    def run(self, desc: str, **kwargs) -> list[dict]:
        """Each problem's {'text', 'tokens', 'loops', 'correct'}; kwargs go to
        SamplingParams (loops, early_exit_*)."""
        from tqdm import tqdm

        params = {}
        results = [None] * len(self.problems)
        bar = tqdm(total=len(self.problems), desc=desc, unit="problem", file=sys.stderr, leave=False)
        # A window of requests in flight: the engine batches them, the queue stays bounded.
        for lo in range(0, len(self.problems), self.window):
            handles = []
            for i in range(lo, min(lo + self.window, len(self.problems))):
                n_max = len(self.problems[i][1]) + 1
                if n_max not in params:
                    params[n_max] = self.tl.SamplingParams(max_tokens=n_max, temperature=0.0,
                                                           stop_sequences=self.stop, **kwargs)
                handles.append((i, self.engine.submit(self.prompt_ids[i], params[n_max])))
            for i, handle in handles:
                out = handle.result()
                text = self.tokenizer.decode(out.tokens)
                results[i] = {"text": text, "tokens": list(out.tokens), "loops": list(out.loops_per_token),
                              "correct": exact_match(text, self.problems[i][1])}
                bar.update(1)
        bar.close()
        return results


def accuracy(results: list[dict], select=None) -> float:
    picked = [r for i, r in enumerate(results) if select is None or select[i]]
    return sum(r["correct"] for r in picked) / len(picked) if picked else float("nan")


def mean_loops(results: list[dict], decode_only: bool) -> float:
    """Mean loops per answer token; decode_only drops each answer's first token, which the
    prompt's prefill chooses at full depth (docs/loop-depth.md, "Reported depth")."""
    loops = [x for r in results for x in (r["loops"][1:] if decode_only else r["loops"])]
    return sum(loops) / len(loops) if loops else float("nan")


# ----------------------------------------------------------------------------- pictures

def figure_title(what: str, meta: dict) -> str:
    return f"{what}\n{os.path.basename(meta['model'])}, {meta['date']} (TinyLoop engine)"


def plot_accuracy(path: str, report: dict) -> None:
    import matplotlib.pyplot as plt

    depths = report["depths"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(depths, [100 * report["accuracy"][str(L)] for L in depths], "o-", label="all problems")
    for chain, row in report.get("accuracy_by_carry_chain", {}).items():
        ax.plot(depths, [100 * row["accuracy"][str(L)] for L in depths], ".--", alpha=0.6,
                label=f"longest carry chain {chain} (n={row['n']})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(depths, [str(L) for L in depths])
    ax.set_ylim(-2, 102)
    ax.set_xlabel("loops L")
    ax.set_ylabel("exact match (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    task = report["task"]
    ax.set_title(figure_title(f"{task['name']} ({task['format']}, size {task['size']}, carry bias "
                              f"{task['carry_bias']}): "
                              f"exact match on {task['n']} held-out problems", report), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_perplexity(path: str, report: dict) -> None:
    import matplotlib.pyplot as plt

    depths = report["depths"]
    ppl = report["perplexity"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(depths, [ppl["by_loops"][str(L)] for L in depths], "o-")
    ax.set_xscale("log", base=2)
    ax.set_xticks(depths, [str(L) for L in depths])
    ax.set_xlabel("loops L")
    ax.set_ylabel("perplexity (per token)")
    ax.grid(alpha=0.3)
    ax.set_title(figure_title(f"held-out English: {ppl['windows']} windows x {ppl['ctx']} tokens", report),
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_example(path: str, report: dict) -> None:
    """One row of bars per early-exit setting: the loops each answer token of the example
    stopped at (its text under the bar), the full depth as a line."""
    import matplotlib.pyplot as plt

    ex = report["example"]
    runs = ex["runs"]
    L = report["early_exit"]["loops"]
    fig, axes = plt.subplots(len(runs), 1, figsize=(6.4, 1.0 + 1.5 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs):
        x = range(len(run["loops"]))
        ax.bar(x, run["loops"], color="tab:green" if run["correct"] else "tab:red")
        ax.axhline(L, color="black", linestyle="--", linewidth=1)
        ax.set_xticks(list(x), run["token_labels"])
        ax.set_ylim(0, L * 1.15)
        ax.set_ylabel("loops")
        mark = "right" if run["correct"] else "wrong"
        ax.set_title(f"{run['setting']}: {ex['prompt']}{run['text'].rstrip()} ({mark})", fontsize=8)
    axes[-1, 0].set_xlabel("answer token (the first is chosen by the prompt's prefill, always at L)")
    fig.suptitle(figure_title(f"early exit at L = {L}, per answer token (dashed: L); "
                              f"answer {ex['answer']}", report), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- tables

def markdown_tables(report: dict) -> str:
    depths = report["depths"]
    head = "| " + " | ".join(f"L={L}" for L in depths) + " |"
    rule = "| " + " | ".join("---:" for _ in depths) + " |"
    lines = [f"Exact match (%), {report['task']['n']} held-out problems (engine, greedy):", "",
             "| problems | n " + head, "| --- | ---: " + rule]
    lines.append(f"| all | {report['task']['n']} | "
                 + " | ".join(f"{100 * report['accuracy'][str(L)]:.1f}" for L in depths) + " |")
    for chain, row in report.get("accuracy_by_carry_chain", {}).items():
        lines.append(f"| longest carry chain {chain} | {row['n']} | "
                     + " | ".join(f"{100 * row['accuracy'][str(L)]:.1f}" for L in depths) + " |")
    ppl = report["perplexity"]
    lines += ["", f"Held-out English perplexity ({ppl['windows']} windows x {ppl['ctx']} tokens):", "",
              head, rule, "| " + " | ".join(f"{ppl['by_loops'][str(L)]:.2f}" for L in depths) + " |"]
    ee = report["early_exit"]
    lines += ["", f"Early exit at L = {ee['loops']} (mean loops per answer token; 'decode' leaves out "
              "the first, chosen by the prefill at full depth):", "",
              "| setting | exact match (%) | mean loops | mean loops (decode) |",
              "| --- | ---: | ---: | ---: |"]
    for row in ee["settings"]:
        lines.append(f"| {row['setting']} | {100 * row['accuracy']:.1f} | {row['mean_loops']:.2f} | "
                     f"{row['mean_decode_loops']:.2f} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the report

def run_task(model, tokenizer, problems, depths: list[int], exit_loops: int, exit_settings, batch: int):
    """({L: results} at each depth, [(setting, kwargs, results)] of the early-exit sweep, its
    first row the same depth without early exit)."""
    import tinyloop_py as tl

    engine = tl.Engine(model, max_num_seqs=batch, max_batch_tokens=max(512, 16 * batch), prefix_caching=False)
    try:
        runner = TaskRunner(engine, tokenizer, problems, window=4 * batch)
        by_depth = {L: runner.run(f"exact match L={L}", loops=L) for L in depths}
        full = by_depth[exit_loops] if exit_loops in by_depth else \
            runner.run(f"exact match L={exit_loops}", loops=exit_loops)
        sweep = [("off", {}, full)] + [(s, kw, runner.run(f"early exit {s}", loops=exit_loops, **kw))
                                       for s, kw in exit_settings]
    finally:
        engine.close()
    return by_depth, sweep


def run_perplexity(model, tokenizer, files: list[str], depths: list[int], args) -> dict:
    """Held-out perplexity per L, as `tinyloop perplexity` computes it."""
    from tinyloop.perplexity import perplexities, read_slice, token_stream, window_starts

    eos = model.config()["eos_ids"]
    stream = token_stream(tokenizer, [read_slice(f, args.tail_fraction) for f in files],
                          eos[0] if eos else None)  # [N] token ids
    ppl = perplexities(model, stream, depths, args.ctx, args.max_windows, progress=True)
    return {"files": [os.path.basename(f) for f in files], "tail_fraction": args.tail_fraction,
            "ctx": args.ctx, "windows": len(window_starts(len(stream), args.ctx, args.max_windows)),
            "tokens": int(len(stream)), "by_loops": {str(L): p for L, p in ppl.items()}}


def example_runs(tokenizer, sweep, index: int) -> list[dict]:
    """The example problem's answer under each early-exit setting (the 'off' row left out)."""
    return [{"setting": s, "text": r[index]["text"], "tokens": r[index]["tokens"],
             "token_labels": [token_label(tokenizer, t) for t in r[index]["tokens"]],
             "loops": r[index]["loops"], "correct": r[index]["correct"]} for s, _, r in sweep[1:]]


def build_report(args) -> dict:
    """Every number of the report, as the JSON stores it."""
    import tinyloop_py as tl
    from tinyloop.text import load_tokenizer

    depths = parse_depths(args.depths)
    exit_settings = [(s, parse_exit_setting(s)) for s in (args.early_exit or DEFAULT_EXIT_SETTINGS)]
    if args.n < 1:
        raise ValueError(f"--n must be >= 1, got {args.n}")
    if not os.path.isfile(args.model):
        raise FileNotFoundError(f"--model: no such file {args.model!r}")
    files = corpus_files(args.corpus or [DEFAULT_CORPUS])

    tasks = load_tasks()
    tasks.set_format(args.task_format, args.carry_bias)
    problems = tasks.heldout_set(args.task, args.n, args.task_size, args.task_min_size or None)
    chains = [longest_carry_chain(p) for p, _ in problems] if args.task == "add" else None
    example = pick_example(problems, chains, args.example)

    with tl.Model(args.model) as model:
        tokenizer = load_tokenizer(model)
        if tokenizer is None:
            raise ValueError(f"--model {args.model!r}: the file has no embedded tokenizer")
        config = model.config()
        exit_loops = args.exit_loops or config["default_loops"]
        if not 2 <= args.ctx <= config["max_seq_len"]:
            raise ValueError(f"--ctx must be in [2, {config['max_seq_len']}] (the model's max_seq_len), "
                             f"got {args.ctx}")
        by_depth, sweep = run_task(model, tokenizer, problems, depths, exit_loops, exit_settings, args.batch)
        perplexity = run_perplexity(model, tokenizer, files, depths, args)
        runs = example_runs(tokenizer, sweep, example)

    report = {"model": os.path.relpath(os.path.abspath(args.model), ROOT),
              "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
              "depths": depths,
              "task": {"name": args.task, "format": args.task_format, "carry_bias": args.carry_bias,
                       "size": args.task_size, "min_size": args.task_min_size or None, "n": len(problems)},
              "accuracy": {str(L): accuracy(r) for L, r in by_depth.items()}}
    if chains is not None:
        report["accuracy_by_carry_chain"] = {
            str(c): {"n": chains.count(c),
                     "accuracy": {str(L): accuracy(r, [x == c for x in chains]) for L, r in by_depth.items()}}
            for c in sorted(set(chains))}
    report["perplexity"] = perplexity
    report["early_exit"] = {"loops": exit_loops, "settings": [
        {"setting": s, "kwargs": kw, "accuracy": accuracy(r), "mean_loops": mean_loops(r, False),
         "mean_decode_loops": mean_loops(r, True)} for s, kw, r in sweep]}
    prompt, answer = problems[example]
    report["example"] = {"index": example, "prompt": prompt, "answer": answer,
                         "longest_carry_chain": chains[example] if chains else None, "runs": runs}
    return report


def write_outputs(report: dict, out_dir: str, json_path: str | None) -> dict[str, str]:
    """The three PNGs (Agg backend: no display needed) and the JSON; returns {picture: path}."""
    import matplotlib

    matplotlib.use("Agg")
    os.makedirs(out_dir, exist_ok=True)
    paths = {k: os.path.join(out_dir, name) for k, name in PNG_NAMES.items()}
    plot_accuracy(paths["accuracy"], report)
    plot_perplexity(paths["perplexity"], report)
    plot_example(paths["early_exit"], report)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    return paths


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL, help="a .tinyloop file with an embedded tokenizer")
    task = ap.add_argument_group("task (tools/train/tasks.py)")
    task.add_argument("--task", default="add", choices=("add", "chain"))
    task.add_argument("--task-format", default="pad", help="add only: plain, pad, rev, padrev")
    task.add_argument("--carry-bias", type=float, default=0.5,
                      help="add only: chance of a carry-propagating digit pair")
    task.add_argument("--task-size", type=int, default=4, help="digits per operand (add), variables (chain)")
    task.add_argument("--task-min-size", type=int, default=0, help="0: the generator's default")
    task.add_argument("--n", type=int, default=1000, help="held-out problems")
    ap.add_argument("--depths", default="1,2,4,8,16,32", help="loop counts L for accuracy and perplexity")
    ppl = ap.add_argument_group("perplexity (as tinyloop perplexity)")
    ppl.add_argument("--corpus", nargs="+", default=None,
                     help=f"text files or globs (default {os.path.relpath(DEFAULT_CORPUS, ROOT)})")
    ppl.add_argument("--tail-fraction", type=float, default=0.05, help="the held-out last part of each file")
    ppl.add_argument("--ctx", type=int, default=256, help="tokens per window")
    ppl.add_argument("--max-windows", type=int, default=64, help="windows spread over the stream")
    ee = ap.add_argument_group("early exit (docs/loop-depth.md)")
    ee.add_argument("--exit-loops", type=int, default=0, help="L of the sweep; 0: the model's default_loops")
    ee.add_argument("--early-exit", action="append", metavar="SETTING",
                    help="a setting of the sweep, repeatable: key=value pairs of "
                         f"{', '.join(EXIT_KEYS)} (default: {'; '.join(DEFAULT_EXIT_SETTINGS)})")
    ee.add_argument("--example", default=None,
                    help="the problem whose per-token loops are drawn: an index or a held-out prompt "
                         "(default: the first with the longest carry chain)")
    ap.add_argument("--batch", type=int, default=64, help="requests the engine runs at once")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "docs", "images"), help="where the PNGs go")
    ap.add_argument("--json", default=None, help="write every number here")
    args = ap.parse_args(argv)
    if args.batch < 1:
        ap.error(f"--batch must be >= 1, got {args.batch}")
    if args.tail_fraction is not None and not 0 < args.tail_fraction <= 1:
        ap.error(f"--tail-fraction must be in (0, 1], got {args.tail_fraction}")
    if args.max_windows < 1:
        ap.error(f"--max-windows must be >= 1, got {args.max_windows}")
    if args.exit_loops < 0:
        ap.error(f"--exit-loops must be >= 0, got {args.exit_loops}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    report = build_report(args)
    paths = write_outputs(report, args.out_dir, args.json)
    print(markdown_tables(report))
    print()
    for path in paths.values():
        print(f"wrote {os.path.relpath(path)}")
    if args.json:
        print(f"wrote {os.path.relpath(args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
