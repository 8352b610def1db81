#!/usr/bin/env python3
"""Decrypts an upload the Swift code produced, from its parts on disk, and checks the result.

Usage: check_upload.py DIR, where DIR holds upload.json ({"key", "header"}), chunks/N (sealed
chunk N) and expected/*.jsonl (what the store holds for the selection). Exit status 0 when the
upload decrypts, the zip opens with the standard zipfile module, and the files equal expected.
Also checks that a tampered, a reordered and a truncated upload fail.
"""
import json
import os
import sys

import dredge_spec as spec

d = sys.argv[1]
with open(os.path.join(d, "upload.json")) as f:
    upload = json.load(f)
key, header = bytes.fromhex(upload["key"]), upload["header"]
chunks = []
for i in range(header["chunk_count"]):
    with open(os.path.join(d, "chunks", str(i)), "rb") as f:
        chunks.append(f.read())

manifest, files = spec.read_payload(spec.open_upload(key, header, chunks))
expected = {}
for name in sorted(os.listdir(os.path.join(d, "expected"))):
    with open(os.path.join(d, "expected", name), encoding="utf-8") as f:
        expected[name] = f.read()
if files != expected:
    raise SystemExit(f"FAIL: files differ: {sorted(files)} vs {sorted(expected)}")
print(f"ok: {len(files)} files, {manifest['record_count']} records")


def fails(mutated, what):
    try:
        spec.open_upload(key, header, mutated)
    except Exception:
        print("ok: rejected", what)
        return
    raise SystemExit("FAIL: accepted " + what)


tampered = list(chunks)
tampered[0] = bytes([tampered[0][0] ^ 1]) + tampered[0][1:]
fails(tampered, "a tampered chunk")
if len(chunks) > 1:
    fails([chunks[1], chunks[0]] + chunks[2:], "reordered chunks")
    short = dict(header, chunk_count=len(chunks) - 1, plaintext_size=(len(chunks) - 1) * header["chunk_size"])
    try:
        spec.open_upload(key, short, chunks[:-1])
        raise SystemExit("FAIL: accepted a truncated upload")
    except SystemExit:
        raise
    except Exception:
        print("ok: rejected a truncated upload")
