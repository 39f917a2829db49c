"""Reads a safetensors file with nothing but the standard library and PyTorch, following the
format's specification (8-byte little-endian header length, JSON header, raw data): an independent
reader for remat's files."""
import json
import struct

import torch

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I32": torch.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"])
    return out
