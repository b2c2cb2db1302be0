"""Every `tokenizer.ggml.pre` name tinyloop.gguf_tokenizer supports, and its SentencePiece
(`llama` model) path, against llama.cpp: the
SmolLM2 vocabulary and merges written into a tensor-less GGUF under each pre name (with and
without `add_bos_token`, so llama.cpp's per-name BOS default is checked too), tokenized by
llama.cpp (vocab_only) and by the tokenizer.json we build from the same file."""
import glob
import os

import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed (scripts/test-oracles.sh)")
gguf = pytest.importorskip("gguf")

from smollm2 import require_gguf  # noqa: E402
from tinyloop.gguf_tokenizer import SUPPORTED_PRE, tokenizer_json_from_gguf  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CORPUS = os.path.abspath(os.path.join(ROOT, "..", "shared", "data", "corpus"))

TEXTS = ["Hello world! 123 4567 89,000 3.14159",
         "Café déjà vu — naïve façade, 日本語, Ελληνικά, emoji 🙂🙂!",
         "tabs\tand  runs   of    spaces\n\n\nnewlines  \n   \t \u00a0x\u2003y  ",
         "don't DON'T we'll I'M it's THEY'RE",
         "x = foo(a,b)+bar[3];\r\n\tif (y >= 10) { return \"ok\"; }\n",
         "  leading and trailing  ",
         "<|im_start|>user\nHi<|im_end|>"]


def _texts():
    out = list(TEXTS)
    for path in sorted(glob.glob(os.path.join(CORPUS, "*.txt"))):
        with open(path, encoding="utf-8") as f:
            s = f.read()
        out += [s[5000:8000], s[-3000:]]
    return out


def _write(src_reader, path: str, pre: str, keep_add_bos: bool) -> None:
    w = gguf.GGUFWriter(path, "llama")
    for key, f in src_reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "tokenizer.ggml.add_bos_token" and not keep_add_bos:
            continue
        value = pre if key == "tokenizer.ggml.pre" else f.contents()
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, value, f.types[0], sub_type=f.types[1])
        else:
            w.add_key_value(key, value, f.types[0])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def source():
    return gguf.GGUFReader(require_gguf())


@pytest.mark.parametrize("keep_add_bos", [True, False], ids=["add_bos_from_file", "add_bos_default"])
@pytest.mark.parametrize("pre", SUPPORTED_PRE)
def test_pre_tokenizer_gives_llama_cpp_ids(source, tmp_path, pre, keep_add_bos):
    from tokenizers import Tokenizer

    path = str(tmp_path / f"{pre}.gguf")
    _write(source, path, pre, keep_add_bos)
    tok = Tokenizer.from_str(tokenizer_json_from_gguf(gguf.GGUFReader(path)))
    llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    try:
        for text in _texts():
            # add_bos=True: llama.cpp adds BOS only where the file (or its default for this pre) says so
            want = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
            assert tok.encode(text).ids == want, f"{pre}: ids differ on {text[:50]!r}"
    finally:
        llm.close()


def _write_sentencepiece(src_reader, path: str, space_prefix: bool) -> None:
    """A SentencePiece-style vocabulary (tokenizer.ggml.model 'llama') made from SmolLM2's:
    its byte-level pieces that are valid UTF-8, ' ' written as U+2581, scores by rank, only
    pieces whose characters are pieces themselves (as SentencePiece guarantees), plus
    <unk> <s> </s> and the 256 <0xXX> byte-fallback tokens."""
    from tinyloop.grammar_vocab import gpt2_unicode_to_byte

    table = gpt2_unicode_to_byte()
    src_tokens = src_reader.fields["tokenizer.ggml.tokens"].contents()
    src_types = src_reader.fields["tokenizer.ggml.token_type"].contents()
    pieces, seen = [], set()
    for t, ty in zip(src_tokens, src_types):
        if ty != 1:
            continue
        try:
            s = bytes(table[c] for c in t).decode("utf-8").replace(" ", "\u2581")
        except UnicodeDecodeError:
            continue
        if s and s not in seen:
            seen.add(s)
            pieces.append(s)
    pieces = pieces[:20000]
    chars = {p for p in pieces if len(p) == 1}
    pieces = [p for p in pieces if all(c in chars for c in p)]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    w = gguf.GGUFWriter(path, "llama")
    for key, f in src_reader.fields.items():
        if key.startswith(("GGUF.", "tokenizer.")) or key == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), f.types[0], sub_type=f.types[1])
        else:
            w.add_key_value(key, f.contents(), f.types[0])
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(pieces))
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(pieces))])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_space_prefix(space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("space_prefix", [True, False])
def test_sentencepiece_vocabulary_gives_llama_cpp_ids(source, tmp_path, space_prefix):
    from tokenizers import Tokenizer

    path = str(tmp_path / "spm.gguf")
    _write_sentencepiece(source, path, space_prefix)
    tok = Tokenizer.from_str(tokenizer_json_from_gguf(gguf.GGUFReader(path)))
    llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    try:
        for text in _texts() + ["<s>x</s> y", "", " "]:
            want = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
            assert tok.encode(text).ids == want, f"ids differ on {text[:50]!r}"
    finally:
        llm.close()
