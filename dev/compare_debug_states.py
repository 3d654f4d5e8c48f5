#!/usr/bin/env python3
"""
Debug-state files (.fxds): the format, a reader, a writer, and a record-by-record comparer.

Format (little-endian):
  header: int32 magic 20261121, int32 version 1, int32 n_records
  record: int32 name_len, name bytes (no NUL), int32 dtype (0 float32, 1 int32, 2 text UTF-8,
          3 float64), int32 ndim, int64 dims[ndim], then prod(dims) elements (text: dims = [n_bytes])

Usage:
  python3 dev/compare_debug_states.py A.fxds B.fxds [--rtol 1e-9]
  python3 dev/compare_debug_states.py DIR_A DIR_B [--rtol 1e-9]
Two folders are compared file by file (every .fxds in either must be in both). Records must have
the same names in the same order, the same dtypes and shapes; text and int32 records must be
equal; a float record passes when max|a - b| / (max|b| + 1e-30) <= rtol, so B is the reference.
Exits 1 if anything differs, 2 on unreadable input.

Others import read_debug_state(path) -> {name: numpy array or str}, in file order.
"""
import argparse
import difflib
import os
import struct
import sys

import numpy as np

MAGIC = 20261121
VERSION = 1
DTYPE_FLOAT32, DTYPE_INT32, DTYPE_TEXT, DTYPE_FLOAT64 = 0, 1, 2, 3
NUMERIC_DTYPES = {DTYPE_FLOAT32: np.dtype("<f4"), DTYPE_INT32: np.dtype("<i4"), DTYPE_FLOAT64: np.dtype("<f8")}


class DebugStateError(Exception):
    pass


def read_debug_state(path):
    with open(path, "rb") as f:
        buf = f.read()
    pos = 0

    def take(n, what):
        nonlocal pos
        if pos + n > len(buf):
            raise DebugStateError(f"{path}: truncated while reading {what} at byte {pos}. "
                                  "HINT: the writer was interrupted or this is not a .fxds file")
        chunk = buf[pos:pos + n]
        pos += n
        return chunk

    magic, version, n_records = struct.unpack("<iii", take(12, "header"))
    if magic != MAGIC:
        raise DebugStateError(f"{path}: bad magic {magic}, expected {MAGIC}. "
                              "HINT: this is not a debug-state (.fxds) file")
    if version != VERSION:
        raise DebugStateError(f"{path}: version {version}, this reader knows {VERSION}. "
                              "HINT: regenerate the file with the current writer")
    state = {}
    for _ in range(n_records):
        (name_len,) = struct.unpack("<i", take(4, "name length"))
        name = take(name_len, "name").decode("utf-8")
        dtype, ndim = struct.unpack("<ii", take(8, f"dtype of {name}"))
        dims = struct.unpack(f"<{ndim}q", take(8 * ndim, f"dims of {name}"))
        count = int(np.prod(dims, dtype=np.int64))
        if dtype == DTYPE_TEXT:
            value = take(count, f"text of {name}").decode("utf-8")
        elif dtype in NUMERIC_DTYPES:
            dt = NUMERIC_DTYPES[dtype]
            value = np.frombuffer(take(count * dt.itemsize, f"data of {name}"), dtype=dt).reshape(dims)
            value = value.astype(dt.newbyteorder("="))
        else:
            raise DebugStateError(f"{path}: record {name} has unknown dtype {dtype}. "
                                  "HINT: dtypes are 0 float32, 1 int32, 2 text, 3 float64")
        if name in state:
            raise DebugStateError(f"{path}: record {name} appears twice. HINT: fix the writer")
        state[name] = value
    if pos != len(buf):
        raise DebugStateError(f"{path}: {len(buf) - pos} bytes after the last record. "
                              "HINT: n_records in the header is wrong")
    return state


def write_debug_state(path, records):
    # records: list of (name, value), value a str (text) or a numpy float32/int32/float64 array
    codes = {np.dtype(np.float32): DTYPE_FLOAT32, np.dtype(np.int32): DTYPE_INT32,
             np.dtype(np.float64): DTYPE_FLOAT64}
    out = [struct.pack("<iii", MAGIC, VERSION, len(records))]
    for name, value in records:
        name_bytes = name.encode("utf-8")
        out.append(struct.pack("<i", len(name_bytes)) + name_bytes)
        if isinstance(value, str):
            data = value.encode("utf-8")
            out.append(struct.pack("<iiq", DTYPE_TEXT, 1, len(data)) + data)
            continue
        if value.dtype not in codes:
            raise DebugStateError(f"record {name}: dtype {value.dtype} cannot be written. "
                                  "HINT: convert to float32, int32 or float64 first")
        code = codes[value.dtype]
        out.append(struct.pack(f"<ii{value.ndim}q", code, value.ndim, *value.shape))
        out.append(np.ascontiguousarray(value, dtype=NUMERIC_DTYPES[code]).tobytes())
    with open(path, "wb") as f:
        f.write(b"".join(out))


