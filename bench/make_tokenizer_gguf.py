#!/usr/bin/env python3
"""Writes a GGUF's metadata without its tensors: a tokenizer-only GGUF.

lmserve reads a tokenizer (and a chat template) from a GGUF's metadata alone, so a benchmark that
runs a model of random weights (`--load-format dummy`, its shape from bench/configs) can still use
the real model's tokenizer: for the demo model, 1.8 MB instead of 94 MB. The output holds every
key-value pair of the input, unchanged, and no tensors (tensor count 0).

    bench/make_tokenizer_gguf.py ~/.cache/lmserve/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        smollm-tokenizer.gguf
"""

import struct
import sys

# GGUF value types (ggml's gguf.h): fixed sizes; 8 is a string, 9 an array.
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9


def skip_value(data, pos, kind):
    if kind in FIXED:
        return pos + FIXED[kind]
    if kind == STRING:
        (length,) = struct.unpack_from("<Q", data, pos)
        return pos + 8 + length
    if kind == ARRAY:
        item_kind, count = struct.unpack_from("<IQ", data, pos)
        pos += 12
        if item_kind in FIXED:
            return pos + count * FIXED[item_kind]
        for _ in range(count):
            pos = skip_value(data, pos, item_kind)
        return pos
    raise ValueError(f"unknown GGUF value type {kind} at byte {pos}")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: make_tokenizer_gguf.py MODEL.gguf OUT.gguf")
    with open(sys.argv[1], "rb") as f:
        data = f.read()
    magic, version, _tensors, num_kv = struct.unpack_from("<4sIQQ", data, 0)
    if magic != b"GGUF" or version < 2:
        sys.exit(f"{sys.argv[1]}: not a GGUF of version 2 or later")
    pos = 24
    for _ in range(num_kv):
        (key_len,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + key_len
        (kind,) = struct.unpack_from("<I", data, pos)
        pos = skip_value(data, pos + 4, kind)
    out = bytearray(struct.pack("<4sIQQ", magic, version, 0, num_kv))
    out += data[24:pos]
    out += b"\0" * (-len(out) % 32)  # the (empty) tensor data starts aligned
    with open(sys.argv[2], "wb") as f:
        f.write(out)
    print(f"{sys.argv[2]}: {num_kv} metadata entries, {len(out)} bytes")


if __name__ == "__main__":
    main()
