"""A cheap structural check of a GGUF file before PyPI `gguf`'s GGUFReader sees it.

GGUFReader trusts every count in the file: a 1 KB file declaring a metadata array of 2^62
elements keeps it busy for minutes and gigabytes before it fails. This walk reads the
header (metadata and tensor infos) with a cursor over a memory map, checks every count and
length against the bytes left in the file *before* stepping over them, and never builds
anything per element, so its time and memory are bounded by the file's size. It also
refuses what GGUFReader accepts silently or reports badly: duplicate metadata keys and
tensor names, more than 4 dimensions, tensors that are misaligned, overlap one another or
run past the end of the file. Nested arrays are walked with an explicit stack.

Every problem is a ValueError naming the file and the key or tensor.
"""
from __future__ import annotations

import mmap
import os
import struct

__all__ = ["check_gguf_structure"]

# GGUFValueType -> fixed byte size (STRING = 8 and ARRAY = 9 are variable).
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4  # GGML_MAX_DIMS
_DEFAULT_ALIGNMENT = 32


def _min_size(vtype: int) -> int:
    """The fewest bytes one value of this type takes (a string: its 8-byte length; an
    array: its 4-byte type and 8-byte count)."""
    if vtype == _STRING:
        return 8
    if vtype == _ARRAY:
        return 12
    return _SCALAR_SIZES[vtype]


class _Cursor:
    def __init__(self, buf, src: str):
        self.buf, self.pos, self.src, self.size = buf, 0, src, len(buf)

    def fail(self, msg: str):
        raise ValueError(f"{self.src}: {msg}")

    def left(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> int:
        if n > self.left():
            self.fail(f"truncated: {what} needs {n} bytes at offset {self.pos}, the file has "
                      f"{self.left()} left ({self.size} bytes)")
        p = self.pos
        self.pos += n
        return p

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8, what))[0]

    def string(self, what: str) -> str:
        n = self.u64(f"the length of {what}")
        p = self.take(n, f"{what} ({n} bytes)")
        return bytes(self.buf[p:p + n]).decode("utf-8", "backslashreplace")

    def new_name(self, what: str, kind: str, seen: set) -> str:
        """A string naming a new entry: refused when `seen` (the names so far) has it;
        added to `seen`. kind: the entry in the message ("metadata key", "tensor")."""
        name = self.string(what)
        if name in seen:
            self.fail(f"{kind} '{name}' appears twice")
        seen.add(name)
        return name

    def count(self, n: int, each: int, what: str) -> None:
        """Refuse a count of items of at least `each` bytes that cannot fit in what is left."""
        if n > self.left() // max(1, each):
            self.fail(f"truncated or corrupt: {what} declares {n} elements of at least {each} "
                      f"bytes each, more than the {self.left()} bytes left in the file "
                      f"({self.size} bytes) could hold")


def _skip_value(c: _Cursor, vtype: int, key: str):
    """Steps over one metadata value (iteratively for nested arrays). Returns the value for
    scalar and string types, None for arrays."""
    if vtype == _STRING:
        return c.string(f"metadata '{key}'")
    if vtype in _SCALAR_SIZES:
        p = c.take(_SCALAR_SIZES[vtype], f"metadata '{key}'")
        fmt = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
               10: "<Q", 11: "<q", 12: "<d"}[vtype]
        return struct.unpack_from(fmt, c.buf, p)[0]
    if vtype != _ARRAY:
        c.fail(f"metadata '{key}' has unknown value type {vtype}")
    stack = []  # [element type, elements left] of each open array
    while True:
        etype = c.u32(f"the element type of metadata '{key}'")
        if etype not in _SCALAR_SIZES and etype not in (_STRING, _ARRAY):
            c.fail(f"metadata '{key}' is an array of unknown value type {etype}")
        n = c.u64(f"the element count of metadata '{key}'")
        c.count(n, _min_size(etype), f"metadata '{key}'")
        if etype in _SCALAR_SIZES:
            c.take(n * _SCALAR_SIZES[etype], f"metadata '{key}' ({n} elements)")
        elif etype == _STRING:
            for _ in range(n):
                c.take(c.u64(f"a string length in metadata '{key}'"), f"a string in metadata '{key}'")
        else:
            stack.append(n)
        # close finished arrays; open the next element of the innermost unfinished one
        while stack and stack[-1] == 0:
            stack.pop()
        if not stack:
            return None
        stack[-1] -= 1
        if len(stack) > 64:
            c.fail(f"metadata '{key}' nests arrays deeper than 64 levels")


