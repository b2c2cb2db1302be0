"""One Model used from several Python threads at once: each gets the answer it gets alone,
and the GIL is released during compute (threads overlap)."""
import threading
import time

import numpy as np

import tinyloop_py as tl


def test_threads_get_the_same_answers_as_alone(test_models):
    m = test_models["huginn"]
    prompts = [np.array([3 + i, 7, 11 + 2 * i, 5], dtype=np.int32) for i in range(6)]
    with tl.Model(m.path) as model:
        alone = [model.generate(p, max_tokens=24, loops=3, temperature=0.9, top_k=20, seed=i,
                                stop_at_eos=False) for i, p in enumerate(prompts)]
        scores_alone = [model.score(p, loops=2) for p in prompts]
        results = [None] * len(prompts)
        scores = [None] * len(prompts)

        def work(i):
            results[i] = model.generate(prompts[i], max_tokens=24, loops=3, temperature=0.9, top_k=20,
                                        seed=i, stop_at_eos=False)
            scores[i] = model.score(prompts[i], loops=2)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == alone
    for a, b in zip(scores, scores_alone):
        np.testing.assert_array_equal(a, b)


def test_gil_is_released_during_generate(test_models):
    """A pure-Python counter thread advances while generate computes.

    Held for the whole call, the GIL would let the counter move only before or after it:
    the count taken just before and just after the call would be equal. The call is made
    long enough (doubling max_tokens until it takes 0.2 s) that a released GIL gives the
    counter time slices on any machine, fast or loaded, so nothing depends on how fast
    generate is."""
    m = test_models["huginn"]
    with tl.Model(m.path, max_seq_len=4100) as model:
        ticks = 0
        stop = threading.Event()

        def spin():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                time.sleep(0.0005)

        t = threading.Thread(target=spin)
        t.start()
        try:
            n = 100
            while True:
                before = ticks
                t0 = time.perf_counter()
                model.generate(np.array([1, 2, 3], dtype=np.int32), max_tokens=n, loops=8, stop_at_eos=False)
                elapsed, during = time.perf_counter() - t0, ticks - before
                if elapsed >= 0.2 or n >= 4000:
                    break
                n *= 2
        finally:
            stop.set()
            t.join()
    assert elapsed >= 0.05, f"generate of {n} tokens took only {elapsed:.3f} s"
    assert during >= 2, f"counter advanced {during} times in a {elapsed:.3f} s call: GIL held"


def test_close_while_another_thread_generates(test_models):
    m = test_models["huginn"]
    model = tl.Model(m.path, max_seq_len=400)
    out = {}

    def work():
        out["tokens"] = model.generate(np.array([1, 2, 3], dtype=np.int32), max_tokens=300, loops=4,
                                       stop_at_eos=False)

    t = threading.Thread(target=work)
    t.start()
    time.sleep(0.05)
    model.close()  # the running call keeps its engine alive and finishes normally
    t.join()
    assert len(out["tokens"]) == 303
