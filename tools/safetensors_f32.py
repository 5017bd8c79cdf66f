"""Reads a safetensors file of F32 tensors (what yuanlm writes for weights, checkpoints and exports), and writes
one, with numpy alone: 8-byte little-endian header length, JSON header, raw data. Shared by check_export.py, the
fixture writers and the tests."""
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


def write_safetensors(path, tensors, metadata):
    """Minimal safetensors writer (the safetensors package is not a dependency): wider dtypes first so every
    tensor is aligned, header padded with spaces to 8 bytes, as the reference implementation does."""
    codes = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}
    items = sorted(tensors.items(), key=lambda kv: -kv[1].dtype.itemsize)  # stable: insertion order otherwise
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, a in items:
        b = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = dict(dtype=codes[a.dtype], shape=list(a.shape), data_offsets=[offset, offset + len(b)])
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))
