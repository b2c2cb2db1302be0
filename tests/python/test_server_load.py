"""bench/server_load.py: its stream checks catch lost or garbled output (synthetic streams,
no server), and its --smoke run (concurrent streams against `tinyloop serve` on the bundled
model) passes: every stream whole, ending with [DONE], same prompt -> same greedy text."""
import json
import os
import subprocess
import sys

import pytest

_REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(_REPO, "bench"))

import server_load as sl  # noqa: E402


def _chunk(text=None, finish=None, loops=None, index=0, cid="cmpl-1", usage=None, choices=True):
    ch = {"index": index, "text": text or "", "finish_reason": finish}
    if loops is not None:
        ch["tinyloop"] = {"loops": loops}
    return json.dumps({"id": cid, "object": "text_completion",
                       "choices": [ch] if choices else [], **({"usage": usage} if usage else {})})


def _good(n=3):
    events = [_chunk(f" w{i}", loops=[6]) for i in range(n)]
    events.append(_chunk("", finish="length", loops=[]))
    events.append(_chunk(choices=False, usage={"completion_tokens": n, "prompt_tokens": 4}))
    return events + ["[DONE]"]


def _check(events, max_tokens=3):
    checker = sl.StreamChecker(sl.StreamResult(prompt_key=0), t_sent=0.0, max_tokens=max_tokens)
    for i, e in enumerate(events):
        checker.feed(e, now=0.1 * (i + 1))
    return checker.finish()


def test_a_whole_stream_passes():
    r = _check(_good())
    assert r.ok, r.errors
    assert r.text == " w0 w1 w2" and r.tokens == 3 and r.finish_reason == "length"
    assert r.ttft_s == pytest.approx(0.1) and r.tbt_s == pytest.approx([0.1, 0.1])
    assert r.loops == [6, 6, 6]


@pytest.mark.parametrize("mutate, expect", [
    (lambda ev: ev[:-1], "without data: [DONE]"),
    (lambda ev: ev + [_chunk("late")], "event after [DONE]"),
    (lambda ev: [ev[0][:-5]] + ev[1:], "not JSON"),
    (lambda ev: [_chunk(" w0", loops=[6], cid="other")] + ev[1:], "different completion ids"),
    (lambda ev: [_chunk(" w0", loops=[6], index=1)] + ev[1:], "choice index 1"),
    (lambda ev: ev[:3] + [_chunk("", finish="stop")] + ev[3:], "a second finish_reason"),
    (lambda ev: ev[:4] + [_chunk(" more")] + ev[4:], "text after the finish_reason"),
    (lambda ev: [_chunk("", finish="stop"), "[DONE]"], "empty completion text"),
    (lambda ev: [_chunk(" w0", loops=[6, 6])] + ev[1:], "tinyloop.loops gave 4"),
    (lambda ev: ev[:3] + [_chunk("", finish=None)] + ev[4:], "no finish_reason"),
    (lambda ev: [json.dumps({"error": {"message": "boom"}})] + ev, "error event"),
])
def test_a_broken_stream_fails(mutate, expect):
    r = _check(mutate(_good()))
    assert not r.ok
    assert any(expect in e for e in r.errors), r.errors


def test_length_finish_needs_max_tokens():
    r = _check(_good(), max_tokens=5)  # "length" after 3 of 5 tokens
    assert any("finish_reason length after 3 of 5" in e for e in r.errors), r.errors


def test_nearest_rank_percentiles():
    assert sl.pct([3, 1], 0.5) == 1 and sl.pct(list(range(1, 101)), 0.99) == 99
    assert sl.pct([7], 0.99) == 7 and sl.pct([], 0.5) != sl.pct([], 0.5)  # NaN


def test_sse_parser_joins_data_lines_and_skips_comments():
    p = sl.SseParser()
    got = [p.push(line) for line in [": ping", "data: a", "data:b", "", "event: x", "", "data: [DONE]"]]
    assert [g for g in got if g is not None] == ["a\nb"]
    assert p.flush() == "[DONE]"


def test_summary_flags_different_greedy_texts_for_one_prompt():
    results = []
    for text in ("same", "same", "other"):
        r = _check([_chunk(text, finish="stop"), "[DONE]"])
        results.append(r)
    load = sl.Load(clients=3, requests=1, max_tokens=3, prompts=["p"])
    s = sl.summarize(results, wall=1.0, load=load)
    assert s["ok"] == 3 and any("2 different greedy completions" in p for p in s["problems"])
    s = sl.summarize(results[:2] + [None], wall=1.0, load=load, timed_out=True)
    assert s["failed"] == 1 and any("unfinished" in p for p in s["problems"])


def test_smoke_run_against_tinyloop_serve():
    """The --smoke mode as a user runs it: 4 clients x 2 streaming requests, two prompts."""
    proc = subprocess.run([sys.executable, os.path.join(_REPO, "bench", "server_load.py"), "--smoke"],
                          capture_output=True, text=True, timeout=90, cwd=_REPO)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "smoke: 8/8 streams whole" in out, out
