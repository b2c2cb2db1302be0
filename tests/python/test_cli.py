"""The `tinyloop` command line: generate, talk, perplexity, inspect, random-model."""
import io
import math

import pytest

import reference
import tinyloop_py as tl
from tinyloop import cli
from tinyloop.format import read_model, write_model
from tinyloop.perplexity import perplexities, token_stream, window_nll
from tinyloop.random_model import random_tensors
from tinyloop.config import preset_config

WORDS = [f"w{i}" for i in range(97)]


def word_tokenizer_json() -> str:
    """A 97-word WordLevel tokenizer (ids match a vocab-97 random model); w0 is EOS."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="w1"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return tok.to_str()


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    cfg = preset_config("huginn", max_seq_len=512, eos_ids=[0])
    path = str(tmp_path_factory.mktemp("cli") / "text.tinyloop")
    write_model(path, cfg, random_tensors(cfg, seed=3), tokenizer_json=word_tokenizer_json())
    return path


def test_generate_with_ids(test_models, capsys):
    m = test_models["llama"]
    assert cli.main(["generate", "--model", m.path, "--ids", "1,2,3", "--max-tokens", "5",
                     "--temperature", "0"]) == 0
    out = capsys.readouterr().out.split()
    with tl.Model(m.path) as model:
        want = model.generate([1, 2, 3], max_tokens=5, temperature=0.0, repetition_penalty=1.1)
    assert [int(t) for t in out] == want[3:]


def test_generate_engine_flags(test_models, capsys, monkeypatch):
    """--kv-mode / --kv-loop-slots / --beam-size reach the Model and the call (the last two
    change this model's greedy tokens; int8 KV does not, so the Model's kwargs are recorded)."""
    m = test_models["huginn"]
    opened = []
    real_model = tl.Model

    def recording_model(*a, **kw):
        opened.append(kw)
        return real_model(*a, **kw)

    monkeypatch.setattr(tl, "Model", recording_model)
    cases = [(["--kv-mode", "int8"], dict(kv_mode="int8"), {}),
             (["--kv-loop-slots", "1", "--loops", "3"], {}, dict(kv_loop_slots=1, loops=3)),
             (["--beam-size", "3", "--length-penalty", "0.5"], {}, dict(beam_size=3, length_penalty=0.5))]
    for flags, model_kw, call_kw in cases:
        assert cli.main(["generate", m.path, "1,2,3", "--ids", "--max-tokens", "6",
                         "--temperature", "0"] + flags) == 0
        out = [int(t) for t in capsys.readouterr().out.split()]
        with tl.Model(m.path, **model_kw) as model:
            want = model.generate([1, 2, 3], max_tokens=6, temperature=0.0, repetition_penalty=1.1,
                                  **call_kw)
        assert out == want[3:], flags
    assert opened[0]["kv_mode"] == "int8" and opened[2].get("kv_mode") is None
    assert cli.main(["generate", m.path, "1,2", "--ids", "--beam-size", "-2"]) == 1
    assert "beam_size" in capsys.readouterr().err


def test_generate_with_text(text_model, capsys):
    assert cli.main(["generate", "--model", text_model, "w5 w6 w7", "--max-tokens", "6",
                     "--seed", "3"]) == 0
    out = capsys.readouterr().out
    words = out.split()
    assert words[:3] == ["w5", "w6", "w7"] and 4 <= len(words) <= 9
    assert all(w in WORDS for w in words)


def test_generate_reports_errors(test_models, capsys):
    assert cli.main(["generate", "--model", test_models["llama"].path, "--ids", "1,2,999"]) == 1
    assert "outside" in capsys.readouterr().err
    assert cli.main(["generate", "--model", "/nonexistent.tinyloop", "x"]) == 1


def test_talk_continues_each_prompt_and_quits_on_empty_line(text_model):
    from tinyloop.talk import run
    from tinyloop.text import load_tokenizer

    class Args:
        max_tokens, loops, temperature, top_k, top_p, repetition_penalty, seed = 4, 2, 0.0, 50, 1.0, 1.0, None

    out = io.StringIO()
    with tl.Model(text_model) as model:
        tok = load_tokenizer(model)
        assert run(model, tok, Args, stdin=io.StringIO("w3 w4\nw9\n\nw10\n"), stdout=out) == 0
        first = model.generate(tok.encode("w3 w4").ids, max_tokens=4, loops=2)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("Type the start of a text")
    assert tok.decode(first[2:]) in out.getvalue()
    assert "w10" not in out.getvalue()  # the empty line quit before it


def test_perplexity_matches_numpy_reference(text_model):
    contents = read_model(text_model)
    with tl.Model(text_model) as model:
        from tinyloop.text import load_tokenizer
        tokenizer = load_tokenizer(model)
        stream = token_stream(tokenizer, ["w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 " * 5, "w40 w41 w42 " * 6], 0)
        got = perplexities(model, stream, [1, 3], ctx=16, progress=False)
    n = len(stream) // 16
    for L in (1, 3):
        nll = 0.0
        for w in range(n):
            ids = stream[w * 16:(w + 1) * 16]
            nll += window_nll(reference.forward(contents.config, contents.tensors, ids, L), ids).sum()
        assert got[L] == pytest.approx(math.exp(nll / (n * 15)), rel=1e-4)


def test_perplexity_command(text_model, tmp_path, capsys):
    f = tmp_path / "t.txt"
    f.write_text("w3 w4 w5 " * 40)
    assert cli.main(["perplexity", text_model, str(f), "--loops", "1,2", "--ctx", "20", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "| 1 |" in out and "| 2 |" in out


def test_inspect_and_random_model(tmp_path, capsys):
    out = str(tmp_path / "r.tinyloop")
    assert cli.main(["random-model", out, "--kind", "ouro", "--weight-dtype", "bf16",
                     "--set", "default_loops=3"]) == 0
    assert cli.main(["inspect", out]) == 0
    text = capsys.readouterr().out
    assert "default_loops: 3" in text and "BF16" in text and "loop_norm.weight" in text


@pytest.mark.parametrize("cmd", ["talk", "chat"])
def test_talk_and_chat_take_the_engine_flags(text_model, cmd, monkeypatch, capsys):
    """talk / chat pass --kv-mode / --quant-activations to the Model and --beam-size /
    --kv-loop-slots / --cache-window to every reply, as generate does: greedy beam 2 over an
    fp32 cache prints what Model.generate(beam_size=2) gives."""
    from tinyloop.text import load_tokenizer

    monkeypatch.setattr("sys.stdin", io.StringIO("w3 w4\n\n"))
    model_arg = ["--model", text_model] if cmd == "talk" else [text_model]
    assert cli.main([cmd, *model_arg, "--kv-mode", "fp32", "--beam-size", "2", "--max-tokens", "5",
                     "--loops", "2", "--temperature", "0", "--repetition-penalty", "1.0"]) == 0
    out = capsys.readouterr().out
    with tl.Model(text_model, kv_mode="fp32") as model:
        tok = load_tokenizer(model)
        ids = tok.encode("w3 w4").ids
        want = model.generate(ids, max_tokens=5, loops=2, beam_size=2, temperature=0.0,
                              repetition_penalty=1.0)
        greedy = model.generate(ids, max_tokens=5, loops=2, temperature=0.0, repetition_penalty=1.0)
    assert tok.decode(want[len(ids):]).strip() in out
    assert tok.decode(greedy[len(ids):]).strip() not in out  # beam 2 differs here: the flag took effect
    with pytest.raises(SystemExit):  # argparse names the bad choice
        cli.main([cmd, *model_arg, "--kv-mode", "int3"])


def test_chat_keeps_earlier_turns_kv(text_model):
    """chat answers through a serving engine with prefix caching: later turns reuse the KV
    blocks of earlier prompts (counted by the engine), and every reply equals a fresh
    generate of the whole conversation so far."""
    import types

    from tinyloop import chat
    from tinyloop.text import load_tokenizer

    lines = ["w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19 w20",
             "w21 w22 w23 w24 w25", "w26 w27 w28"]
    args = types.SimpleNamespace(max_tokens=6, loops=2, temperature=0.0, top_k=50, top_p=1.0,
                                 repetition_penalty=1.0, seed=None, cache_window=0, kv_loop_slots=0,
                                 beam_size=0, length_penalty=1.0, system=None)
    out, stats = io.StringIO(), {}
    with tl.Model(text_model) as model:
        tok = load_tokenizer(model)
        assert chat.run(model, tok, None, args, stdin=io.StringIO("\n".join(lines) + "\n\n"),
                        stdout=out, stats=stats) == 0
        # The same conversation by hand: each prompt is everything so far, generated afresh.
        text, want = "", []
        for i, line in enumerate(lines):
            text += ("\n" if i else "") + line
            ids = tok.encode(text).ids
            new = model.generate(ids, max_tokens=6, loops=2, temperature=0.0, repetition_penalty=1.0)[len(ids):]
            reply = tok.decode(new)
            want.append(reply)
            text += reply
    printed = out.getvalue()
    for reply in want:
        assert reply.strip() in printed
    assert stats["requests_finished"] == 3
    assert stats["prefix_hits"] >= 2 and stats["prefix_hit_tokens"] >= 32, stats
