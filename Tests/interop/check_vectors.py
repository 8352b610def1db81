#!/usr/bin/env python3
"""Checks Protocol/vectors/*.json with an implementation independent of the Swift code.

Usage: check_vectors.py VECTORS_DIR. Exit status 0 when every vector holds.
"""
import hashlib
import json
import os
import sys
import zlib

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
check(len({f["body_field"] for f in frames}) == 28 and len(frames) == 29, "28 distinct message types (Goodbye twice)")
check({f["name"]: f["body_field"] for f in frames if f["name"].startswith("tail_")} == {"tail_command": 22, "tail_accepted": 23, "tail_batch": 24, "tail_ack": 25, "tail_stop": 26}, "the live tail's messages are Frame fields 22 to 26 (§20)")
check({f["name"]: f["body_field"] for f in frames if f["name"].startswith("trigger_")} == {"trigger_set": 27, "trigger_set_ack": 28}, "the trigger messages are Frame fields 27 and 28 (§21)")
restart = next(f for f in frames if f["name"] == "goodbye_planned_restart")
check(spec.goodbye(bytes.fromhex(restart["hex"])) == ("server shutting down", 60000, 2000), "Goodbye with back_within_ms and retry_every_ms (§6)")

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

ka = load("key_announcement.json")
announcement = ka["announcement"]
ka_input = spec.key_announcement_signing_input(announcement)
check(ka_input.hex() == ka["signing_input"], "key announcement signing input")
check(ka["previous_ed25519_private_key"] == cmd["ed25519_private_key"], "the announcement is signed by command.json's key")
check(signer.sign(ka_input).hex() == ka["signature"], "key announcement signature reproduced")
nxt = ed25519.Ed25519PrivateKey.from_private_bytes(bytes.fromhex(ka["next_ed25519_private_key"]))
check(nxt.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex() == announcement["signing_key"], "generation 2's public key")
check(serialization.load_der_public_key(bytes.fromhex(announcement["encryption_key"])).key_size == 3072, "generation 2's RSA key")
check(spec.frame_body_field(bytes.fromhex(ka["frame"])) == 8, "heartbeat ack frame")

tail = load("tail.json")
tail_input = spec.tail_command_signing_input(tail["command"])
check(tail_input.hex() == tail["signing_input"], "tail command signing input (§20)")
tail_signer = ed25519.Ed25519PrivateKey.from_private_bytes(bytes.fromhex(tail["ed25519_private_key"]))
check(tail_signer.sign(tail_input).hex() == tail["signature"], "Ed25519 tail command signature reproduced")
batch = tail["batch"]
check(len(bytes.fromhex(batch["nonce"])) == 12, "a tail batch's nonce is 12 bytes (§20)")
check(spec.tail_batch_associated_data(tail["command"]["tail_id"], batch["agent_id"], batch["seq"], batch["dropped"], batch["cursor"]).hex() == batch["associated_data"], "tail batch associated data")
tail_plain = spec.open_tail_batch(bytes.fromhex(batch["tail_key"]), bytes.fromhex(batch["nonce"]), tail["command"]["tail_id"], batch["agent_id"], batch["seq"], batch["dropped"], batch["cursor"], bytes.fromhex(batch["ciphertext"]))
check(tail_plain.hex() == batch["plaintext"], "tail batch opens to its plaintext")
tail_json = json.loads(tail_plain)
check(set(tail_json) == {"records", "contexts"} and all(str(r["context"]) in tail_json["contexts"] for r in tail_json["records"]), "a batch's records and the contexts they name")
for wrong in [dict(seq=batch["seq"] + 1), dict(dropped=0), dict(cursor=batch["cursor"] - 1), dict(agent_id="0" + batch["agent_id"][1:])]:
    args = dict(seq=batch["seq"], dropped=batch["dropped"], cursor=batch["cursor"], agent_id=batch["agent_id"]) | wrong
    try:
        spec.open_tail_batch(bytes.fromhex(batch["tail_key"]), bytes.fromhex(batch["nonce"]), tail["command"]["tail_id"], args["agent_id"], args["seq"], args["dropped"], args["cursor"], bytes.fromhex(batch["ciphertext"]))
        opened = True
    except Exception:
        opened = False
    check(not opened, f"a tail batch does not open with {wrong}")
