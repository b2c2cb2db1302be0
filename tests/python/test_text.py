"""Text in, text out: the tokenizer built from GGUF metadata (tinyloop.gguf_tokenizer), the
text helpers (tinyloop.text), chat rendering and the generate/chat CLI."""
import io
import os
import re
import sys

import numpy as np
import pytest

import tinyloop_py as tl
from smollm2 import smollm2_gguf  # noqa: F401  (session fixture: the cached GGUF, or a skip)
from tinyloop import chat, cli
from tinyloop.config import preset_config
from tinyloop.format import write_model
from tinyloop.random_model import random_tensors
from tinyloop.text import (TextStreamer, chat_template, get_tokenizer, grammar, load_tokenizer,
                           read_metadata, render_chat, token_bytes)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUNDLED = os.path.join(ROOT, "models", "tinyloop-demo.tinyloop")

# ---------------------------------------------------------------------------------------
# tokenizer.json from GGUF metadata


@pytest.fixture(scope="module")
def smol_tokenizer(smollm2_gguf):  # noqa: F811
    gguf = pytest.importorskip("gguf")
    from tokenizers import Tokenizer
    from tinyloop.gguf_tokenizer import chat_template_from_gguf, tokenizer_json_from_gguf

    reader = gguf.GGUFReader(smollm2_gguf)
    return Tokenizer.from_str(tokenizer_json_from_gguf(reader)), chat_template_from_gguf(reader)


def test_gguf_chat_template_and_special_tokens(smol_tokenizer):
    """Straight from the GGUF (test_smollm2.py checks the ids of the converted file's copy
    against llama.cpp's)."""
    tok, template = smol_tokenizer
    assert template.startswith("{% for message in messages %}") and "<|im_start|>" in template
    assert tok.token_to_id("<|im_end|>") == 2 and tok.get_vocab_size() == 49152
    # control tokens are special: skipped when decoding, matched whole when encoding
    assert tok.decode([1, 4093, 2]) == "user"
    text = render_chat(template, [{"role": "user", "content": "Hi"}])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                    "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


class _Field:
    def __init__(self, v):
        self.v = v

    def contents(self):
        return self.v


class _Reader:
    """The slice of gguf.GGUFReader the builder uses: fields[key].contents()."""

    def __init__(self, **kv):
        self.fields = {"tokenizer.ggml." + k: _Field(v) for k, v in kv.items()}


def _byte_level_vocab(extra=()):
    from tinyloop.grammar_vocab import gpt2_unicode_to_byte
    chars = sorted(gpt2_unicode_to_byte(), key=lambda c: gpt2_unicode_to_byte()[c])
    return chars + list(extra)


def test_llama3_style_pre_tokenizer_bos_and_user_defined_tokens():
    """A Llama-3-like file: llama-bpe regex (digits in groups of three), ignore_merges, BOS
    added by encode(), control and user-defined tokens matched whole."""
    from tokenizers import Tokenizer
    from tinyloop.gguf_tokenizer import tokenizer_json_from_gguf

    G = "\u0120"  # byte-level space
    tokens = _byte_level_vocab(["he", "ll", "hell", "hello", G + "w", G + "wor", "123", "<|begin|>", "<tool>"])
    types = [1] * (len(tokens) - 2) + [3, 4]
    merges = ["h e", "l l", "he ll", "hell o", G + " w", G + "w o", G + "wo r"]
    tokens.insert(len(tokens) - 2, G + "wo")
    types.insert(len(types) - 2, 1)
    r = _Reader(model="gpt2", pre="llama-bpe", tokens=tokens, token_type=types, merges=merges,
                bos_token_id=tokens.index("<|begin|>"), add_bos_token=True)
    tok = Tokenizer.from_str(tokenizer_json_from_gguf(r))
    v = {t: i for i, t in enumerate(tokens)}
    ids = tok.encode("hello world 1234<tool>").ids
    assert ids[0] == v["<|begin|>"]
    assert ids[1:] == [v["hello"], v[G + "wor"], v["l"], v["d"], v[G], v["123"], v["4"], v["<tool>"]]
    assert tok.decode(ids) == "hello world 1234<tool>"  # BOS is special, <tool> is text


