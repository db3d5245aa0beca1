#!/usr/bin/env python3
"""Writes a copy of a safetensors file with every F32 tensor rounded to BF16 (round to
nearest, ties to even), other tensors and the metadata as they are.

usage: safetensors-bf16.py IN OUT

scripts/quality-quant.sh uses it to make the bf16 reference that the quantized backbones
are built from and measured against. Standard library only."""
import array
import json
import struct
import sys


def to_bf16(raw):
    w = array.array("I")
    w.frombytes(raw)
    if sys.byteorder != "little":
        w.byteswap()
    out = array.array("H", ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 & 0xFFFF
                            if (u & 0x7F800000) != 0x7F800000 else u >> 16 for u in w))
    if sys.byteorder != "little":
        out.byteswap()
    return out.tobytes()


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    with open(sys.argv[1], "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    names = sorted(header, key=lambda k: header[k]["data_offsets"][0])
    new, blobs, off = {}, [], 0
    for k in names:
        t = header[k]
        a, b = t["data_offsets"]
        raw = data[a:b]
        if len(raw) != b - a:
            sys.exit(f"{sys.argv[1]}: tensor {k} runs past the end of the file")
        dtype = t["dtype"]
        if dtype == "F32":
            raw, dtype = to_bf16(raw), "BF16"
        new[k] = {"dtype": dtype, "shape": t["shape"], "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if meta is not None:
        new["__metadata__"] = meta
    h = json.dumps(new, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(sys.argv[2], "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


main()