def compare_record(name, a, b, rtol):
    # returns (error message or None, relative error of a float record or 0)
    if isinstance(a, str) or isinstance(b, str):
        if a != b:
            lines = difflib.unified_diff(str(b).splitlines(), str(a).splitlines(), "B", "A", n=0, lineterm="")
            return f"{name}: text differs:\n" + "\n".join(lines), 0.0
        return None, 0.0
    if a.dtype != b.dtype:
        return f"{name}: dtype {a.dtype} vs {b.dtype}", 0.0
    if a.shape != b.shape:
        return f"{name}: shape {a.shape} vs {b.shape}", 0.0
    if a.dtype == np.int32:
        if not np.array_equal(a, b):
            n_diff = int(np.count_nonzero(a != b))
            return f"{name}: {n_diff} of {a.size} int32 entries differ", 0.0
        return None, 0.0
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return f"{name}: non-finite values (A {int(np.sum(~np.isfinite(a)))}, B {int(np.sum(~np.isfinite(b)))})", 0.0
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    diff = np.abs(a64 - b64)
    err = float(diff.max() / (np.abs(b64).max() + 1e-30)) if a.size else 0.0
    if err > rtol:
        where = np.unravel_index(int(diff.argmax()), a.shape)
        return (f"{name}: relative error {err:.3e} > {rtol:.1e} "
                f"(worst at {tuple(int(i) for i in where)}: A {a64[where]!r}, B {b64[where]!r})"), err
    return None, err


def compare_states(a, b, rtol):
    # returns (list of mismatch messages, worst float relative error)
    problems = []
    only_a = [n for n in a if n not in b]
    only_b = [n for n in b if n not in a]
    if only_a:
        problems.append(f"records only in A: {', '.join(only_a)}")
    if only_b:
        problems.append(f"records only in B: {', '.join(only_b)}")
    common_a = [n for n in a if n in b]
    common_b = [n for n in b if n in a]
    if common_a != common_b:
        problems.append("records are in a different order")
    worst = 0.0
    for name in common_a:
        msg, err = compare_record(name, a[name], b[name], rtol)
        worst = max(worst, err)
        if msg:
            problems.append(msg)
    return problems, worst


def file_pairs(path_a, path_b):
    # returns (list of (label, file A, file B), list of problems about unmatched files)
    if os.path.isdir(path_a) and os.path.isdir(path_b):
        names_a = {n for n in os.listdir(path_a) if n.endswith(".fxds")}
        names_b = {n for n in os.listdir(path_b) if n.endswith(".fxds")}
        problems = [f"{n}: only in {path_a}" for n in sorted(names_a - names_b)]
        problems += [f"{n}: only in {path_b}" for n in sorted(names_b - names_a)]
        pairs = [(n, os.path.join(path_a, n), os.path.join(path_b, n)) for n in sorted(names_a & names_b)]
        if not pairs and not problems:
            problems.append(f"no .fxds files in {path_a} or {path_b}")
        return pairs, problems
    if os.path.isfile(path_a) and os.path.isfile(path_b):
        return [(os.path.basename(path_a), path_a, path_b)], []
    raise DebugStateError(f"{path_a} and {path_b} must be two files or two folders. "
                          "HINT: check both paths exist")


def main():
    parser = argparse.ArgumentParser(description="Compare debug-state (.fxds) files record by record.")
    parser.add_argument("a", help="file or folder under test")
    parser.add_argument("b", help="reference file or folder (the tolerance is relative to its values)")
    parser.add_argument("--rtol", type=float, default=1e-9,
                        help="max |a-b| / (max|b| + 1e-30) allowed per float record (default 1e-9)")
    args = parser.parse_args()
    try:
        pairs, problems = file_pairs(args.a, args.b)
        for problem in problems:
            print(f"MISMATCH {problem}")
        n_bad = len(problems)
        for label, fa, fb in pairs:
            record_problems, worst = compare_states(read_debug_state(fa), read_debug_state(fb), args.rtol)
            for problem in record_problems:
                print(f"MISMATCH {label}: {problem}")
            if record_problems:
                n_bad += 1
            else:
                print(f"ok {label} (worst relative error {worst:.2e})")
    except (DebugStateError, OSError, UnicodeDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"{len(pairs)} files compared, {n_bad} with mismatches")
    sys.exit(1 if n_bad else 0)


if __name__ == "__main__":
    main()
