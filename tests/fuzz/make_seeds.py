#!/usr/bin/env python3
"""make_seeds.py — writes the hand-made seed inputs of the fuzz corpora (tests/fuzz/corpus/).

The committed corpus is these seeds plus what libFuzzer found and `scripts/fuzz.sh
--update-corpus` merged in (minimized). Rerunning this script only rewrites the seed-* files.
Layouts of the inputs are described at the top of each fuzz_<target>.c.
"""
import gzip
import json
import os
import random
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


# ---- safetensors: the file itself -------------------------------------------------------------
def safetensors(tensors, metadata=None, pad=True):
    """tensors: list of (name, dtype, shape, raw bytes), laid out in order."""
    header, off, blob = {}, 0, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blob += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + blob


def f32(*v):
    return struct.pack("<%df" % len(v), *v)


def seeds_safetensors():
    t = "fuzz_safetensors"
    write(t, "empty", safetensors([], {"format": "pt"}))
    write(t, "bn-state", safetensors([
        ("bn.weight", "F32", [3], f32(1, 2, 3)),
        ("bn.bias", "F32", [3], f32(0, -1, 0.5)),
        ("bn.running_mean", "F32", [3], f32(0.1, 0.2, 0.3)),
        ("bn.running_var", "F32", [3], f32(1, 1.5, 2)),
        ("bn.num_batches_tracked", "I64", [], struct.pack("<q", 7)),
    ], {"format": "pt"}))
    write(t, "bn-state-nan", safetensors([
        ("weight", "F32", [2], f32(1, 1)),
        ("bias", "F32", [2], f32(0, 0)),
        ("running_mean", "F32", [2], f32(float("nan"), float("inf"))),
        ("running_var", "F32", [2], f32(-1, float("nan"))),
        ("num_batches_tracked", "I64", [1], struct.pack("<q", -1)),
    ]))
    write(t, "dtypes", safetensors([
        ("a", "F64", [2], struct.pack("<2d", 1.5, -2)),
        ("b", "I64", [1, 1], struct.pack("<q", 3)),
        ("c", "F32", [2, 1], f32(4, 5)),
        ("d", "BF16", [3], b"\x80\x3f\x00\x40\x40\x40"),
        ("e", "F16", [1], b"\x00\x3c"),
        ("f", "F32", [0, 5], b""),
    ]))
    write(t, "other-dtypes", safetensors([  # listed and validated, refused by get only
        ("bn.weight", "F32", [2], f32(1, 2)),
        ("tok.ids", "I32", [3], struct.pack("<3i", 1, 2, 3)),
        ("mask", "BOOL", [2], b"\x01\x00"),
        ("q", "F8_E4M3", [1], b"\x38"),
        ("n", "U64", [1], struct.pack("<Q", 5)),
        ("s", "F8_E8M0", [1], b"\x7f"),
        ("w4", "F4", [2], b"\x21"),
        ("bn.num_batches_tracked", "I64", [], struct.pack("<q", 1)),
    ]))
    write(t, "8-dims", safetensors([("x", "F32", [1] * 8, f32(9))], pad=False))
    write(t, "unpadded", safetensors([("x", "F32", [2], f32(1, 2))], pad=False))
    # invalid ones: the loader must say SN_ERR_FORMAT
    good = safetensors([("x", "F32", [2], f32(1, 2)), ("y", "F32", [1], f32(3))])
    write(t, "truncated", good[:-2])
    write(t, "trailing", good + b"\0")
    write(t, "short", b"\x02\0\0\0\0\0\0\0{")
    write(t, "huge-len", b"\xff" * 8 + b"{}")
    h = b'{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"y":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    write(t, "overlap", struct.pack("<Q", len(h)) + h + f32(1))
    h = b'{"x":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}}'
    write(t, "overflow-shape", struct.pack("<Q", len(h)) + h)
    h = b'{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
    write(t, "duplicate", struct.pack("<Q", len(h)) + h + f32(1, 2))


# ---- IDX: control byte, then the content --------------------------------------------------------
def idx(ndim, dims, data):
    return bytes([0, 0, 8, ndim]) + b"".join(struct.pack(">I", d) for d in dims) + bytes(data)


