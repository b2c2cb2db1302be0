"""Corpus loading, the train / held-out split, and cached token arrays.

Split: for every file corpus/*.txt (sorted by name), the last 5% of its characters
(`held = text[n - ceil(0.05 n):]` with n = len(text) in Unicode code points) is held out;
the rest is training text. The tokenizer is trained on the training text only.

Token streams: each file's slice is encoded separately and followed by `<|endoftext|>`;
the streams of all files are concatenated in file-name order (train and held-out alike).
Arrays are cached under tools/train/.cache keyed by a hash of the tokenizer and the corpus.
"""
import hashlib
import math
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CORPUS = "/work/shared/data/corpus"
CACHE_DIR = os.path.join(HERE, ".cache")
HELD_OUT_FRACTION = 0.05


def corpus_files(corpus_dir):
    files = sorted(f for f in os.listdir(corpus_dir) if f.endswith(".txt"))
    if not files:
        raise SystemExit(f"no *.txt files in {corpus_dir}")
    return [os.path.join(corpus_dir, f) for f in files]


def load_split(corpus_dir=DEFAULT_CORPUS, frac=HELD_OUT_FRACTION):
    """Returns (train, held) as lists of (file name, text)."""
    train, held = [], []
    for path in corpus_files(corpus_dir):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        n = len(text)
        cut = n - int(math.ceil(frac * n))
        name = os.path.basename(path)
        train.append((name, text[:cut]))
        held.append((name, text[cut:]))
    return train, held


def corpus_digest(corpus_dir):
    h = hashlib.sha256()
    for path in corpus_files(corpus_dir):
        h.update(os.path.basename(path).encode())
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:16]


def encode_stream(tok, parts, eot_id):
    out = []
    for _, text in parts:
        # encode in chunks of lines so huge files do not need one giant call
        lines = text.splitlines(keepends=True)
        chunk = 2000
        for i in range(0, len(lines), chunk):
            for enc in tok.encode_batch(["".join(lines[i:i + chunk])]):
                out.extend(enc.ids)
        out.append(eot_id)
    return np.asarray(out, dtype=np.int32)


def get_tokenizer_and_data(corpus_dir=DEFAULT_CORPUS, vocab_size=8192, log=print,
                           kind="bytelevel", encode=True):
    """Trains (or loads from cache) the tokenizer; returns (tokenizer_json_text, eot_id,
    train_ids, held_ids). With encode=False the token arrays are None (task-only runs)."""
    from tokenizers import Tokenizer

    import tokenizer as tkmod

    os.makedirs(CACHE_DIR, exist_ok=True)
    cdig = corpus_digest(corpus_dir)
    tag = "" if kind == "bytelevel" else f"-{kind}"
    tok_path = os.path.join(CACHE_DIR, f"tokenizer-{cdig}-{vocab_size}{tag}.json")
    train_txt, held_txt = load_split(corpus_dir)
    if not os.path.exists(tok_path):
        log(f"training tokenizer (vocab {vocab_size}) on the training slice ...")
        tok = tkmod.train_tokenizer([t for _, t in train_txt], vocab_size, kind)
        tok.save(tok_path + ".tmp")
        os.replace(tok_path + ".tmp", tok_path)
    with open(tok_path, encoding="utf-8") as f:
        tok_json = f.read()
    tok = Tokenizer.from_str(tok_json)
    eot_id = tok.token_to_id(tkmod.EOT)
    if not encode:
        return tok_json, eot_id, None, None
    thash = hashlib.sha256(tok_json.encode()).hexdigest()[:16]
    npz_path = os.path.join(CACHE_DIR, f"tokens-{cdig}-{thash}.npz")
    if not os.path.exists(npz_path):
        log("encoding corpus ...")
        tr = encode_stream(tok, train_txt, eot_id)
        he = encode_stream(tok, held_txt, eot_id)
        np.savez(npz_path + ".tmp.npz", train=tr, held=he)
        os.replace(npz_path + ".tmp.npz", npz_path)
    z = np.load(npz_path)
    return tok_json, eot_id, z["train"], z["held"]
