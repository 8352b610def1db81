#!/usr/bin/env python3
"""Checks Protocol/vectors/*.json with an implementation independent of the Swift code.

Usage: check_vectors.py VECTORS_DIR. Exit status 0 when every vector holds.
"""
import hashlib
import json
import os
import sys

import jsonschema

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, padding
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

import dredge_spec as spec


def load(name):
    with open(f"{sys.argv[1]}/{name}") as f:
        return json.load(f)


def check(condition, what):
    if not condition:
        raise SystemExit("FAIL: " + what)
    print("ok:", what)


frames = load("frames.json")["frames"]
for frame in frames:
    check(spec.frame_body_field(bytes.fromhex(frame["hex"])) == frame["body_field"], f"frame {frame['name']} carries body field {frame['body_field']}")
check(len({f["body_field"] for f in frames}) == len(frames) == 21, "21 distinct message types")

kw = load("keywrap.json")
private_key = serialization.load_pem_private_key(kw["rsa_private_key_pem"].encode(), password=None)
spki = private_key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
check(spki.hex() == kw["rsa_public_key_spki"], "SPKI of the test key")
check(spec.agent_id(spki) == kw["agent_id"], "agent id = SHA-256(SPKI)[:16]")
oaep = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
check(private_key.decrypt(bytes.fromhex(kw["wrapped_key"]), oaep).hex() == kw["aes_key"], "RSA-OAEP-SHA256 key unwrap")

auth = load("auth.json")
auth_input = spec.auth_signing_input(bytes.fromhex(auth["challenge"]), auth["agent_id"])
check(auth_input.hex() == auth["signing_input"], "auth signing input")
private_key.public_key().verify(
    bytes.fromhex(auth["signature"]), auth_input, padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=32), hashes.SHA256()
)
check(True, "RSA-PSS-SHA256 auth signature")

cmd = load("command.json")
signing_input = spec.pull_command_signing_input(cmd["command"])
check(signing_input.hex() == cmd["signing_input"], "pull command signing input")
signer = ed25519.Ed25519PrivateKey.from_private_bytes(bytes.fromhex(cmd["ed25519_private_key"]))
check(signer.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex() == cmd["ed25519_public_key"], "Ed25519 public key")
check(signer.sign(signing_input).hex() == cmd["signature"], "Ed25519 command signature reproduced")
check(spec.frame_body_field(bytes.fromhex(cmd["frame"])) == 9, "pull command frame")

chunks = load("chunks.json")
header_bytes = spec.upload_header_canonical(chunks["header"])
check(header_bytes.hex() == chunks["header_canonical"], "upload header canonical bytes")
check(hashlib.sha256(header_bytes).hexdigest() == chunks["associated_data"], "associated data")
aes = AESGCM(bytes.fromhex(chunks["key"]))
prefix = bytes.fromhex(chunks["header"]["nonce_prefix"])
for c in chunks["chunks"]:
    nonce = spec.chunk_nonce(prefix, c["index"], chunks["header"]["chunk_count"])
    check(nonce.hex() == c["nonce"], f"nonce of chunk {c['index']}")
    sealed = aes.encrypt(nonce, bytes.fromhex(c["plaintext"]), bytes.fromhex(chunks["associated_data"]))
    check(sealed.hex() == c["ciphertext_and_tag"], f"AES-256-GCM chunk {c['index']} reproduced")

up = load("upload.json")
check(spec.upload_header_canonical(up["header"]).hex() == up["header_canonical"], "upload header canonical bytes")
zip_bytes = spec.open_upload(bytes.fromhex(up["key"]), up["header"], [bytes.fromhex(c) for c in up["chunks"]])
check(zip_bytes.hex() == up["zip"], "upload decrypts to the zip")
manifest, files = spec.read_payload(zip_bytes)
check(files == up["files"], "zip holds the per-day files")
check(json.loads(up["manifest"]) == manifest, "manifest")
check(spec.frame_body_field(bytes.fromhex(up["upload_begin_frame"])) == 12, "upload begin frame")
with open(os.path.join(sys.argv[1], "..", "manifest.schema.json")) as f:
    schema = json.load(f)
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)
check(not list(validator.iter_errors(manifest)), "the upload vector's manifest is valid under manifest.schema.json")
cases = load("manifests.json")["cases"]
for c in cases:
    try:
        valid = not list(validator.iter_errors(json.loads(c["manifest"])))
    except ValueError:
        valid = False
    check(valid == c["valid"], f"manifest case {c['name']}: {'valid' if c['valid'] else 'invalid'} ({c['rule']})")
print("all vectors hold")