def seeds_idx():
    t = "fuzz_idx"
    img = idx(3, [2, 2, 3], range(12))
    lab = idx(1, [2], [1, 9])
    write(t, "read1", bytes([0]) + b"\0\0" + lab)
    write(t, "read3", bytes([1]) + b"\0\0" + img)
    write(t, "read3-gz", bytes([1 | 4]) + b"\0\0" + img)
    write(t, "read3-gz-cut", bytes([1 | 4 | 8]) + b"\x20\0" + img)
    write(t, "read3-gz-flip", bytes([1 | 4 | 16]) + b"\0\x40" + img)
    write(t, "read-ndim2", bytes([2]) + b"\x02\0\0" + idx(2, [2, 2], range(4)))
    write(t, "read-raw-gzip", bytes([1]) + b"\0\0" + gzip.compress(img)[:-1])
    write(t, "read-zero-dim", bytes([1]) + b"\0\0" + idx(3, [0, 28, 28], []))
    write(t, "read-big-dims", bytes([1]) + b"\0\0" + idx(3, [60000, 65535, 65535], []))
    write(t, "msg-short", bytes([1 | 32]) + b"\x05\0\0" + img[:-1])
    n = len(img)
    write(t, "dataset", bytes([3]) + b"\0\0" + struct.pack("<H", n) + b"\x32\x0a" + img + lab)
    write(t, "dataset-gz", bytes([3 | 4]) + b"\0\0" + struct.pack("<H", n) + b"\x00\x0a" + img + lab)
    write(t, "dataset-label-range", bytes([3]) + b"\0\0" + struct.pack("<H", n) + b"\x00\x05" + img + lab)
    write(t, "dataset-count", bytes([3]) + b"\0\0" + struct.pack("<H", n) + b"\x00\x0a" + img + idx(1, [3], [0, 1, 2]))


# ---- kernels: a sequence of operations ----------------------------------------------------------
def seeds_kernels():
    t = "fuzz_kernels"
    rnd = random.Random(20240601)
    # each op id, "tame" (second byte & 3 != 0): small valid sizes, valid enums, few NULLs
    for op in range(19):
        body = bytes([op, 0x01, 0x03, 0x05, 0x02, 0x01, 0x00, 0x01, 0x00, 0x02]) + b"\xff" * 16
        body += bytes(rnd.randrange(256) for _ in range(24))
        write(t, "op%02d" % op, body)
    # op 19 (sn_batchnorm_bwd) came later: random bytes of its own, so the seeds after it stay
    r19 = random.Random(19)
    body = bytes([19, 0x01, 0x03, 0x05, 0x02, 0x01, 0x00, 0x01, 0x00, 0x02]) + b"\xff" * 16
    body += bytes(r19.randrange(256) for _ in range(24))
    write(t, "op19", body)
    # op 20 (sn_batchnorm_fwd) came after it, the same way
    r20 = random.Random(20)
    body = bytes([20, 0x01, 0x03, 0x05, 0x02, 0x01, 0x00, 0x01, 0x00, 0x02]) + b"\xff" * 16
    body += bytes(r20.randrange(256) for _ in range(24))
    write(t, "op20", body)
    # a SyncBatchNorm sequence (op 17, tame): C = 2 (tame size index 1), no config change, no
    # communicator; forward (training) on data mode 4 (NaN/Inf among normal values), then a
    # training forward and a backward on small integers (mode 0)
    sb = bytes([17, 0x01, 0x01, 0x00, 0x00])
    sb += bytes([0x02, 0x03, 0x00, 0xff, 0x04, 0, 0, 0, 0, 0xff])
    sb += bytes([0x02, 0x03, 0x00, 0xff, 0x00, 1, 2, 3, 4, 0xff])
    sb += bytes([0x09, 0xff, 0x00, 5, 6, 7, 8, 0xff])
    write(t, "syncbn-seq", sb)
    for i in range(8):
        write(t, "random%d" % i, bytes(rnd.randrange(256) for _ in range(rnd.randrange(16, 200))))


if __name__ == "__main__":
    seeds_safetensors()
    seeds_idx()
    seeds_kernels()
    sys.exit(0)
