"""Property fuzz of the server's request parsing (issue 16's HTTP fuzz): hypothesis builds
request bodies from the fields the API knows (each with values of every JSON type,
out-of-range numbers, huge and negative ones, nested junk), unknown fields, and raw bytes,
and posts them to every POST endpoint of a live `tinyloop serve` app.

Whatever the body, the server must answer with a documented status (200, 400, 404, 408,
413, 422 never: FastAPI's own validation is reshaped to 400) and, for every error, OpenAI's
error shape; a 500 (a bug surfacing as an internal error) or a dropped connection fails the
test, and the server must still answer normally afterwards.

    TINYLOOP_FUZZ_EXAMPLES=5000 python3 -m pytest -q tests/python/test_server_fuzz.py   # longer
"""
from __future__ import annotations

import collections
import json
import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_helpers import server_in_thread

EXAMPLES = int(os.environ.get("TINYLOOP_FUZZ_EXAMPLES", "150"))
PATHS = ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"]
OK = {200, 400, 404, 408, 413, 429}
STATUSES: collections.Counter = collections.Counter()  # what the fuzz reached, checked last

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31, 2**63 - 1, 2**64, 10**30]),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([0.0, -0.5, 1e308, 5e-324, 2.5]),
    st.text(max_size=40), st.sampled_from(["", "hello", "\x00", "\ud7ff", "é" * 10]))
junk = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                    max_leaves=12)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "bogus"]), junk),
     "content": st.one_of(st.text(max_size=30), junk)}), max_size=3)
FIELDS = {
    "model": st.one_of(st.just("tinyloop-demo"), st.just("tinyloop-demo"), st.just("other"), junk),
    "prompt": st.one_of(st.text(max_size=40), st.lists(st.integers(-5, 10**6), max_size=8),
                        st.lists(st.text(max_size=10), max_size=3), junk),
    "messages": st.one_of(messages, junk),
    "max_tokens": st.one_of(st.integers(-3, 6), junk),
    "max_completion_tokens": st.one_of(st.integers(-3, 6), junk),
    "temperature": st.one_of(st.floats(-1, 3), junk),
    "top_p": st.one_of(st.floats(-0.5, 1.5), junk),
    "top_k": st.one_of(st.integers(-2, 100), junk),
    "n": st.one_of(st.integers(-1, 3), junk),
    "stop": st.one_of(st.text(max_size=5), st.lists(st.text(max_size=5), max_size=5), junk),
    "seed": st.one_of(st.integers(-(2**65), 2**65), junk),
    "stream": st.one_of(st.booleans(), junk),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.booleans()}), junk),
    "logprobs": st.one_of(st.booleans(), st.integers(-1, 25), junk),
    "top_logprobs": st.one_of(st.integers(-1, 25), junk),
    "echo": st.one_of(st.booleans(), junk),
    "presence_penalty": st.one_of(st.floats(-3, 3), junk),
    "frequency_penalty": st.one_of(st.floats(-3, 3), junk),
    "repetition_penalty": st.one_of(st.floats(-1, 3), junk),
    "loops": st.one_of(st.integers(-1, 10), st.just(2**40), junk),
    "early_exit": st.one_of(st.fixed_dictionaries({"patience": st.integers(-1, 3), "tau": st.floats(-1, 1)}), junk),
    "regex": st.one_of(st.sampled_from(["[0-9]{2}", "(a|b)*c", "[[:alpha:]]", "(", "a{99999}"]), junk),
    "response_format": st.one_of(
        st.just({"type": "json_object"}),
        st.builds(lambda s: {"type": "json_schema", "json_schema": {"name": "x", "schema": s}},
                  st.one_of(st.just({"type": "object", "properties": {"a": {"type": "integer"}}}), junk)),
        junk),
    "user": st.one_of(st.text(max_size=8), junk),
    "tokens": st.one_of(st.lists(st.integers(-5, 10**6), max_size=8), junk),
    "add_special_tokens": junk,
}
# Values an API client would plausibly send: most bodies are valid, so the fuzz reaches the
# generation paths, not only the refusals.
GOOD = {
    "temperature": st.sampled_from([0.0, 0.7, 1.5]), "top_p": st.sampled_from([0.5, 1.0]),
    "top_k": st.integers(1, 50), "n": st.integers(1, 2), "stop": st.sampled_from(["\n", [".", "the"]]),
    "seed": st.integers(0, 2**32), "stream": st.booleans(),
    "stream_options": st.just({"include_usage": True}), "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2), "repetition_penalty": st.floats(0.5, 1.5),
    "loops": st.integers(1, 8), "early_exit": st.just({"patience": 1, "tau": 0.1}),
    "regex": st.just("[a-z ]{1,8}"), "response_format": st.just({"type": "json_object"}), "user": st.text(max_size=5),
}


