"""lm-evaluation-harness scores the bundled model through `tinyloop serve`, and gets what
the engine gives directly.

Two tasks built from local files (lm_eval's hub datasets can't be downloaded here), 300
items from the held-out end of the shared corpus's World English Bible (one sentence a
line):
- `tinyloop_lastword` (multiple choice, loglikelihood): the sentence without its last word,
  then that word or one of three last words of other sentences;
- `tinyloop_continue` (generate_until): the same contexts, greedy, up to 8 tokens or a
  newline / full stop.

lm_eval's `local-completions` backend tokenizes through the server (`/tokenize`,
`/detokenize`, `/tokenizer_info`: tokenizer_backend=remote), scores with `echo` + `logprobs`
and `max_tokens: 0` on /v1/completions, and generates with `stop`. The test checks every
logged sample against an independent computation: each choice's loglikelihood from
Model.score (float64 log-softmax over the continuation's tokens) and each generation from
Model.generate, and the accuracy lm_eval reports against the one recomputed from those.
"""
from __future__ import annotations

import glob
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

lm_eval = pytest.importorskip("lm_eval", reason="scripts/test-oracles.sh installs lm_eval[api]")

import tinyloop_py as tl  # noqa: E402
from server_helpers import BUNDLED, ROOT, serve_subprocess  # noqa: E402
from tinyloop.text import load_tokenizer  # noqa: E402

CORPUS = os.path.join(ROOT, "..", "shared", "data", "corpus", "web_bible.txt")
N_ITEMS = 300
LOOPS = None  # the model's default depth, as the server uses it


def _items():
    with open(CORPUS, encoding="utf-8") as f:
        lines = [ln.strip() for ln in f if ln.strip()]
    tail = lines[-6000:]  # the held-out end (the bundled model trained on the first 95%)
    rng = random.Random(14)
    sents = [s for s in tail if 8 <= len(s.split()) <= 24 and s.endswith(".") and s.split()[-1][:-1].isalpha()]
    rng.shuffle(sents)
    sents = sents[:N_ITEMS]
    last = [s.split()[-1][:-1] for s in sents]
    items = []
    for i, s in enumerate(sents):
        words = s.split()
        context = " ".join(words[:-1])
        others = sorted({w for w in last if w != last[i]})
        choices = rng.sample(others, 3) + [last[i]]
        rng.shuffle(choices)
        items.append({"context": context, "choices": choices, "answer": choices.index(last[i]), "target": last[i]})
    return items


TASKS = """\
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
doc_to_text: "{{{{context}}}}"
target_delimiter: " "
"""


def _write_tasks(d, data):
    with open(os.path.join(d, "lastword.yaml"), "w") as f:
        f.write(TASKS.format(name="tinyloop_lastword", data=data))
        f.write('output_type: multiple_choice\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{answer}}"\n'
                "metric_list:\n  - metric: acc\n")
    with open(os.path.join(d, "continue.yaml"), "w") as f:
        f.write(TASKS.format(name="tinyloop_continue", data=data))
        f.write('output_type: generate_until\ndoc_to_target: "{{target}}"\n'
                'generation_kwargs:\n  until: ["\\n", "."]\n  max_gen_toks: 8\n  do_sample: false\n'
                "metric_list:\n  - metric: exact_match\n")


def _log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def test_lm_eval_local_completions_through_the_server(tmp_path):
    items = _items()
    assert len(items) == N_ITEMS
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(it) + "\n" for it in items))
    _write_tasks(tmp_path, str(data))
    out = tmp_path / "out"
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    with serve_subprocess("--model-name", "tinyloop-demo") as (proc, url):
        args = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
                f"model=tinyloop-demo,base_url={url}/v1/completions,tokenizer_backend=remote,"
                "tokenized_requests=True,num_concurrent=4,max_retries=1,timeout=300",
                "--tasks", "tinyloop_lastword,tinyloop_continue", "--include_path", str(tmp_path),
                "--output_path", str(out), "--log_samples", "--batch_size", "1"]
        run = subprocess.run(args, env=env, capture_output=True, text=True, timeout=1800)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    results = json.load(open(glob.glob(str(out / "**" / "results_*.json"), recursive=True)[0]))
    samples = {}
    for task in ("tinyloop_lastword", "tinyloop_continue"):
        path = glob.glob(str(out / "**" / f"samples_{task}_*.jsonl"), recursive=True)[0]
        samples[task] = [json.loads(ln) for ln in open(path)]
        assert len(samples[task]) == N_ITEMS

    with tl.Model(BUNDLED) as model:
        tok = load_tokenizer(model)
        correct = 0
        for s in samples["tinyloop_lastword"]:
            doc = s["doc"]
            ctx = tok.encode(doc["context"]).ids
            got = [float(r[0][0]) for r in s["resps"]]  # lm_eval's loglikelihood per choice
            want = []
            for choice in doc["choices"]:
                cont = tok.encode(doc["context"] + " " + choice).ids[len(ctx):]
                ids = ctx + cont
                lp = _log_softmax(model.score(ids, loops=LOOPS))
                want.append(float(sum(lp[len(ctx) - 1 + j, t] for j, t in enumerate(cont))))
            assert got == pytest.approx(want, abs=2e-3), doc
            correct += int(np.argmax(want)) == doc["answer"]
        acc = results["results"]["tinyloop_lastword"]["acc,none"]
        assert acc == pytest.approx(correct / N_ITEMS)
        assert acc > 0.25 + 0.05, acc  # chance is 1 in 4

        for s in samples["tinyloop_continue"][:60]:  # generation is slower: a fifth of them
            doc = s["doc"]
            ids = tok.encode(doc["context"]).ids
            new = model.generate(ids, max_tokens=8, loops=LOOPS, stop_at_eos=True)[len(ids):]
            text = tok.decode(new)
            for stop in ("\n", "."):
                text = text.split(stop)[0]
            assert s["resps"][0][0] == text, doc
    print(f"\nlm_eval through tinyloop serve: lastword acc {acc:.3f} over {N_ITEMS} "
          f"(chance 0.25), continue exact_match {results['results']['tinyloop_continue']['exact_match,none']:.3f}")
