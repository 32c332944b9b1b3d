#!/usr/bin/env python3
"""st.py — minimal safetensors reader/writer on torch tensors (no safetensors package needed).

Format: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
then the raw little-endian data. Tensor names are written sorted; the header is space-padded so the
data starts at a multiple of 8. Supported dtypes: F32, F16, BF16, U32, I32, I64, U8.
"""
import json
import struct

import torch

_DT = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32,
       "I64": torch.int64, "U8": torch.uint8, "U32": None}
_NAME = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int32: "I32",
         torch.int64: "I64", torch.uint8: "U8"}


def save(path, tensors, metadata=None, u32=()):
    """tensors: {name: tensor}; names in `u32` are int32/int64 tensors stored as U32 (values < 2^32)."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if name in u32:
            t64 = t.to(torch.int64)
            assert int(t64.min()) >= 0 and int(t64.max()) < 2 ** 32, name
            t = (t64 - (t64 >= 2 ** 31).to(torch.int64) * 2 ** 32).to(torch.int32)
            dt = "U32"
        else:
            dt = _NAME[t.dtype]
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - (8 + len(hj)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)


def load(path):
    """{name: tensor} (U32 comes back as int64 holding the unsigned values), and the metadata."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        buf = bytearray(data[base + a:base + b])
        if h["dtype"] == "U32":
            t = torch.frombuffer(buf, dtype=torch.int32).to(torch.int64) & 0xFFFFFFFF if buf else torch.zeros(0, dtype=torch.int64)
        else:
            t = torch.frombuffer(buf, dtype=_DT[h["dtype"]]) if buf else torch.zeros(0, dtype=_DT[h["dtype"]])
        out[name] = t.reshape(h["shape"])
    return out, meta
