"""Byte-level BPE tokenizer for the bundled TinyLoop demo model.

Trained with Hugging Face `tokenizers` on the *training slice* of the corpus only
(see data.py for the split). `<|endoftext|>` is the single special token (id 0) and is
used as EOS between files. The trainer is deterministic for a fixed input, so the
same corpus gives the same tokenizer.json byte for byte.

    python3 tools/train/tokenizer.py --out tools/train/.cache/tokenizer.json
"""
import argparse
import os
import sys

EOT = "<|endoftext|>"


KINDS = ("bytelevel", "digits")


def train_tokenizer(texts, vocab_size=8192, kind="bytelevel"):
    """kind "bytelevel": GPT-2 style ByteLevel pre-tokenizer (today's bundled model).
    kind "digits": Sequence([Digits(individual_digits=True), ByteLevel]), so every digit is
    its own token (the synthetic arithmetic tasks of tasks.py need that)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if kind == "digits":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), bl])
    elif kind == "bytelevel":
        tok.pre_tokenizer = bl
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}")
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def main(argv=None):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import data

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=data.DEFAULT_CORPUS)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--kind", default="bytelevel", choices=KINDS)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    train, _ = data.load_split(a.corpus)
    tok = train_tokenizer([t for _, t in train], a.vocab_size, a.kind)
    tok.save(a.out)
    print(f"wrote {a.out}: vocab {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()
