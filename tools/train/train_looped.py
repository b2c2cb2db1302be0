#!/usr/bin/env python3
"""Train the small looped (recurrent-depth) demo model of TinyLoop and export a .tinyloop.

JAX on CPU. Randomised loop depth per step (Huginn-style log-normal Poisson, clipped to
[1, --max-depth]) with truncated backprop through the last --backprop-depth iterations.
Optionally a mix of corpus windows and synthetic task rows (tasks.py: multi-digit addition,
variable chains; --task, --task-frac) with a task exact-match eval per loop count.
Everything is seeded: the same command on the same corpus gives the same model.

    python3 tools/train/train_looped.py --out models/tinyloop-demo.tinyloop --steps 850

See tools/train/README.md.
"""
import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

EVAL_DEPTHS = (1, 2, 4, 8, 16)


def log_fn(path):
    f = open(path, "a", buffering=1) if path else None

    def log(msg):
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        if f:
            f.write(line + "\n")
    return log


def make_config(a, eos_id):
    return {
        "dim": a.dim,
        "vocab_size": a.vocab_size,
        "n_heads": a.n_heads,
        "n_kv_heads": a.n_kv_heads or a.n_heads,
        "head_dim": a.dim // a.n_heads,
        "ffn_dim": a.ffn_dim,
        "n_pre_blocks": a.n_pre,
        "n_loop_layers": a.n_loop,
        "n_post_blocks": a.n_post,
        "default_loops": a.mean_depth,
        "max_seq_len": a.context,
        "norm_type": "rmsnorm",
        "norm_eps": 1e-5,
        "norm_placement": "pre",
        "qkv_fused": False,
        "pos_encoding": "rope_half",
        "rope_theta": 10000.0,
        "mlp": "swiglu",
        "embed_scale": 1.0,
        "init_state": a.init_state,
        **({"init_state_std": a.init_std, "init_state_seed": 0} if a.init_state == "random" else {}),
        "inject": a.inject,
        "loop_norm": bool(a.loop_norm),
        "post_loop_norm": a.post_loop_norm,
        "final_norm": True,
        "tie_embeddings": True,
        "bos_id": None,
        "eos_ids": [int(eos_id)],
    }


def sample_depth(rng, mean, max_depth, sigma=0.5, dist="lognormal"):
    """lognormal (default), Huginn's log-normal Poisson: tau ~ N(log(mean-1) - sigma^2/2,
    sigma), L = 1 + Poisson(exp(tau)), clipped to [1, max_depth]; E[L] = mean before clipping.
    fixed: L = mean. uniform: L uniform in [1, max_depth]."""
    if dist == "fixed":
        return int(mean)
    if dist == "uniform":
        return int(rng.integers(1, max_depth + 1))
    tau = rng.normal(math.log(mean - 1.0) - 0.5 * sigma * sigma, sigma)
    return int(min(max(1 + rng.poisson(math.exp(tau)), 1), max_depth))