def test_sentencepiece_vocabulary_merges_by_score_with_byte_fallback():
    """tokenizer.ggml.model 'llama': a space prefix on every fragment, ' ' as U+2581, pieces
    merged highest score first (llama.cpp's rule), unknown characters as <0xXX> bytes.
    tests/oracles checks a 20k-piece vocabulary against llama.cpp itself."""
    from tokenizers import Tokenizer
    from tinyloop.gguf_tokenizer import tokenizer_json_from_gguf

    S = "\u2581"
    pieces = [S, "h", "e", "l", "o", "w", "r", "d", S + "hello", "hello", "ll", "he", "hell", S + "h", S + "w",
              "or", S + "wor"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * 259 + [0.0] * 8 + [-float(i) for i in range(1, len(pieces) - 7)]
    r = _Reader(model="llama", tokens=tokens, token_type=types, scores=scores, bos_token_id=1,
                eos_token_id=2, unknown_token_id=0)
    tok = Tokenizer.from_str(tokenizer_json_from_gguf(r))
    v = {t: i for i, t in enumerate(tokens)}
    ids = tok.encode("hello world!</s>he").ids
    # after </s>: "\u2581he" -> "he" (score -4) beats "\u2581h" (-6)
    assert ids == [1, v[S + "hello"], v[S + "wor"], v["l"], v["d"], v["<0x21>"], 2, v[S], v["he"]]
    assert tok.decode(ids) == "hello world! he"  # the fragment after </s> got its own space prefix


@pytest.mark.parametrize("kv,message", [
    (dict(model="bert", tokens=["a"]), "tokenizer model 'bert' is not supported"),
    (dict(model="llama", tokens=["a"]), "without tokenizer.ggml.scores"),
    (dict(model="gpt2", pre="deepseek-coder", tokens=["a"]), "pre-tokenizer 'deepseek-coder'"),
    (dict(model="gpt2", pre="smollm", tokens=["a", "b"], token_type=[1, 1]), "merges is missing"),
    (dict(model="gpt2", pre="smollm", tokens=["a", "a"], token_type=[1, 1], merges=[]), "appears twice"),
    (dict(model="gpt2", pre="smollm", tokens=["a", "b"], token_type=[1], merges=[]), "1 token types for 2"),
    (dict(model="gpt2", pre="smollm", tokens=["a", "b"], merges=["ab"]), "malformed merge"),
])
def test_unsupported_or_broken_tokenizers_are_refused_by_name(kv, message):
    from tinyloop.gguf_tokenizer import tokenizer_json_from_gguf

    with pytest.raises(ValueError, match=re.escape(message)):
        tokenizer_json_from_gguf(_Reader(**kv))


def test_no_tokenizer_in_the_file_gives_none():
    from tinyloop.gguf_tokenizer import chat_template_from_gguf, tokenizer_json_from_gguf

    assert tokenizer_json_from_gguf(_Reader()) is None and chat_template_from_gguf(_Reader()) is None


# ---------------------------------------------------------------------------------------
# helpers on a model file


def test_get_tokenizer_from_a_path_or_a_model():
    assert get_tokenizer(BUNDLED).encode("It is").ids == load_tokenizer(BUNDLED).encode("It is").ids
    with tl.Model(BUNDLED) as m:
        tok = get_tokenizer(m)
        assert tok.decode(tok.encode("It is a truth").ids) == "It is a truth"
        vocab = token_bytes(m)
        assert len(vocab) == m.config()["vocab_size"] == 8192
        assert b"".join(vocab[i] for i in tok.encode("a truth").ids) == b"a truth"
        assert chat_template(BUNDLED) is None
        g = grammar(m, tl.Grammar.digits(1, 4))
        ids = np.array(tok.encode("The year ").ids, dtype=np.int32)
        out = m.generate(ids, grammar=g, max_tokens=8, temperature=0.0)[len(ids):]
        text = b"".join(vocab[t] for t in out if t not in m.config()["eos_ids"])
        assert re.fullmatch(rb"[0-9]{1,4}", text), text


def test_a_model_without_a_tokenizer_is_a_clear_error(tmp_path):
    cfg = preset_config("llama", vocab_size=97)
    path = str(tmp_path / "bare.tinyloop")
    write_model(path, cfg, random_tensors(cfg, seed=1))
    assert load_tokenizer(path) is None
    with pytest.raises(ValueError, match="no embedded tokenizer"):
        get_tokenizer(path)


def test_read_metadata_refuses_a_non_model_file(tmp_path):
    p = tmp_path / "junk.tinyloop"
    p.write_bytes(b"\xff" * 7)
    with pytest.raises(ValueError, match="truncated header"):
        read_metadata(p)
    p.write_bytes((2**40).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match="exceeds the file"):
        read_metadata(p)
    with pytest.raises(FileNotFoundError):
        read_metadata(tmp_path / "missing.tinyloop")


def test_render_chat_passes_special_tokens_and_raise_exception():
    t = "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}" \
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    assert render_chat(t, [{"role": "user", "content": "hi"}], bos_token="<s>") == "<s>[user] hi\n[assistant] "
    t2 = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m['content'] }}{% endfor %}" \
         "{{ strftime_now('%Y') | length }}"
    assert render_chat(t2, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "a4"
    with pytest.raises(ValueError, match="chat template: roles must alternate"):
        render_chat("{{ raise_exception('roles must alternate') }}", [])


def test_streamer_waits_for_a_whole_utf8_character():
    from tokenizers import Tokenizer, decoders, models

    # byte-level tokens: "é" is two bytes, here two tokens
    from tinyloop.grammar_vocab import gpt2_unicode_to_byte
    to_char = {b: c for c, b in gpt2_unicode_to_byte().items()}
    vocab = {to_char[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab, []))
    tok.decoder = decoders.ByteLevel()
    out = io.StringIO()
    s = TextStreamer(tok, out, prompt_ids=[ord("a")])
    writes = []
    for b in "é!".encode():
        s(b)
        writes.append(out.getvalue())
    assert writes == ["", "é", "é!"] and s.text == "é!"


# ---------------------------------------------------------------------------------------
# CLI


def test_generate_takes_the_model_as_first_argument(capsys):
    assert cli.main(["generate", BUNDLED, "It is a truth", "--max-tokens", "5", "--temperature", "0"]) == 0
    positional = capsys.readouterr().out
    assert cli.main(["generate", "--model", BUNDLED, "It is a truth", "--max-tokens", "5", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == positional and positional.startswith("It is a truth")
    assert cli.main(["generate", "x.gguf", "hi"]) == 1
    assert "convert it first" in capsys.readouterr().err
    assert cli.main(["generate", BUNDLED]) == 1
    assert "no PROMPT" in capsys.readouterr().err


def _word_model(tmp_path, template):
    from test_cli import word_tokenizer_json
    cfg = preset_config("huginn", max_seq_len=256, eos_ids=[0])
    path = str(tmp_path / "chat.tinyloop")
    write_model(path, cfg, random_tensors(cfg, seed=3), tokenizer_json=word_tokenizer_json(),
                chat_template=template)
    return path


def test_chat_uses_the_template_and_keeps_the_conversation(tmp_path, monkeypatch, capsys):
    template = "{% for m in messages %}w2 {{ m['content'] }} w3 {% endfor %}{% if add_generation_prompt %}w4{% endif %}"
    path = _word_model(tmp_path, template)
    seen = []
    real = chat.Conversation.prompt_ids

    def spy(self, budget):
        seen.append(real(self, budget))
        return seen[-1]

    monkeypatch.setattr(chat.Conversation, "prompt_ids", spy)
    monkeypatch.setattr(sys, "stdin", io.StringIO("w10 w11\nw12\n\n"))
    assert cli.main(["chat", path, "--max-tokens", "3", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "chat template" in out and out.count("> ") == 3
    assert seen[0] == [2, 10, 11, 3, 4]
    # second turn: first user turn, the model's reply, then the new user turn
    assert seen[1][:4] == [2, 10, 11, 3] and seen[1][-4:] == [2, 12, 3, 4] and len(seen[1]) > 8


def test_chat_without_a_template_continues_plain_text(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("It is a truth\n\n"))
    assert cli.main(["chat", BUNDLED, "--max-tokens", "8", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert "plain continuation" in out and len(out.split("> ")[1].strip()) > 0
    assert cli.main(["chat", "model.gguf"]) == 1
    assert "convert it first" in capsys.readouterr().err


def test_chat_drops_old_turns_when_the_context_is_full(tmp_path):
    from test_cli import word_tokenizer_json
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(word_tokenizer_json())
    conv = chat.Conversation(tok, "{% for m in messages %}{{ m['content'] }} {% endfor %}", {"eos_ids": [0]},
                             system="w1")
    for i in range(10):
        conv.add_user(f"w{10 + i} w{10 + i}")
        conv.add_reply("w5")
    conv.add_user("w50")
    ids = conv.prompt_ids(8)
    assert len(ids) <= 8 and ids[0] == 1 and ids[-1] == 50
    conv.add_user("w50 " * 20)
    with pytest.raises(ValueError, match="more than the 8 that fit"):
        conv.prompt_ids(8)
