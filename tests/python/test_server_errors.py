"""Malformed and refused requests: each gets the documented status and OpenAI's error shape
`{"error": {"message", "type", "param", "code"}}` (docs/server.md, "Errors"), and the
server answers normally afterwards. Also the full queue (429) and the drain (503)."""
from __future__ import annotations

import json

import httpx
import pytest

from server_helpers import server_in_thread

KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
C, CH = "/v1/completions", "/v1/chat/completions"
OK_MSGS = [{"role": "user", "content": "hi"}]


def comp(**kw):
    return json.dumps(dict({"prompt": "hello", "max_tokens": 2}, **kw)).encode()


def chat(**kw):
    return json.dumps(dict({"messages": OK_MSGS, "max_tokens": 2}, **kw)).encode()


def deep(n):
    return ('{"prompt": ' + "[" * n + "]" * n + "}").encode()


# (id, method, path, body bytes, extra headers, status, param the error must name or None)
CASES = [
    ("bad-json", "POST", C, b'{"prompt": ', {}, 400, None),
    ("not-an-object", "POST", C, b"[1, 2]", {}, 400, None),
    ("empty-body", "POST", C, b"", {}, 400, None),
    ("bad-utf8", "POST", C, b'{"prompt": "\xff\xfe"}', {}, 400, None),
    ("nan", "POST", C, b'{"prompt": "x", "temperature": NaN}', {}, 400, None),
    ("infinity", "POST", C, b'{"prompt": "x", "temperature": Infinity}', {}, 400, None),
    ("float-overflow", "POST", C, b'{"prompt": "x", "temperature": 1e999}', {}, 400, "temperature"),
    ("5000-digit-int", "POST", C, b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", {}, 400, None),
    ("deep-nesting", "POST", C, deep(5000), {}, 400, None),
    ("unknown-field", "POST", C, comp(foo=1), {}, 400, "foo"),
    ("prompt-missing", "POST", C, b'{"max_tokens": 2}', {}, 400, "prompt"),
    ("prompt-number", "POST", C, comp(prompt=5), {}, 400, "prompt"),
    ("prompt-empty", "POST", C, comp(prompt=""), {}, 400, "prompt"),
    ("prompt-empty-list", "POST", C, comp(prompt=[]), {}, 400, "prompt"),
    ("prompt-mixed-list", "POST", C, comp(prompt=[1, "a"]), {}, 400, "prompt"),
    ("prompt-id-out-of-range", "POST", C, comp(prompt=[1, 999999]), {}, 400, "prompt"),
    ("prompt-id-negative", "POST", C, comp(prompt=[-3]), {}, 400, "prompt"),
    ("max-tokens-negative", "POST", C, comp(max_tokens=-1), {}, 400, "max_tokens"),
    ("max-tokens-zero", "POST", C, comp(max_tokens=0), {}, 400, "max_tokens"),
    ("max-tokens-string", "POST", C, comp(max_tokens="5"), {}, 400, "max_tokens"),
    ("max-tokens-float", "POST", C, comp(max_tokens=5.5), {}, 400, "max_tokens"),
    ("max-tokens-huge", "POST", C, comp(max_tokens=10**12), {}, 400, "max_tokens"),
    ("max-tokens-past-context", "POST", C, comp(max_tokens=100000), {}, 400, "max_tokens"),
    ("temperature-negative", "POST", C, comp(temperature=-1), {}, 400, "temperature"),
    ("temperature-too-high", "POST", C, comp(temperature=3), {}, 400, "temperature"),
    ("temperature-string", "POST", C, comp(temperature="hot"), {}, 400, "temperature"),
    ("top-p-zero", "POST", C, comp(top_p=0), {}, 400, "top_p"),
    ("top-p-above-one", "POST", C, comp(top_p=1.5), {}, 400, "top_p"),
    ("n-zero", "POST", C, comp(n=0), {}, 400, "n"),
    ("n-huge", "POST", C, comp(n=1000), {}, 400, "n"),
    ("stop-not-string", "POST", C, comp(stop=[1]), {}, 400, "stop"),
    ("stop-empty", "POST", C, comp(stop=""), {}, 400, "stop"),
    ("stop-too-many", "POST", C, comp(stop=[f"s{i}" for i in range(40)]), {}, 400, "stop"),
    ("logprobs-too-many", "POST", C, comp(logprobs=50), {}, 400, "logprobs"),
    ("logprobs-bool", "POST", C, comp(logprobs=True), {}, 400, "logprobs"),
    ("suffix", "POST", C, comp(suffix="end"), {}, 400, "suffix"),
    ("best-of", "POST", C, comp(best_of=3), {}, 400, "best_of"),
    ("echo-string", "POST", C, comp(echo="yes"), {}, 400, "echo"),
    ("seed-too-big", "POST", C, comp(seed=2**70), {}, 400, "seed"),
    ("seed-string", "POST", C, comp(seed="1"), {}, 400, "seed"),
    ("presence-penalty", "POST", C, comp(presence_penalty=3), {}, 400, "presence_penalty"),
    ("frequency-penalty", "POST", C, comp(frequency_penalty=-3), {}, 400, "frequency_penalty"),
    ("logit-bias", "POST", C, comp(logit_bias={"1": 5}), {}, 400, "logit_bias"),
    ("stream-string", "POST", C, comp(stream="true"), {}, 400, "stream"),
    ("stream-options-without-stream", "POST", C, comp(stream_options={"include_usage": True}), {}, 400,
     "stream_options"),
    ("response-format-type", "POST", C, comp(response_format={"type": "xml"}), {}, 400, "response_format.type"),
    ("json-schema-missing", "POST", C, comp(response_format={"type": "json_schema"}), {}, 400,
     "response_format.json_schema"),
    ("json-schema-backreference", "POST", C,
     comp(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": {
         "type": "string", "pattern": "^(a)\\1$"}}}), {}, 400, "response_format.json_schema.schema"),
    ("json-schema-lookahead", "POST", C,
     comp(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": {
         "type": "string", "pattern": "^(?=a)a+$"}}}), {}, 400, "response_format.json_schema.schema"),
    ("regex-invalid", "POST", C, comp(regex="a("), {}, 400, "regex"),
    ("regex-and-response-format", "POST", C, comp(regex="a", response_format={"type": "json_object"}), {}, 400,
     "regex"),
    ("loops-zero", "POST", C, comp(loops=0), {}, 400, "loops"),
    ("early-exit-unknown-key", "POST", C, comp(early_exit={"patience": 1, "speed": 2}), {}, 400,
     "early_exit.speed"),
    ("early-exit-not-object", "POST", C, comp(early_exit=3), {}, 400, "early_exit"),
    ("exit-gate-threshold-range", "POST", C, comp(exit_gate={"threshold": 1.5}), {}, 400, "exit_gate.threshold"),
    ("exit-gate-unknown-mode", "POST", C, comp(exit_gate={"mode": "sometimes"}), {}, 400, "exit_gate.mode"),
    ("exit-gate-without-gate", "POST", C, comp(exit_gate={"mode": "threshold"}), {}, 400, "exit_gate"),
    ("top-k-negative", "POST", C, comp(top_k=-1), {}, 400, "top_k"),
    ("repetition-penalty-zero", "POST", C, comp(repetition_penalty=0), {}, 400, "repetition_penalty"),
    ("messages-missing", "POST", CH, b'{"max_tokens": 2}', {}, 400, "messages"),
    ("messages-empty", "POST", CH, chat(messages=[]), {}, 400, "messages"),
    ("messages-not-list", "POST", CH, chat(messages="hi"), {}, 400, "messages"),
    ("message-without-role", "POST", CH, chat(messages=[{"content": "hi"}]), {}, 400, "messages[0].role"),
    ("message-bad-role", "POST", CH, chat(messages=[{"role": "robot", "content": "hi"}]), {}, 400,
     "messages[0].role"),
    ("message-tool-role", "POST", CH, chat(messages=[{"role": "tool", "content": "x"}]), {}, 400,
     "messages[0].role"),
    ("message-content-number", "POST", CH, chat(messages=[{"role": "user", "content": 5}]), {}, 400,
     "messages[0].content"),
    ("message-image-part", "POST", CH, chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]), {}, 400, "messages[0].content"),
    ("tools", "POST", CH, chat(tools=[{"type": "function", "function": {"name": "f"}}]), {}, 400, "tools"),
    ("top-logprobs-without-logprobs", "POST", CH, chat(top_logprobs=2), {}, 400, "top_logprobs"),
    ("max-completion-tokens-zero", "POST", CH, chat(max_completion_tokens=0), {}, 400, "max_completion_tokens"),
    ("max-tokens-disagree", "POST", CH, chat(max_tokens=3, max_completion_tokens=4), {}, 400,
     "max_completion_tokens"),
    ("chat-unknown-field", "POST", CH, chat(temprature=0.5), {}, 400, "temprature"),
    ("unknown-model", "POST", C, comp(model="gpt-4"), {}, 404, "model"),
    ("unknown-model-chat", "POST", CH, chat(model="gpt-4"), {}, 404, "model"),
    ("unknown-model-retrieve", "GET", "/v1/models/gpt-4", None, {}, 404, "model"),
    ("unknown-path", "POST", "/v1/nope", comp(), {}, 404, None),
    ("wrong-method", "GET", C, None, {}, 405, None),
    ("no-api-key", "POST", C, comp(), {"Authorization": None}, 401, None),
    ("wrong-api-key", "POST", C, comp(), {"Authorization": "Bearer nope"}, 401, None),
    ("basic-auth", "POST", C, comp(), {"Authorization": "Basic c2VrcmV0"}, 401, None),
    ("body-too-large", "POST", C, comp(prompt="x" * 70000), {}, 413, None),
    ("tokenize-both", "POST", "/tokenize", json.dumps({"prompt": "a", "messages": OK_MSGS}).encode(), {}, 400,
     "prompt"),
    ("tokenize-unknown-field", "POST", "/tokenize", json.dumps({"text": "a"}).encode(), {}, 400, "text"),
    ("detokenize-bad-id", "POST", "/detokenize", json.dumps({"tokens": [10**7]}).encode(), {}, 400, "tokens"),
    ("detokenize-not-ints", "POST", "/detokenize", json.dumps({"tokens": ["a"]}).encode(), {}, 400,
     "tokens[0]"),
]