def task_size_at(a, step):
    """--curriculum-steps > 0: the task size (max digits / max variables) grows linearly from
    --task-min-size to --task-size over that many steps; otherwise it is --task-size."""
    if a.curriculum_steps <= 0 or step >= a.curriculum_steps:
        return a.task_size
    lo = a.task_min_size or 1
    return min(a.task_size, lo + (a.task_size - lo + 1) * step // a.curriculum_steps)


def step_batch(a, step, train_ids, cmap):
    """Everything random about a step comes from (seed, step): resumable and reproducible.
    Returns L, ids [B, T], targets [B, T], mask [B, T] (None without tasks). The first
    B - n_task rows are corpus windows, the rest packed task rows (tasks.task_row)."""
    B, T = a.batch, a.context
    rng = np.random.default_rng([a.seed, step])
    L = sample_depth(rng, a.mean_depth, a.max_depth, dist=a.depth_dist)
    n_task = int(round(a.task_frac * B)) if a.tasks else 0
    rows_x, rows_y, rows_m = [], [], []
    if B - n_task:
        starts = rng.integers(0, len(train_ids) - T - 1, size=B - n_task)
        idx = starts[:, None] + np.arange(T + 1)[None, :]
        w = train_ids[idx]
        if not n_task:
            return L, w[:, :-1], w[:, 1:], None
        rows_x.append(w[:, :-1])
        rows_y.append(w[:, 1:])
        rows_m.append(np.ones((B - n_task, T), np.float32))
    import tasks as TK
    size = task_size_at(a, step)
    for i in range(n_task):
        t = a.tasks[int(rng.integers(0, len(a.tasks)))] if len(a.tasks) > 1 else a.tasks[0]
        x, y, m = TK.task_row(rng, t, size, cmap, T, a.task_min_size or None)
        if a.task_mask == "all":
            m = np.ones_like(m)
        rows_x.append(x[None])
        rows_y.append(y[None])
        rows_m.append(m[None])
    return L, np.concatenate(rows_x), np.concatenate(rows_y), np.concatenate(rows_m)


def held_windows(held_ids, T, n):
    """n fixed windows of T+1 tokens, evenly spaced over the held-out stream."""
    total = (len(held_ids) - 1) // T
    n = min(n, total)
    pick = np.linspace(0, total - 1, n).round().astype(np.int64)
    idx = pick[:, None] * T + np.arange(T + 1)[None, :]
    w = held_ids[idx]
    return w[:, :-1], w[:, 1:]


def save_ckpt(path, step, params, opt_state, cfg, elapsed):
    import jax
    leaves = jax.tree_util.tree_leaves(opt_state)
    arrs = {f"p/{k}": np.asarray(v) for k, v in params.items()}
    arrs.update({f"o/{i}": np.asarray(v) for i, v in enumerate(leaves)})
    arrs["step"] = np.asarray(step)
    arrs["elapsed"] = np.asarray(elapsed)
    arrs["config"] = np.asarray(json.dumps(cfg))
    tmp = path + ".tmp.npz"
    np.savez(tmp, **arrs)
    os.replace(tmp, path)


def load_ckpt(path, opt_state_template):
    import jax
    import jax.numpy as jnp
    z = np.load(path)
    params = {k[2:]: jnp.asarray(z[k]) for k in z.files if k.startswith("p/")}
    treedef = jax.tree_util.tree_structure(opt_state_template)
    n = treedef.num_leaves
    leaves = [jnp.asarray(z[f"o/{i}"]) for i in range(n)]
    opt_state = jax.tree_util.tree_unflatten(treedef, leaves)
    return int(z["step"]), params, opt_state, float(z["elapsed"]), json.loads(str(z["config"]))


def export_model(path, cfg, params, tok_json, log):
    """Writes the .tinyloop with tinyloop.format.write_model (docs/model-format.md)."""
    sys.path.insert(0, os.path.join(REPO, "python"))
    tensors = {k: np.asarray(v, dtype=np.float32) for k, v in params.items()}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        from tinyloop.format import write_model
        # tinyloop.format imports the engine (tinyloop_py, where the format is declared) at
        # its first use, so a missing engine shows here, not at the import.
        write_model(path, cfg, tensors, tokenizer_json=tok_json, weight_dtype="f16")
    except ImportError as e:
        log(f"WARNING: tinyloop.format or its engine not importable ({e}); using the built-in writer")
        from export_fallback import write_model
        write_model(path, cfg, tensors, tokenizer_json=tok_json, weight_dtype="f16")
    log(f"exported {path} ({os.path.getsize(path) / 1e6:.2f} MB)")


def main(argv=None):
    ap = argparse.ArgumentParser(description="Train the TinyLoop demo looped model (JAX, CPU).")
    ap.add_argument("--out", default=os.path.join(REPO, "models", "tinyloop-demo.tinyloop"),
                    help="the exported model ('' = do not export, e.g. for experiments)")
    ap.add_argument("--corpus", default="/work/shared/data/corpus")
    ap.add_argument("--workdir", default=os.path.join(HERE, ".cache", "run"),
                    help="checkpoints, log file and final params go here")
    ap.add_argument("--steps", type=int, default=850)
    ap.add_argument("--minutes", type=float, default=0.0,
                    help="wall-clock cap for the training loop (0 = none); if hit, training stops "
                         "early and the last step is exported (not reproducible by --steps alone)")
    ap.add_argument("--stop-step", type=int, default=0,
                    help="stop after this step (the LR schedule still follows --steps); reproduces "
                         "a run that --minutes stopped early at that step")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--resume", action="store_true", help="continue from workdir/ckpt.npz")
    ap.add_argument("--export-only", action="store_true",
                    help="export workdir/ckpt.npz (or final.npz) to --out without training")
    # model size
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--n-heads", type=int, default=4)
    ap.add_argument("--n-kv-heads", type=int, default=0)
    ap.add_argument("--ffn-dim", type=int, default=768)
    ap.add_argument("--n-pre", type=int, default=1)
    ap.add_argument("--n-loop", type=int, default=2)
    ap.add_argument("--n-post", type=int, default=1)
    ap.add_argument("--inject", default="linear_concat", choices=["add", "linear_concat"])
    ap.add_argument("--loop-norm", type=int, default=1)
    ap.add_argument("--post-loop-norm", default="none", choices=["none", "own", "final"])
    ap.add_argument("--context", type=int, default=256)
    # schedule
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=0, help="warmup steps (0 = 5%% of --steps)")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--mean-depth", type=int, default=6)
    ap.add_argument("--max-depth", type=int, default=16)
    ap.add_argument("--backprop-depth", type=int, default=4)
    # logging
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-every-min", type=float, default=10.0)
    ap.add_argument("--eval-windows", type=int, default=16)
    ap.add_argument("--final-eval-windows", type=int, default=64)
    ap.add_argument("--final-eval-depths", default="1,2,3,4,6,8,12,16,24")
    ap.add_argument("--ckpt-every-min", type=float, default=5.0)
    # tokenizer, tasks, recipe
    ap.add_argument("--tokenizer", default="bytelevel", choices=["bytelevel", "digits"],
                    help="digits: every digit its own token (needed by --task)")
    ap.add_argument("--task", default="", help="comma list of tasks.py tasks (add, chain); empty = none")
    ap.add_argument("--task-frac", type=float, default=0.0,
                    help="fraction of each batch's rows that are task rows (1.0 = tasks only)")
    ap.add_argument("--task-size", type=int, default=5, help="add: max digits; chain: max variables")
    ap.add_argument("--task-min-size", type=int, default=0, help="add: min digits; chain: min variables")
    ap.add_argument("--curriculum-steps", type=int, default=0,
                    help="grow the task size linearly from --task-min-size to --task-size over these steps")
    ap.add_argument("--task-format", default="plain", choices=["plain", "pad", "rev", "padrev"],
                    help="add: plain, zero-padded operands/answer, answer reversed, or both")
    ap.add_argument("--carry-bias", type=float, default=0.0,
                    help="add: probability of a carry-propagate digit pair (tasks.set_format)")
    ap.add_argument("--task-mask", default="answer", choices=["answer", "all"],
                    help="answer: task rows count only answer tokens in the loss")
    ap.add_argument("--task-eval-n", type=int, default=200, help="held-out problems in periodic evals")
    ap.add_argument("--final-task-eval-n", type=int, default=1000)
    ap.add_argument("--task-eval-depths", default="1,2,4,8,16,32")
    ap.add_argument("--eval-every-steps", type=int, default=0,
                    help="also evaluate every N steps (0 = only every --eval-every-min)")
    ap.add_argument("--init-state", default="zeros", choices=["zeros", "random"])
    ap.add_argument("--init-std", type=float, default=1.0, help="std of the random initial state")
    ap.add_argument("--depth-dist", default="lognormal", choices=["lognormal", "fixed", "uniform"])
    ap.add_argument("--progress", type=int, default=1, help="tqdm progress bar on stderr")
    a = ap.parse_args(argv)
    a.tasks = [t for t in a.task.split(",") if t]
    if a.tasks and a.tokenizer != "digits":
        raise SystemExit("--task needs --tokenizer digits (one token per digit)")

    os.makedirs(a.workdir, exist_ok=True)
    log = log_fn(os.path.join(a.workdir, "train_log.txt"))
    log(f"args: {vars(a)}")

    import data
    use_corpus = not (a.tasks and a.task_frac >= 1.0)
    tok_json, eos_id, train_ids, held_ids = data.get_tokenizer_and_data(
        a.corpus, a.vocab_size, log, kind=a.tokenizer, encode=use_corpus)
    if use_corpus:
        log(f"tokens: train {len(train_ids)}, held-out {len(held_ids)}, eos id {eos_id}")
    cmap, task_sets = None, {}
    if a.tasks:
        import tasks as TK
        from tokenizers import Tokenizer
        TK.set_format(a.task_format, a.carry_bias)
        tok = Tokenizer.from_str(tok_json)
        cmap = TK.charmap(tok)
        TK.check_charmap(tok, cmap, np.random.default_rng(0))
        for t in a.tasks:
            task_sets[t] = TK.heldout_set(t, max(a.final_task_eval_n, a.task_eval_n), a.task_size,
                                          a.task_min_size or None)
            log(f"task {t}: {len(task_sets[t])} held-out problems, e.g. "
                + " ".join(p + ans for p, ans in task_sets[t][:3]))

    import jax
    import jax.numpy as jnp
    import optax

    import model_jax as M

    cfg = make_config(a, eos_id)
    T, B = a.context, a.batch
    warmup = a.warmup or max(1, a.steps // 20)
    sched = optax.warmup_cosine_decay_schedule(0.0, a.lr, warmup, a.steps, a.lr * a.min_lr_frac)

    def decay_mask(p):  # no decay on norms
        return {k: (v.ndim == 2) for k, v in p.items()}

    opt = optax.chain(optax.clip_by_global_norm(a.clip),
                      optax.adamw(sched, b1=0.9, b2=0.95, weight_decay=a.weight_decay,
                                  mask=decay_mask))

    params = M.init_params(cfg, a.seed)
    opt_state = opt.init(params)
    nparams = sum(int(np.prod(v.shape)) for v in params.values())
    log(f"config: {json.dumps(cfg)}")
    log(f"parameters: {nparams} ({nparams / 1e6:.2f} M), jax {jax.__version__} on {jax.devices()}")

    ckpt = os.path.join(a.workdir, "ckpt.npz")
    step, elapsed_before = 0, 0.0
    if a.resume or a.export_only:
        src = ckpt if os.path.exists(ckpt) else os.path.join(a.workdir, "final.npz")
        if os.path.exists(src):
            step, params, opt_state, elapsed_before, ccfg = load_ckpt(src, opt_state)
            if ccfg != cfg:
                raise SystemExit(f"{src} was written with another config:\n{ccfg}\nvs\n{cfg}")
            log(f"resumed from {src} at step {step}")
        elif a.export_only:
            raise SystemExit(f"no checkpoint in {a.workdir}")
    if a.export_only:
        export_model(a.out, cfg, params, tok_json, log)
        return

    train_fns = {}

    def get_train_fn(k):
        if k not in train_fns:
            def step_fn(params, opt_state, ids, tgt, n_ng, mask, key):
                loss, grads = jax.value_and_grad(
                    lambda p: M.train_loss(cfg, p, ids, tgt, n_ng, k, mask, key))(params)
                gnorm = optax.global_norm(grads)
                upd, opt_state = opt.update(grads, opt_state, params)
                return optax.apply_updates(params, upd), opt_state, loss, gnorm
            train_fns[k] = jax.jit(step_fn, donate_argnums=(0, 1))
        return train_fns[k]

    eval_fn = jax.jit(lambda p, ids, tgt, L: M.xent(M.forward(cfg, p, ids, L), tgt))

    def _task_ok(p, ids, tgt, mask, L):
        pred = jnp.argmax(M.forward(cfg, p, ids, L), axis=-1)
        wrong = jnp.sum((pred != tgt) * mask, axis=-1)
        return wrong == 0
    task_ok_fn = jax.jit(_task_ok)
    task_depths = [int(d) for d in a.task_eval_depths.split(",") if d]

    def task_eval(params, n, depths):
        """Exact match (greedy, via teacher forcing: tasks.eval_arrays) on the first n
        held-out problems of each task, per loop count."""
        import tasks as TK
        out = {}
        for t, probs in task_sets.items():
            probs = probs[:n]
            width = max(len(p) + len(ans) + 1 for p, ans in probs)
            xs, ys, ms = TK.eval_arrays(probs, cmap, width)
            chunk = 250
            res = {}
            for L in depths:
                ok = 0
                for i in range(0, len(xs), chunk):
                    ok += int(np.sum(np.asarray(task_ok_fn(params, jnp.asarray(xs[i:i + chunk]),
                                                           jnp.asarray(ys[i:i + chunk]),
                                                           jnp.asarray(ms[i:i + chunk]), L))))
                res[L] = ok / len(xs)
            out[t] = res
        return out

    def fmt_task(tv):
        return "; ".join(f"{t}: " + " ".join(f"L{L}={v * 100:.1f}%" for L, v in r.items())
                         for t, r in tv.items())

    def evaluate(params, n_windows, depths):
        if not use_corpus:
            return {}
        xs, ys = held_windows(held_ids, T, n_windows)
        out = {}
        for L in depths:
            tot = 0.0
            for i in range(0, len(xs), B):
                tot += float(eval_fn(params, jnp.asarray(xs[i:i + B]), jnp.asarray(ys[i:i + B]),
                                     L)) * len(xs[i:i + B])
            out[L] = tot / len(xs)
        return out

    def fmt(ev):
        return " ".join(f"L{L}={v:.4f}" for L, v in ev.items())

    t0 = time.time()
    last_ckpt = last_eval = t0
    tok_seen = 0
    win_loss, win_n, win_t = 0.0, 0, time.time()
    stopped_early = False
    def periodic_eval(step):
        if use_corpus:
            ev = evaluate(params, a.eval_windows, EVAL_DEPTHS)
            log(f"eval step {step} held-out loss: {fmt(ev)}")
        if task_sets:
            log(f"eval step {step} task exact match ({a.task_eval_n} held-out): "
                f"{fmt_task(task_eval(params, a.task_eval_n, task_depths))}")

    if step == 0:
        periodic_eval(0)
    end_step = min(a.steps, a.stop_step) if a.stop_step else a.steps
    bar = None
    if a.progress:
        from tqdm import tqdm
        bar = tqdm(total=end_step, initial=step, unit="step", dynamic_ncols=True, mininterval=5.0,
                   file=sys.stderr)
    base_key = jax.random.PRNGKey(a.seed)
    while step < end_step:
        L, xb, yb, mb = step_batch(a, step, train_ids, cmap)
        k = min(L, a.backprop_depth)
        fn = get_train_fn(k)
        key = jax.random.fold_in(base_key, step) if a.init_state == "random" else None
        params, opt_state, loss, gnorm = fn(params, opt_state, jnp.asarray(xb), jnp.asarray(yb),
                                            jnp.asarray(L - k, jnp.int32),
                                            None if mb is None else jnp.asarray(mb), key)
        step += 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix(L=L, loss=f"{float(loss):.3f}", refresh=False)
        tok_seen += B * T
        win_loss += float(loss)
        win_n += 1
        now = time.time()
        if step % a.log_every == 0 or step == end_step:
            dt = now - win_t
            log(f"step {step}/{a.steps} L={L} loss {win_loss / win_n:.4f} gnorm {float(gnorm):.3f} "
                f"lr {float(sched(step)):.2e} tok/s {win_n * B * T / dt:.0f} "
                f"elapsed {(now - t0 + elapsed_before) / 60:.1f} min")
            win_loss, win_n, win_t = 0.0, 0, time.time()
        if step < end_step and (now - last_eval > a.eval_every_min * 60 or
                                (a.eval_every_steps and step % a.eval_every_steps == 0)):
            periodic_eval(step)
            last_eval = time.time()
        if now - last_ckpt > a.ckpt_every_min * 60:
            save_ckpt(ckpt, step, params, opt_state, cfg, time.time() - t0 + elapsed_before)
            log(f"checkpoint step {step}")
            last_ckpt = time.time()
        if a.minutes and (time.time() - t0 + elapsed_before) > a.minutes * 60 and step < end_step:
            log(f"WARNING: --minutes {a.minutes} reached at step {step}/{a.steps}; stopping early")
            stopped_early = True
            break
    if bar is not None:
        bar.close()
    stopped_early = stopped_early or step < a.steps
    train_time = time.time() - t0 + elapsed_before
    save_ckpt(ckpt, step, params, opt_state, cfg, train_time)
    log(f"training done: step {step}, wall time {train_time / 60:.1f} min"
        + (f" (stopped early at step {step} of a {a.steps}-step schedule; reproduce with "
           f"--steps {a.steps} --stop-step {step})" if stopped_early else ""))
    if a.out:
        export_model(a.out, cfg, params, tok_json, log)
    np.savez(os.path.join(a.workdir, "final_params.npz"), **{k: np.asarray(v) for k, v in params.items()})
    depths = [int(d) for d in a.final_eval_depths.split(",") if d]
    t1 = time.time()
    ev = evaluate(params, a.final_eval_windows, depths)
    nwin = min(a.final_eval_windows, (len(held_ids) - 1) // T) if use_corpus else 0
    if use_corpus:
        log(f"final held-out loss ({nwin} windows x {T} tokens, f32 weights): {fmt(ev)}")
        log("final held-out ppl: " + " ".join(f"L{L}={math.exp(v):.2f}" for L, v in ev.items()))
    tv = task_eval(params, a.final_task_eval_n, task_depths) if task_sets else {}
    if tv:
        log(f"final task exact match ({a.final_task_eval_n} held-out, JAX f32): {fmt_task(tv)}")
    log(f"final eval took {(time.time() - t1) / 60:.1f} min")
    with open(os.path.join(a.workdir, "final_eval.json"), "w") as f:
        json.dump({"steps": step, "train_minutes": train_time / 60, "params": nparams,
                   "held_out_loss": {str(L): v for L, v in ev.items()},
                   "eval_windows": nwin,
                   "task_exact_match": {t: {str(L): v for L, v in r.items()} for t, r in tv.items()},
                   "context": T, "stopped_early": stopped_early}, f, indent=1)


if __name__ == "__main__":
    main()
