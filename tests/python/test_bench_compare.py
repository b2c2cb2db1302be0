"""bench/compare.py: its command line refuses bad options before it loads anything (no llama.cpp
needed), and the K/V modes it pairs with llama.cpp's cache types are the ones TinyLoop has."""
import os
import sys

import pytest

_REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(_REPO, "bench"))

import compare  # noqa: E402


@pytest.mark.parametrize("argv, message", [
    (["--kv-mode", "fp16,int4"], "--kv-mode 'int4'"),
    (["--weight-dtype", "bf16"], "--weight-dtype 'bf16'"),
    (["--quant-activations", "q4"], "--quant-activations 'q4'"),
    (["-p", "0", "-n", "0"], "not both 0"),
    (["-p", "-1"], "must be >= 0"),
])
def test_bad_options_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        compare.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_llama_flash_attention_is_on_or_off():
    with pytest.raises(SystemExit):
        compare.main(["--llama-flash-attn", "auto"])


def test_kv_modes_are_tinyloop_modes(tmp_path):
    """Every --kv-mode value opens a model as that kv_mode and decodes, and its llama.cpp
    counterpart is a GGML type name llama-cpp-python exports (GGML_TYPE_<NAME>)."""
    import tinyloop_py as tl
    from tinyloop.random_model import write_random_model

    path = write_random_model(str(tmp_path / "m.tinyloop"), "llama", seed=3)
    assert compare.KV_FOR == {"fp16": "f16", "int8": "q8_0"}
    for kv in compare.KV_FOR:
        with tl.Model(path, kv_mode=kv) as m:
            assert m.config()["kv_mode"] == kv
            r = m.generate_stream([5, 6, 7], lambda t: True, max_tokens=2, temperature=0.0, stop_at_eos=False)
            assert r["tokens_emitted"] == 2