@pytest.fixture(scope="module")
def srv():
    with server_in_thread(api_key=KEY, max_body_bytes=64 * 1024) as s:
        yield s


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        yield c


def check_error(r, status, param=None):
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    if param is not None:
        assert err["param"] == param, err
    return err


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_request(http, case):
    _, method, path, body, extra, status, param = case
    headers = {**AUTH, "Content-Type": "application/json"}
    for k, v in extra.items():
        if v is None:
            headers.pop(k)
        else:
            headers[k] = v
    r = http.request(method, path, content=body, headers=headers)
    err = check_error(r, status, param)
    if status == 401:
        assert err["code"] == "invalid_api_key" and r.headers.get("www-authenticate") == "Bearer"
    if status == 404 and param == "model":
        assert err["code"] == "model_not_found"


def test_case_table_is_big_enough():
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


def test_chunked_body_too_large(http):
    def gen():
        for _ in range(100):
            yield b"x" * 1024

    r = http.post(C, content=gen(), headers=AUTH)  # no Content-Length: chunked
    check_error(r, 413)


def test_open_routes_need_no_key(http):
    assert httpx.get(http.base_url.join("/health")).status_code == 200
    assert httpx.get(http.base_url.join("/metrics")).status_code == 200


def test_queue_full_is_429_and_drain_is_503(srv, http):
    """The engine's queue full (tl.QueueFull) is 429; while draining, 503."""
    import tinyloop_py as tl
    from server_helpers import BUNDLED

    # a server whose engine runs one request and queues one more
    with server_in_thread(BUNDLED, max_num_seqs=1, max_queue=1) as small:
        eng = small.state.engine
        from server_helpers import wait_until

        busy = [eng.submit([1, 2, 3], max_tokens=200, loops=64)]
        try:
            assert wait_until(lambda: eng.stats()["running"] == 1)
            busy.append(eng.submit([1, 2, 3], max_tokens=200, loops=64))  # waits
            r = httpx.post(small.url + C, json={"prompt": "hello", "max_tokens": 2}, timeout=60)
            err = check_error(r, 429)
            assert err["code"] == "queue_full"
            with pytest.raises(tl.QueueFull):
                eng.submit([1], max_tokens=1)
        finally:
            for h in busy:
                h.cancel()
        small.state.draining = True
        check_error(httpx.post(small.url + C, json={"prompt": "hello", "max_tokens": 2}, timeout=60), 503)
        assert httpx.get(small.url + "/health").status_code == 503
        small.state.draining = False
        assert httpx.post(small.url + C, json={"prompt": "hello", "max_tokens": 2}, timeout=60).status_code == 200


def test_server_still_answers_after_all_that(srv, http):
    check_error(http.post(C, content=comp(max_tokens=-5), headers=AUTH), 400, "max_tokens")
    check_error(http.post(C, content=comp(), headers={"Authorization": "Bearer x"}), 401)
    r = http.post(C, json={"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}, headers=AUTH)
    assert r.status_code == 200 and r.json()["choices"][0]["text"]
    r = http.post(CH, json={"messages": OK_MSGS, "max_tokens": 5, "stream": True}, headers=AUTH)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    s = srv.state.stats()
    assert s["running"] == 0 and s["waiting"] == 0
    assert s["requests_failed"] == 0
    metrics = http.get("/metrics").text
    assert 'endpoint="/v1/completions",status="400"' in metrics
    assert 'endpoint="/v1/completions",status="401"' in metrics
