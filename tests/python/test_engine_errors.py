"""Every bad input gets an exception that names the problem (issue: engine core, item 6)."""
import struct

import numpy as np
import pytest

import tinyloop_py as tl

PROMPT = np.array([1, 2, 3], dtype=np.int32)


@pytest.fixture(scope="module")
def path(test_models):
    return test_models["huginn"].path


@pytest.fixture()
def model(path):
    with tl.Model(path) as m:
        yield m


# ---- lifecycle -------------------------------------------------------------------------

def test_closed_model_raises(path):
    m = tl.Model(path)
    m.close()
    for call in (lambda: m.generate(PROMPT), lambda: m.score(PROMPT), lambda: m.score_last(PROMPT),
                 lambda: m.config(), lambda: m.vram_usage_mb(),
                 lambda: m.generate_stream(PROMPT, lambda t: True)):
        with pytest.raises(RuntimeError, match="model was closed"):
            call()
    m.close()  # closing twice is fine


def test_context_manager_closes(path):
    with tl.Model(path) as m:
        m.generate(PROMPT, max_tokens=2)
    assert m.closed
    with pytest.raises(RuntimeError, match="model was closed"):
        m.generate(PROMPT)


def test_load_alias(path):
    m = tl.load(path, max_seq_len=32)
    assert m.config()["max_seq_len"] == 32
    m.close()


# ---- generate kwargs -------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,name", [
    (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens=-3), "max_tokens"),
    (dict(loops=0), "loops"),
    (dict(loops=-1), "loops"),
    (dict(temperature=-0.5), "temperature"),
    (dict(temperature=0.8, top_k=0), "top_k"),
    (dict(temperature=0.8, top_k=-2), "top_k"),
    (dict(temperature=0.8, top_p=0.0), "top_p"),
    (dict(temperature=0.8, top_p=1.5), "top_p"),
    (dict(temperature=0.8, top_p=-0.1), "top_p"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(repetition_penalty=-1.0), "repetition_penalty"),
    (dict(cache_window=-1), "cache_window"),
    (dict(stop_sequences=[[]]), "stop_sequences"),
    (dict(stop_sequences=[[1, 500]]), "stop_sequences"),
    (dict(stop_sequences=[[1, -2]]), "stop_sequences"),
    (dict(stop_sequences="ab"), "stop_sequences"),
    (dict(stop_sequences=[3, 4]), "stop_sequences"),
    (dict(stop_sequences=[["a"]]), "stop_sequences"),
])
def test_bad_kwargs_raise_value_error_naming_them(model, kwargs, name):
    with pytest.raises(ValueError, match=name):
        model.generate(PROMPT, **kwargs)
    with pytest.raises(ValueError, match=name):
        model.generate_stream(PROMPT, lambda t: True, **kwargs)


def test_top_k_zero_is_fine_when_greedy(model):
    assert len(model.generate(PROMPT, max_tokens=2, temperature=0.0, top_k=0)) >= 4


@pytest.mark.parametrize("prompt,what", [
    (np.array([], dtype=np.int32), "empty"),
    (np.array([[1, 2], [3, 4]], dtype=np.int32), "1-D"),
    (np.array(5, dtype=np.int32), "1-D"),
    (np.array([1, 97], dtype=np.int32), "outside"),
    (np.array([1, -1], dtype=np.int32), "outside"),
    (np.array([1, 2**40]), "outside"),
    (np.array([1.0, 2.0]), "integer"),
    ([1, 2, 1000], "outside"),
])
def test_bad_prompts(model, prompt, what):
    for call in (lambda: model.generate(prompt, max_tokens=1), lambda: model.score(prompt),
                 lambda: model.score_last(prompt)):
        with pytest.raises(ValueError, match="prompt") as e:
            call()
        assert what in str(e.value)


def test_prompt_list_of_ints_works(model):
    assert model.generate([1, 2, 3], max_tokens=2)[:3] == [1, 2, 3]


def test_sequence_too_long_is_runtime_error(path):
    with tl.Model(path, max_seq_len=16) as m:
        with pytest.raises(RuntimeError, match="max_seq_len"):
            m.generate(np.arange(1, 11, dtype=np.int32), max_tokens=7)
        assert len(m.generate(np.arange(1, 11, dtype=np.int32), max_tokens=6, stop_at_eos=False)) == 16
        with pytest.raises(RuntimeError, match="max_seq_len"):
            m.score(np.arange(1, 18, dtype=np.int32) % 90)