@st.composite
def bodies(draw, path):
    """A valid request for `path`, some plausible options, then 0-2 fields replaced by anything
    and maybe an unknown one."""
    text = draw(st.text(min_size=1, max_size=30))
    if path == "/v1/completions":
        body = {"model": "tinyloop-demo", "prompt": text, "max_tokens": draw(st.integers(1, 4))}
        body["logprobs"] = draw(st.one_of(st.none(), st.integers(0, 5)))
        body["echo"] = draw(st.booleans())
    elif path == "/v1/chat/completions":
        body = {"model": "tinyloop-demo", "messages": [{"role": "user", "content": text}],
                "max_tokens": draw(st.integers(1, 4))}
    elif path == "/tokenize":
        body = {"prompt": text}
    else:
        body = {"tokens": draw(st.lists(st.integers(0, 8000), min_size=1, max_size=8))}
    if path.startswith("/v1/"):
        for k in draw(st.lists(st.sampled_from(sorted(GOOD)), max_size=4, unique=True)):
            body[k] = draw(GOOD[k])
    for k in draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=2, unique=True)):
        body[k] = draw(FIELDS[k])
    if draw(st.integers(0, 9)) == 0:
        body[draw(st.text(min_size=1, max_size=6))] = draw(junk)
    if draw(st.integers(0, 19)) == 0:
        return draw(junk)  # not even an object, sometimes
    return body


@pytest.fixture(scope="module")
def srv():
    # A per-request timeout bounds the time any one accepted body can take.
    with server_in_thread(timeout=2.0) as s:
        yield s


def _check(r: httpx.Response, stream_asked: bool) -> None:
    STATUSES[r.status_code] += 1
    assert r.status_code in OK, (r.status_code, r.text[:500])
    if r.status_code != 200:
        body = r.json()
        err = body["error"]
        assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str), body
        return
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        assert r.text.rstrip().endswith("data: [DONE]"), r.text[-300:]
    else:
        json.loads(r.text)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.data())
def test_any_json_body_gets_a_documented_answer(srv, data):
    path = data.draw(st.sampled_from(PATHS))
    body = data.draw(bodies(path))
    payload = json.dumps(body).encode()
    r = httpx.post(srv.url + path, content=payload, headers={"Content-Type": "application/json"}, timeout=60)
    _check(r, isinstance(body, dict) and body.get("stream") is True)


@settings(max_examples=max(20, EXAMPLES // 5), deadline=None, suppress_health_check=list(HealthCheck),
          derandomize=True)
@given(path=st.sampled_from(PATHS), data=st.binary(max_size=200))
def test_any_bytes_get_a_documented_answer(srv, path, data):
    r = httpx.post(srv.url + path, content=data, headers={"Content-Type": "application/json"}, timeout=60)
    _check(r, False)


def test_server_still_answers_after_the_fuzz(srv):
    # The bodies reached both the generation paths and the refusals (not only one of them).
    print(f"\nstatuses over the fuzz: {dict(sorted(STATUSES.items()))}")
    assert STATUSES[200] >= 10 and STATUSES[400] >= 10, STATUSES
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "The sea", "max_tokens": 3}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] is not None


def test_masked_alternatives_are_finite_in_json(srv):
    # Found by the fuzz: with a grammar allowing fewer tokens than top_logprobs asks for, the
    # rest are -inf, which JSON cannot carry (500): they come out as -9999.0, as in vLLM.
    for stream in (False, True):
        r = httpx.post(srv.url + "/v1/completions", timeout=60, json={
            "prompt": "x", "max_tokens": 1, "logprobs": 5, "regex": "[01]", "stream": stream})
        assert r.status_code == 200, r.text
        if not stream:
            tops = r.json()["choices"][0]["logprobs"]["top_logprobs"]
            values = [v for top in tops for v in top.values()]
            assert -9999.0 in values and all(v == -9999.0 or -100 < v <= 0 for v in values), tops
        else:
            assert "-9999.0" in r.text and r.text.rstrip().endswith("data: [DONE]")
