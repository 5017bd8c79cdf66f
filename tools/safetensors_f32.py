"""Reads a safetensors file of F32 tensors (what yuanlm writes for weights, checkpoints and exports) with numpy
alone: 8-byte little-endian header length, JSON header, raw data. Shared by check_export.py and the tests."""
import json
import sys

import numpy as np


def read_f32(path):
    """({name: array of its shape}, metadata); exits naming the file and tensor for any dtype but F32."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, h in header.items():
        if h["dtype"] != "F32":
            sys.exit(f"{path}: tensor {name} is {h['dtype']}, expected F32")
        b, e = h["data_offsets"]
        tensors[name] = np.frombuffer(data[b:e], dtype="<f4").reshape(h["shape"])
    return tensors, meta