def test_score_loops_validated(model):
    with pytest.raises(ValueError, match="loops"):
        model.score(PROMPT, loops=0)


@pytest.mark.parametrize("loops", [4097, 2**20, 2**59, 2**63 - 1])
def test_huge_depths_are_refused_by_name_not_crashes(model, loops):
    # Sizes computed from loops (KV slots x blocks x bytes) once wrapped int64 and crashed.
    for call in (lambda: model.generate(PROMPT, 3, loops=loops), lambda: model.score(PROMPT, loops=loops),
                 lambda: model.generate(PROMPT, 3, loops=loops, beam_size=2)):
        with pytest.raises(ValueError, match=r"loops must be in \[1, 4096\]"):
            call()
    with tl.Engine(model, kv_budget_mb=4) as eng, pytest.raises(ValueError, match="loops"):
        eng.submit(PROMPT, max_tokens=3, loops=loops)


@pytest.mark.parametrize("max_tokens", [2**62, 2**63 - 1])
def test_huge_max_tokens_cannot_wrap_the_length_check(model, max_tokens):
    with pytest.raises(RuntimeError, match="max_seq_len"):
        model.generate(PROMPT, max_tokens)
    with tl.Engine(model, kv_budget_mb=4) as eng, pytest.raises(RuntimeError, match="max_seq_len"):
        eng.submit(PROMPT, max_tokens=max_tokens)


def test_on_token_must_be_callable(model):
    with pytest.raises(ValueError, match="on_token"):
        model.generate_stream(PROMPT, 5)


def test_unimplemented_features_refused_clearly(model):
    with pytest.raises(ValueError, match="beam_size"):  # beam search exists; a bad size is refused
        model.generate(PROMPT, beam_size=-3)
    with pytest.raises(ValueError, match="grammar must be"):
        model.generate(PROMPT, grammar=object())


# ---- model options ---------------------------------------------------------------------

def test_bad_model_options(path, test_models):
    with pytest.raises(ValueError, match="max_seq_len"):
        tl.Model(path, max_seq_len=0)
    with pytest.raises(ValueError, match="kv_mode"):
        tl.Model(path, kv_mode="int3")
    learned = test_models["gpt_learned"]
    with pytest.raises(ValueError, match="learned position"):
        tl.Model(learned.path, max_seq_len=learned.cfg["max_seq_len"] + 1)


# ---- model files -----------------------------------------------------------------------

def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.tinyloop"):
        tl.Model(str(tmp_path / "nope.tinyloop"))


def _corrupt(tmp_path, path, mutate):
    blob = bytearray(open(path, "rb").read())
    blob = mutate(blob)
    out = tmp_path / "bad.tinyloop"
    out.write_bytes(bytes(blob))
    return str(out)


@pytest.mark.parametrize("mutate,needle", [
    (lambda b: b[:5], "too short"),
    (lambda b: b[: len(b) // 2], None),
    (lambda b: b[:-1], None),
    (lambda b: struct.pack("<Q", 10**12) + b[8:], "header"),
    (lambda b: b[:8] + b"[" + b[9:], None),
    (lambda b: b[:8] + b[8:].replace(b'"tinyloop"', b'"tinyleap"', 1), "format"),
    (lambda b: b[:8] + b[8:].replace(b'"F32"', b'"F99"', 1), "F99"),
    (lambda b: bytearray(b"\x00" * 64), None),
])
def test_corrupt_files_raise_model_format_error(tmp_path, path, mutate, needle):
    bad = _corrupt(tmp_path, path, mutate)
    with pytest.raises(tl.ModelFormatError, match=needle) as e:
        tl.Model(bad)
    assert isinstance(e.value, ValueError)


def test_file_with_wrong_tensor_shape(tmp_path, test_models):
    from tinyloop.format import read_model
    m = test_models["llama"]
    read_model(m.path)  # readable before the edit
    # Re-write the header by hand with one shape changed: the byte size no longer matches.
    blob = bytearray(open(m.path, "rb").read())
    n = struct.unpack("<Q", blob[:8])[0]
    header = blob[8:8 + n].decode()
    header = header.replace('"shape":[97,64]', '"shape":[96,64]', 1)
    out = tmp_path / "shape.tinyloop"
    out.write_bytes(bytes(blob[:8]) + header.encode() + bytes(blob[8 + n:]))
    with pytest.raises(tl.ModelFormatError):
        tl.Model(str(out))