tail_frames = {f["name"]: f["hex"] for f in tail["frames"]}
check(spec.frame_body_field(bytes.fromhex(tail_frames["tail_batch"])) == 24 and spec.frame_body_field(bytes.fromhex(tail_frames["tail_command"])) == 22, "tail frames carry their body fields")

triggers = load("triggers.json")
trigger_input = spec.trigger_set_signing_input(triggers["set"])
check(trigger_input.hex() == triggers["signing_input"], "trigger set signing input (§21)")
check(triggers["ed25519_private_key"] == cmd["ed25519_private_key"], "the trigger set is signed by command.json's key")
check(signer.sign(trigger_input).hex() == triggers["signature"], "Ed25519 trigger set signature reproduced")
capture_header = spec.upload_header_canonical(triggers["capture_header"])
check(capture_header.hex() == triggers["capture_header_canonical"], "a capture's canonical upload header (§12, §21)")
check(hashlib.sha256(capture_header).hexdigest() == triggers["capture_associated_data"], "a capture's associated data")
pull_kind = dict(triggers["capture_header"], kind=1)
check(spec.upload_header_canonical(pull_kind) == spec.upload_header_canonical({k: v for k, v in pull_kind.items() if k != "capture"}), "another kind's canonical header ends at created_at_us")
for i, case in enumerate(triggers["matching"]):
    got = spec.trigger_fires(triggers["set"]["triggers"][case["trigger"]], case)
    check(got == case["fires"], f"matching case {i}: {case['message']!r} {case['metadata']!r} {'fires' if case['fires'] else 'does not fire'}")
for pair in triggers["versions"]:
    check(spec.version_order(pair["a"], pair["b"]) == pair["order"] and spec.version_order(pair["b"], pair["a"]) == -pair["order"], f"version order {pair['a']} against {pair['b']}")
trigger_frames = {f["name"]: f["hex"] for f in triggers["frames"]}
check(spec.frame_body_field(bytes.fromhex(trigger_frames["trigger_set"])) == 27 and spec.frame_body_field(bytes.fromhex(trigger_frames["trigger_set_ack"])) == 28, "trigger frames carry their body fields")

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

ct = load("command_text.json")
text_input = spec.pull_command_signing_input(ct["command"])
check(text_input.hex() == ct["signing_input"], "text-filter command signing input")
check(signer.sign(text_input).hex() == ct["signature"], "text-filter command signature reproduced")
check(spec.frame_body_field(bytes.fromhex(ct["frame"])) == 9, "text-filter command frame")
for case in ct["matching"]:
    metadata = case["metadata"]
    if metadata is not None:
        check(spec.serialized_metadata(json.loads(metadata)) == metadata, f"metadata serialized as a record line writes it: {metadata}")
    got = spec.text_matches(case["text"], case["message"], metadata)
    check(got == case["matches"], f"text {case['text']!r} {'selects' if case['matches'] else 'does not select'} {case['message']!r} / {metadata}")

cu = load("command_urgent.json")
urgent_input = spec.pull_command_signing_input(cu["command"])
check(urgent_input.hex() == cu["signing_input"], "urgent command signing input")
check(signer.sign(urgent_input).hex() == cu["signature"], "urgent command signature reproduced")
plain = dict(cu["command"], urgent=False)
check(spec.pull_command_signing_input(plain).hex() == cu["signing_input_not_urgent"], "the same command not urgent signs as before")
check(signer.sign(bytes.fromhex(cu["signing_input_not_urgent"])).hex() == cu["signature_not_urgent"], "its signature reproduced")
check(spec.frame_body_field(bytes.fromhex(cu["frame"])) == 9, "urgent command frame")


