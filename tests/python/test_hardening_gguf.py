"""Issue 16 (hardening): crafted GGUF files are refused by name before anything large is
built, with time and peak memory bounded by the file's size (the block-count and huge-array
files of the issue), and metadata of the wrong type or range names its key."""
from __future__ import annotations

import os
import struct

import gguf
import pytest
from gguf import GGMLQuantizationType as Q

from tinyloop.convert import convert

from hardening_child import run_child
from test_convert_gguf import write_gguf

# ---- crafting -----------------------------------------------------------------------------

U32, F32_T, STRING, ARRAY, U64 = 4, 6, 8, 9, 10


def _str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv(key: str, vtype: int, raw: bytes) -> bytes:
    return _str(key) + struct.pack("<I", vtype) + raw


def kv_u32(key, v):
    return kv(key, U32, struct.pack("<I", v))


def kv_string(key, s):
    return kv(key, STRING, _str(s))


def tensor_info(name, dims, ttype, offset) -> bytes:
    return (_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<I", ttype) + struct.pack("<Q", offset))


def craft(path, kvs: list[bytes], tensors: list[bytes] = (), data: bytes = b"", n_kv=None,
          n_tensors=None) -> str:
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    body += b"\0" * ((-len(body)) % 32)
    with open(path, "wb") as f:
        f.write(body + data)
    return str(path)


def _value_offset(path, key) -> int:
    r = gguf.GGUFReader(path)
    f = r.get_field(key)
    return f.offset + sum(p.nbytes for p in f.parts[:3])


def patch(path, offset: int, raw: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(raw)


def _tensor_part_offset(path, index: int, part: int) -> int:
    r = gguf.GGUFReader(path)
    f = r.tensors[index].field
    return f.offset + sum(p.nbytes for p in f.parts[:part])


def _refused(tmp_path, src, match):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    with pytest.raises(ValueError, match=match):
        convert(src, str(out / "m.tinyloop"), progress=False)
    assert os.listdir(out) == []


# ---- the two memory blow-ups: bounded by the file size ------------------------------

def _convert_in_child(src: str, dst: str):
    """Convert in a child capped at 3 GB of address space; returns (result, peak RSS growth
    in MiB during the conversion, seconds)."""
    r = run_child("""
        import sys, time
        from tinyloop.convert import convert
        from hardening_child import peak_rss_mb
        import gguf, numpy  # imported before the baseline
        base = peak_rss_mb()
        t = time.time()
        try:
            convert(sys.argv[1], sys.argv[2], progress=False)
            print("CONVERTED")
        except ValueError as e:
            print("REFUSED", e)
        print("GROWTH_MB", peak_rss_mb() - base)
        print("SECONDS", time.time() - t)
    """, args=[src, dst], timeout=120, mem_limit_bytes=3 << 30)
    assert r.rc == 0, r.describe()
    growth = float(r.out.split("GROWTH_MB")[1].split()[0])
    seconds = float(r.out.split("SECONDS")[1].split()[0])
    return r, growth, seconds


def test_block_count_beyond_the_tensors_is_refused_with_bounded_memory(tmp_path):
    # A 27 KB file declaring block_count = 1e6 once took 7.4 GB and a minute.
    src = str(tmp_path / "m.gguf")
    write_gguf(src)
    patch(src, _value_offset(src, "llama.block_count"), struct.pack("<I", 10**6))
    r, growth, seconds = _convert_in_child(src, str(tmp_path / "m.tinyloop"))
    assert "REFUSED" in r.out and "'llama.block_count' = 1000000" in r.out, r.describe()
    size_mb = os.path.getsize(src) / 2**20
    assert growth < 32 + 8 * size_mb, r.out
    assert seconds < 10, r.out


def test_metadata_array_of_2_62_elements_is_refused_with_bounded_memory(tmp_path):
    # GGUFReader once spent minutes and ~8 GB on this before failing.
    src = craft(tmp_path / "arr.gguf", [
        kv_string("general.architecture", "llama"),
        kv("tokenizer.ggml.scores", ARRAY, struct.pack("<IQ", F32_T, 2**62) + b"\0" * 64),
    ])
    r, growth, seconds = _convert_in_child(src, str(tmp_path / "arr.tinyloop"))
    assert "REFUSED" in r.out and "'tokenizer.ggml.scores' declares 4611686018427387904 elements" in r.out, \
        r.describe()
    assert growth < 32 and seconds < 10, r.out


@pytest.mark.parametrize("etype,count,what", [
    (STRING, 2**40, "declares 1099511627776 elements of at least 8 bytes"),
    (ARRAY, 2**40, "declares 1099511627776 elements of at least 12 bytes"),
])
def test_string_and_nested_array_counts_are_checked(tmp_path, etype, count, what):
    src = craft(tmp_path / "a.gguf", [kv("x.list", ARRAY, struct.pack("<IQ", etype, count) + b"\0" * 40)])
    _refused(tmp_path, src, what)


def test_header_counts_are_checked_against_the_file(tmp_path):
    src = craft(tmp_path / "n.gguf", [kv_string("general.architecture", "llama")], n_kv=2**60)
    _refused(tmp_path, src, "the metadata count declares 1152921504606846976 elements")
    src = craft(tmp_path / "t.gguf", [kv_string("general.architecture", "llama")], n_tensors=2**50)
    _refused(tmp_path, src, "the tensor count declares")


def test_valid_nested_arrays_pass_the_check(tmp_path):
    from tinyloop.convert.gguf_check import check_gguf_structure
    inner = struct.pack("<IQ", U32, 2) + struct.pack("<II", 1, 2)
    src = craft(tmp_path / "ok.gguf", [kv("x.nested", ARRAY, struct.pack("<IQ", ARRAY, 3) + inner * 3),
                                       kv_string("general.architecture", "llama")])
    check_gguf_structure(src)  # no exception
    assert gguf.GGUFReader(src).get_field("general.architecture") is not None


# ---- wrong types, zeros, ranges -----------------------------------------------------------

def test_block_count_as_a_string_is_refused_by_name(tmp_path):
    src = craft(tmp_path / "s.gguf", [kv_string("general.architecture", "llama"),
                                      kv_string("llama.block_count", "3")])
    _refused(tmp_path, src, r"'llama.block_count' must be an integer, got str '3'")


def test_head_count_zero_is_a_value_error_naming_it(tmp_path):
    src = str(tmp_path / "h.gguf")
    write_gguf(src)
    patch(src, _value_offset(src, "llama.attention.head_count"), struct.pack("<I", 0))
    _refused(tmp_path, src, r"'llama.attention.head_count' = 0: must be >= 1")


def test_zero_dimension_embedding_is_refused_by_name(tmp_path):
    src = str(tmp_path / "z.gguf")
    write_gguf(src)
    r = gguf.GGUFReader(src)
    index = next(i for i, t in enumerate(r.tensors) if t.name == "token_embd.weight")
    del r
    patch(src, _tensor_part_offset(src, index, 3), struct.pack("<Q", 0))  # dims[0] (columns) = 0
    _refused(tmp_path, src, r"tensor 'token_embd.weight' has shape \[72, 0\]")


def test_context_length_beyond_the_engine_limit_is_refused_at_conversion(tmp_path):
    # It converted to a file the engine then refused.
    src = str(tmp_path / "c.gguf")
    write_gguf(src)
    off = _value_offset(src, "llama.context_length")
    ftype = gguf.GGUFReader(src).get_field("llama.context_length").types[0]
    assert ftype == gguf.GGUFValueType.UINT32
    patch(src, off, struct.pack("<I", 2**31))
    _refused(tmp_path, src, r"'llama.context_length' = 2147483648: must be <= 16777216")


# ---- tensors: misaligned, overlapping, duplicate keys -----------------------------------------

def test_misaligned_tensor_is_refused(tmp_path):
    src = str(tmp_path / "mis.gguf")
    write_gguf(src)
    off = _tensor_part_offset(src, 1, 5)
    (old,) = struct.unpack("<Q", open(src, "rb").read()[off:off + 8])
    patch(src, off, struct.pack("<Q", old + 4))
    _refused(tmp_path, src, r"starts at data offset \d+, not a multiple of the alignment 32 \(misaligned\)")


def test_overlapping_tensors_are_refused(tmp_path):
    src = str(tmp_path / "ov.gguf")
    write_gguf(src)
    first = _tensor_part_offset(src, 0, 5)
    (start0,) = struct.unpack("<Q", open(src, "rb").read()[first:first + 8])
    patch(src, _tensor_part_offset(src, 2, 5), struct.pack("<Q", start0 + 32))
    _refused(tmp_path, src, r"tensors '.*' and '.*' overlap")


def test_duplicate_metadata_key_is_refused(tmp_path):
    src = craft(tmp_path / "d.gguf", [kv_string("general.architecture", "llama"), kv_u32("llama.block_count", 3),
                                      kv_u32("llama.block_count", 4)])
    _refused(tmp_path, src, r"metadata key 'llama.block_count' appears twice")


def test_a_valid_file_still_converts(tmp_path):
    src = str(tmp_path / "ok.gguf")
    write_gguf(src, Q.Q8_0)
    out = convert(src, str(tmp_path / "ok.tinyloop"), progress=False)
    assert os.path.getsize(out) > 0


# ---- a small fuzz: mutated headers are refused (ValueError) or converted, nothing else ------

def test_mutated_gguf_files_are_refused_or_converted():
    r = run_child("""
        import collections, os, random, tempfile
        from gguf import GGMLQuantizationType as Q
        from tinyloop.convert import convert
        from test_convert_gguf import write_gguf

        d = tempfile.mkdtemp()
        src = os.path.join(d, "base.gguf")
        write_gguf(src, Q.Q8_0, tokenizer_model="gpt2")
        base = open(src, "rb").read()
        rng = random.Random(16)
        outcomes = collections.Counter()
        for i in range(200):
            b = bytearray(base)
            if rng.random() < 0.15:
                b = b[:rng.randrange(len(b))]
            else:  # bytes of the header: counts, lengths, types, dims, offsets
                for _ in range(rng.randint(1, 4)):
                    b[rng.randrange(min(len(b), 4096))] = rng.choice([0, 0xff, 0x7f, 0x80, rng.randrange(256)])
            m, out = os.path.join(d, "m.gguf"), os.path.join(d, "m.tinyloop")
            open(m, "wb").write(b)
            try:
                convert(m, out, progress=False)
                outcomes["converted"] += 1
            except ValueError:
                outcomes["refused"] += 1
            if os.path.exists(out):
                os.unlink(out)
        from hardening_child import peak_rss_mb
        print("OUTCOMES", dict(outcomes))
        print("MAXRSS_MB", peak_rss_mb())
    """, timeout=300, mem_limit_bytes=3 << 30)
    assert r.rc == 0, r.describe()  # any other exception, a crash or a blow-up fails here
    assert "refused" in r.out and "converted" in r.out, r.out
    # Every file is 100 KB: no mutation may make the reader allocate what a count declares.
    assert float(r.out.split("MAXRSS_MB")[1].split()[0]) < 400, r.out