def check_gguf_structure(path: str) -> None:
    """Raise ValueError naming the problem when `path` is not a structurally sound GGUF
    file; return None otherwise (GGUFReader then reads it)."""
    src = os.fspath(path)
    size = os.path.getsize(src)
    if size < 24:
        raise ValueError(f"{src}: truncated or corrupt: not a readable GGUF file ({size} bytes, "
                         f"too short for a header)")
    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        c = _Cursor(buf, src)
        if bytes(buf[:4]) != b"GGUF":
            c.fail(f"not a readable GGUF file (magic {bytes(buf[:4])!r}, expected b'GGUF')")
        c.pos = 4
        version = c.u32("the version")
        if version not in (2, 3):
            c.fail(f"GGUF version {version} is not supported (2 or 3)")
        n_tensors = c.u64("the tensor count")
        n_kv = c.u64("the metadata count")
        c.count(n_kv, 8 + 4 + 1, "the metadata count")
        c.count(n_tensors, 8 + 4 + 4 + 8, "the tensor count")
        keys = set()
        alignment = _DEFAULT_ALIGNMENT
        for _ in range(n_kv):
            key = c.new_name("a metadata key", "metadata key", keys)
            vtype = c.u32(f"the value type of metadata '{key}'")
            value = _skip_value(c, vtype, key)
            if key == "general.alignment":
                if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value & (value - 1):
                    c.fail(f"metadata 'general.alignment' = {value!r}: must be a power of two")
                alignment = value
        tensors = []  # (offset, nbytes, name)
        names = set()
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        for _ in range(n_tensors):
            name = c.new_name("a tensor name", "tensor", names)
            n_dims = c.u32(f"the dimension count of tensor '{name}'")
            if n_dims > _MAX_DIMS:
                c.fail(f"tensor '{name}' has {n_dims} dimensions (at most {_MAX_DIMS})")
            dims = [c.u64(f"a dimension of tensor '{name}'") for _ in range(n_dims)]
            ttype = c.u32(f"the type of tensor '{name}'")
            offset = c.u64(f"the data offset of tensor '{name}'")
            n_elems = 1
            for d in dims:
                n_elems *= d
            try:
                block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
            except (ValueError, KeyError):
                c.fail(f"tensor '{name}' has unknown GGUF tensor type {ttype}")
            if n_elems % block:
                c.fail(f"tensor '{name}': {n_elems} elements is not a whole number of "
                       f"{block}-element blocks of its type")
            if offset % alignment:
                c.fail(f"tensor '{name}' starts at data offset {offset}, not a multiple of the "
                       f"alignment {alignment} (misaligned)")
            tensors.append((offset, n_elems // block * type_size, name))
        data_start = -(-c.pos // alignment) * alignment
        data_size = size - data_start
        prev_end, prev_name = 0, None
        for offset, nbytes, name in sorted(tensors):
            if offset < prev_end:
                c.fail(f"tensors '{prev_name}' and '{name}' overlap (data offsets {offset} < "
                       f"{prev_end})")
            if offset + nbytes > data_size:
                c.fail(f"truncated: tensor '{name}' needs bytes [{offset}, {offset + nbytes}) of "
                       f"the data section, the file holds {max(0, data_size)}")
            prev_end, prev_name = offset + nbytes, name