def check_upload(name, kind):
    up = load(name)
    check(spec.upload_header_canonical(up["header"]).hex() == up["header_canonical"], f"{name}: upload header canonical bytes")
    check(up["header"]["kind"] == kind, f"{name}: kind {kind}")
    zip_bytes = spec.open_upload(bytes.fromhex(up["key"]), up["header"], [bytes.fromhex(c) for c in up["chunks"]])
    check(zip_bytes.hex() == up["zip"], f"{name}: upload decrypts to the zip")
    manifest, files = spec.read_payload(zip_bytes)
    if "files" in up:
        check(files == up["files"], f"{name}: zip holds the per-day files")
    else:
        digests = {n: hashlib.sha256(t.encode("utf-8")).hexdigest() for n, t in files.items()}
        check(digests == up["files_sha256"], f"{name}: zip holds the per-day files (SHA-256)")
    check(json.loads(up["manifest"]) == manifest, f"{name}: manifest")
    check(spec.frame_body_field(bytes.fromhex(up["upload_begin_frame"])) == 12, f"{name}: upload begin frame")
    check(manifest["empty"] == up["header"]["empty"] == (manifest["record_count"] == 0), f"{name}: empty agrees")
    rebuilt = spec.exporter_zip(spec.zip_entries(zip_bytes), manifest["created_at"])
    check(rebuilt == zip_bytes, f"{name}: the zip rebuilt from its files by the exporter's recipe, byte for byte (zlib {zlib.ZLIB_RUNTIME_VERSION})")
    return up, manifest, files


up, manifest, files = check_upload("upload.json", 1)
_, empty_manifest, empty_files = check_upload("upload_empty.json", 1)
check(empty_files == {} and empty_manifest["days"] == [], "an empty selection holds only the manifest")
fb, fb_manifest, _ = check_upload("upload_feedback.json", 2)
check(private_key.decrypt(bytes.fromhex(fb["header"]["wrapped_key"]), oaep).hex() == fb["key"], "feedback key unwraps with the server's RSA key")
check(fb_manifest["feedback"]["feedback_id"] == fb["header"]["upload_id"] == fb["header"]["feedback"]["feedback_id"], "feedback id is the upload id")
check(set(fb_manifest["filter"]) == {"since", "until", "uid"} and fb_manifest["filter"]["uid"] == fb["header"]["feedback"]["uid"], "feedback filter is its uid in a time range")
_, mb_manifest, mb_files = check_upload("upload_multiblock.json", 1)
check(any(len(t.encode("utf-8")) > 512 * 1024 for t in mb_files.values()), "a day file over 512 KiB (two deflate blocks)")
_, fb_manifest_block, fb_files = check_upload("upload_final_block.json", 1)
check(any(len(t.encode("utf-8")) == 512 * 1024 for t in fb_files.values()), "a day file of exactly 512 KiB (an empty final deflate block)")
with open(os.path.join(sys.argv[1], "..", "manifest.schema.json")) as f:
    schema = json.load(f)
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)
for name, m in [("upload.json", manifest), ("upload_empty.json", empty_manifest), ("upload_feedback.json", fb_manifest), ("upload_multiblock.json", mb_manifest), ("upload_final_block.json", fb_manifest_block)]:
    check(not list(validator.iter_errors(m)), f"{name}: the manifest is valid under manifest.schema.json")
cases = load("manifests.json")["cases"]
for c in cases:
    try:
        valid = not list(validator.iter_errors(json.loads(c["manifest"])))
    except ValueError:
        valid = False
    check(valid == c["valid"], f"manifest case {c['name']}: {'valid' if c['valid'] else 'invalid'} ({c['rule']})")
    # Invalid under the schema is refused on the wire; a valid one is accepted or refused by a rule of §13 beyond it.
    check(c["wire"] == "accepted" or c["wire"].startswith("refused: ") and (c["valid"] or c["wire"].startswith("refused: the schema")),
          f"manifest case {c['name']}: a receiver's verdict ({c['wire']})")
print("all vectors hold")
