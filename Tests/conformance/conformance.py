#!/usr/bin/env python3
"""Protocol conformance of the real server, driven over the wire by an agent written from
Protocol/ alone (README.md, dredge.proto, manifest.schema.json), never from the Swift sources.

Usage: conformance.py DREDGE_SERVER_BINARY

It makes a deployment in a temporary directory, runs the server on loopback ports, and checks
each receiver rule the specification puts on a server twice: a case that keeps the rule and is
accepted, and a case that breaks it and gets the exact error code the specification names.
Exit status 0 when every case holds.
"""
import atexit
import hashlib
import io
import json
import os
import re
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
import zipfile

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
import dredge_spec as spec  # noqa: E402  (canonical encoding, nonces: also written from the spec)
import wire  # noqa: E402

OAEP = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=32)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def now_us() -> int:
    return int(time.time() * 1_000_000)


def rfc3339(us: int) -> str:
    seconds, micros = divmod(us, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"


def parse_rfc3339(text: str) -> int:
    """µs of a `YYYY-MM-DDTHH:MM:SS.ffffffZ` time."""
    import calendar
    return calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")) * 1_000_000 + int(text[20:26])


# --- The server under test -------------------------------------------------------------------


RUNNING = []


@atexit.register
def _stop_servers():
    for process in RUNNING:
        if process.poll() is None:
            process.kill()


class Server:
    def __init__(self, binary: str, config=None, heartbeat_seconds=5):
        self.dir = tempfile.mkdtemp(prefix="dredge-conformance-")
        data = os.path.join(self.dir, "server")
        out = subprocess.run([binary, "init", "--data", data], check=True, capture_output=True, text=True).stdout
        if config:
            path = os.path.join(data, "server.json")
            with open(path) as f:
                merged = json.load(f)
            merged.update(config)
            with open(path, "w") as f:
                json.dump(merged, f)
        self.enrollment_token = re.search(r"dredge_enr_[0-9a-f]+", out).group(0)
        self.admin_token = re.search(r"dredge_adm_[0-9a-f]+", out).group(0)
        self.ca = os.path.join(data, "ca.pem")
        self.port, self.admin_port = free_port(), free_port()
        self.log = open(os.path.join(self.dir, "server.log"), "w")
        self.process = subprocess.Popen(
            [binary, "run", "--data", data, "--agent-port", str(self.port), "--admin-port", str(self.admin_port), "--heartbeat-seconds", str(heartbeat_seconds)],
            stdout=self.log, stderr=self.log)
        RUNNING.append(self.process)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"the server exited ({self.process.returncode}); see {self.log.name}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                socket.create_connection(("127.0.0.1", self.admin_port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        self.process.kill()
        raise SystemExit("the server did not start listening")

    def admin(self, method: str, path: str, body=None):
        # The admin API speaks HTTPS with the deployment's certificate: trust its CA only.
        request = urllib.request.Request(
            f"https://127.0.0.1:{self.admin_port}{path}", method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.admin_token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30, context=ssl.create_default_context(cafile=self.ca)) as response:
            return json.loads(response.read())

    def pull_status(self, pull_id: str, agent_id: str) -> str:
        pull = self.admin("GET", f"/v1/pulls/{pull_id}")
        return next(t["status"] for t in pull["targets"] if t["agentID"] == agent_id)

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


# --- An agent written from the specification --------------------------------------------------


def spki(public_key) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


class Agent:
    def __init__(self, server: Server, bits: int = 2048):
        self.server = server
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
        self.agent_id = spec.agent_id(spki(self.key.public_key()))

    def hello(self, link: wire.Link, capabilities=()) -> dict:
        hello = {"min_version": 1, "max_version": 1, "software": "conformance/1"}
        if capabilities:
            hello["capabilities"] = list(capabilities)
        link.send("hello", hello)
        name, ack = link.expect("hello_ack")
        assert name == "hello_ack", ack
        return ack

    def enroll(self, token=None, public_key=None, capabilities=()):
        """(body name, message) of the server's answer to EnrollRequest."""
        link = wire.Link(self.server.port, self.server.ca, timeout=60)
        try:
            self.hello(link, capabilities)
            link.send("enroll_request", {"token": token or self.server.enrollment_token,
                                         "public_key": public_key if public_key is not None else spki(self.key.public_key()),
                                         "host": {"hostname": "conformance"}})
            answer = link.expect("enroll_response")
            if answer[0] == "enroll_response":
                self.signing_key = ed25519.Ed25519PublicKey.from_public_bytes(answer[1]["server_signing_key"])
                self.encryption_key = serialization.load_der_public_key(answer[1]["server_encryption_key"])
                self.key_generation = answer[1].get("key_generation", 0) or 1
            return answer
        finally:
            link.close()

    def connect(self, capabilities=(), key_generation=0) -> wire.Link:
        """An authenticated link; `capabilities` listed in Hello (none: the base protocol), and
        the key generation said in AuthResponse (0: not said)."""
        link = wire.Link(self.server.port, self.server.ca, timeout=60)
        ack = self.hello(link, capabilities)
        link.agreed = ack.get("capabilities", [])
        signature = self.key.sign(spec.auth_signing_input(ack["challenge"], self.agent_id), PSS, hashes.SHA256())
        response = {"agent_id": self.agent_id, "signature": signature, "host": {"hostname": "conformance"}}
        if key_generation:
            response["key_generation"] = key_generation
        link.send("auth_response", response)
        name, result = link.expect("auth_result")
        assert name == "auth_result", result
        link.session = result
        return link

    @staticmethod
    def command(link: wire.Link, command_id: str) -> dict:
        """The next PullCommand with this id (other frames passed over)."""
        while True:
            name, command = link.receive()
            if name == "pull_command" and command["command_id"] == command_id:
                return command

    def pull(self, link: wire.Link, uid="u-3", filter=None, urgent=False) -> tuple:
        """Asks the admin API for a pull of this agent's `uid` records (the admin API's `filter`)
        and accepts the command, its signature checked: (command, key)."""
        request = {"uid": uid, "agent": self.agent_id, "filter": filter or {}}
        if urgent:
            request["urgent"] = True
        record = self.server.admin("POST", "/v1/pulls", request)
        command = self.command(link, record["id"])
        fields = dict(command_id=command["command_id"], target_uid=command.get("target", {}).get("uid", ""),
                      target_agent_id=command.get("target", {}).get("agent_id", ""), issued_at_us=command["issued_at_us"],
                      expires_at_us=command["expires_at_us"], wrapped_key=command.get("wrapped_key", b"").hex())
        f = command.get("filter", {})
        for k in ("since_us", "until_us", "uid", "text"):
            if k in f:
                fields[k] = f[k]
        fields["types"], fields["levels"] = f.get("types", []), f.get("levels", [])
        fields["urgent"] = command.get("urgent", False)
        self.signing_key.verify(command["signature"], spec.pull_command_signing_input(fields))
        key = self.key.decrypt(command["wrapped_key"], OAEP)
        link.send("command_accepted", {"command_id": command["command_id"], "upload_id": command["command_id"]})
        return command, key


# --- Payloads (§13) and envelopes (§12) ---------------------------------------------------------

CONTEXT = {"host": "conformance", "os": "Linux", "app": "conformance", "appVersion": "1", "process": "conformance[1]", "extra": {}}


def record_line(ts_us: int, message: str, uid="u-3", metadata=None) -> str:
    record = {"ts": rfc3339(ts_us), "level": "info", "type": "app", "uid": uid, "message": message,
              "metadata": metadata or {}, "context": 1}
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n"


class _Unseekable(io.RawIOBase):
    """A write-only stream zipfile cannot seek back in: it then writes data descriptors."""
    def __init__(self):
        self.data = bytearray()

    def writable(self):
        return True

    def write(self, b):
        self.data += b
        return len(b)


def payload(upload_id: str, agent_id: str, kind="pull", command_id=None, filter=None, feedback=None, records=2,
            manifest_changes=None, entries_changes=None, created_us=None, zip_form="deflated") -> tuple:
    """A zip made with the standard library's zipfile, as §13 describes: (zip bytes, manifest)."""
    created_us = created_us or now_us()
    base = 1_795_132_800_000_000  # 2026-11-21T00:00:00Z: every record on that one day
    lines = [record_line(base + i * 1_000_000, f"record {i}") for i in range(records)]
    text = "".join(lines)
    day = rfc3339(base)[:10] + ".jsonl"
    manifest = {"format": "dredge-export/1", "upload_id": upload_id, "kind": kind, "agent_id": agent_id, "created_at": rfc3339(created_us),
                "filter": filter if filter is not None else {"uid": "u-3"}, "record_count": records, "empty": records == 0,
                "days": [{"file": day, "records": records, "bytes": len(text.encode()), "first": rfc3339(base),
                          "last": rfc3339(base + (records - 1) * 1_000_000)}] if records else [],
                "contexts": {"1": CONTEXT}, "losses": []}
    if kind == "pull":
        manifest["command_id"] = command_id or upload_id
    if feedback is not None:
        manifest["feedback"] = feedback
    for k, v in (manifest_changes or {}).items():
        if v is None:
            manifest.pop(k, None)
        else:
            manifest[k] = v
    entries = ([(day, text.encode())] if records else []) + [("manifest.json", json.dumps(manifest).encode())]
    if entries_changes:
        entries = entries_changes(entries)
    out = _Unseekable() if zip_form == "descriptors" else io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED if zip_form == "stored" else zipfile.ZIP_DEFLATED) as z:
        for name, data in entries:
            with z.open(name, "w") as entry:
                entry.write(data)
        if zip_form == "comment":
            z.comment = b"made by the conformance agent"
    data = bytes(out.data) if zip_form == "descriptors" else out.getvalue()
    if zip_form == "descriptors":
        assert zipfile.ZipFile(io.BytesIO(data)).infolist()[0].flag_bits & 0x08, "no data descriptor"
    return data, manifest


def header(upload_id, agent_id, plaintext_size, kind=1, chunk_size=4096, empty=False, **extra) -> dict:
    h = {"upload_id": upload_id, "kind": kind, "agent_id": agent_id, "nonce_prefix": os.urandom(7), "chunk_size": chunk_size,
         "plaintext_size": plaintext_size, "chunk_count": max(1, -(-plaintext_size // chunk_size)), "empty": empty, "created_at_us": now_us()}
    h.update(extra)
    return h


def spec_header(h: dict) -> dict:
    """The header in the form the canonical encoder of the interop check takes."""
    out = dict(h, nonce_prefix=h["nonce_prefix"].hex(), wrapped_key=h.get("wrapped_key", b"").hex())
    return out


def seal(key: bytes, h: dict, data: bytes) -> list:
    aad = hashlib.sha256(spec.upload_header_canonical(spec_header(h))).digest()
    aes = AESGCM(key)
    size, count = h["chunk_size"], h["chunk_count"]
    return [aes.encrypt(spec.chunk_nonce(h["nonce_prefix"], i, count), data[i * size:(i + 1) * size], aad) for i in range(count)]


def upload(link: wire.Link, h: dict, chunks: list, complete=True) -> tuple:
    """Begins, sends every chunk, completes: the server's last answer (name, message)."""
    link.send("upload_begin", {"header": h})
    name, answer = link.expect("upload_ready", "upload_result")
    if name != "upload_ready":
        return name, answer
    for i, c in enumerate(chunks):
        link.send("upload_chunk", {"upload_id": h["upload_id"], "index": i, "ciphertext": c})
        name, answer = link.expect("chunk_ack", "upload_result")
        if name != "chunk_ack":
            return name, answer
    if not complete:
        return name, answer
    link.send("upload_complete", {"upload_id": h["upload_id"]})
    return link.expect("upload_result")


def code_of(answer: tuple):
    name, message = answer
    if name == "error":
        return wire.ERRORS.get(message.get("code", 0))
    if name == "upload_result":
        return "ok" if message.get("ok") else wire.ERRORS.get(message.get("error", 0))
    return name


# --- The cases ----------------------------------------------------------------------------------

CASES = []


def case(rule: str):
    def register(fn):
        CASES.append((rule, fn))
        return fn
    return register


def expect(what: str, got, wanted):
    if got != wanted:
        raise AssertionError(f"{what}: got {got}, wanted {wanted}")
    print(f"  ok: {what}: {wanted}")


def fresh_link(server) -> wire.Link:
    return wire.Link(server.port, server.ca, timeout=60)


@case("§3 a frame's length is 1 to MAX_FRAME_BYTES; zero is ERROR_MALFORMED_FRAME")
def frame_length(s: Server, a: Agent):
    link = fresh_link(s)
    link.send("hello", {"min_version": 1, "max_version": 1})
    expect("a Hello", code_of(link.expect("hello_ack")), "hello_ack")
    link.close()
    link = fresh_link(s)
    link.send_raw(b"\x00\x00\x00\x00")
    expect("a zero length", code_of(link.expect("hello_ack")), "ERROR_MALFORMED_FRAME")
    expect("then the server closes", link.closed(), True)


@case("§3 before authentication a frame is at most MAX_PREAUTH_FRAME_BYTES (16,384)")
def preauth_limit(s: Server, a: Agent):
    def hello_of(size):
        base = wire.frame("hello", {"min_version": 1, "max_version": 1, "software": ""})
        pad = size - (len(base) - 4)
        body = wire.frame("hello", {"min_version": 1, "max_version": 1, "software": "x" * pad})
        # The string's length prefix may grow by a byte: trim to the exact size.
        while len(body) - 4 > size:
            pad -= 1
            body = wire.frame("hello", {"min_version": 1, "max_version": 1, "software": "x" * pad})
        assert len(body) - 4 == size, (len(body), size)
        return body
    link = fresh_link(s)
    link.send_raw(hello_of(16_384))
    expect("a Hello of exactly 16,384 bytes", code_of(link.expect("hello_ack")), "hello_ack")
    link.close()
    link = fresh_link(s)
    link.send_raw(struct.pack(">I", 16_385))
    expect("a length of 16,385 before authentication", code_of(link.expect("hello_ack")), "ERROR_FRAME_TOO_LARGE")


@case("§3 after authentication a frame is at most MAX_FRAME_BYTES (2,097,152)")
def frame_limit(s: Server, a: Agent):
    link = a.connect()
    uids = [f"user-{i:019d}" for i in range(1000)]
    link.send("heartbeat", {"seq": 1, "active_uids": uids})
    expect(f"a {len(wire.frame('heartbeat', {'seq': 1, 'active_uids': uids})):,}-byte heartbeat (over the pre-authentication limit)",
           code_of(link.expect("heartbeat_ack", skip=("pull_command",))), "heartbeat_ack")
    link.send_raw(struct.pack(">I", 2_097_153))
    expect("a length of 2,097,153", code_of(link.expect("heartbeat_ack", skip=("pull_command",))), "ERROR_FRAME_TOO_LARGE")
    link.close()


@case("§3 a body with no known message is ERROR_MALFORMED_FRAME, not ERROR_UNEXPECTED_MESSAGE")
def unknown_body(s: Server, a: Agent):
    for what, body in [("field 127", b"\xfa\x07\x00"), ("no field", b"\x00"), ("not protobuf", b"\xff\xff\xff")]:
        link = fresh_link(s)
        link.send_raw(struct.pack(">I", len(body)) + body)
        expect(f"a body of {what}", code_of(link.expect("hello_ack")), "ERROR_MALFORMED_FRAME")
        link.close()
    # Unknown fields inside a known message are ignored.
    link = fresh_link(s)
    body = wire.encode_field(1, ("msg", wire.HELLO), {"min_version": 1, "max_version": 1})
    inner = wire.encode({"min_version": 1, "max_version": 1}, wire.HELLO) + wire.key(99, 0) + wire.varint(5)
    body = wire.key(1, 2) + wire.varint(len(inner)) + inner
    link.send_raw(struct.pack(">I", len(body)) + body)
    expect("a Hello with an unknown field 99", code_of(link.expect("hello_ack")), "hello_ack")
    link.close()


@case("§4 the server picks a common version, else ERROR_VERSION_UNSUPPORTED")
def versions(s: Server, a: Agent):
    link = fresh_link(s)
    link.send("hello", {"min_version": 1, "max_version": 3})
    name, ack = link.expect("hello_ack")
    expect("versions 1 to 3", (name, ack.get("version"), len(ack.get("challenge", b""))), ("hello_ack", 1, 32))
    link.close()
    link = fresh_link(s)
    link.send("hello", {"min_version": 2, "max_version": 3})
    expect("versions 2 to 3", code_of(link.expect("hello_ack")), "ERROR_VERSION_UNSUPPORTED")
    link.close()


@case("§6 a frame the state does not allow is ERROR_UNEXPECTED_MESSAGE")
def unexpected(s: Server, a: Agent):
    link = fresh_link(s)
    a.hello(link)
    link.send("heartbeat", {"seq": 1})
    expect("a Heartbeat before authentication", code_of(link.expect("heartbeat_ack")), "ERROR_UNEXPECTED_MESSAGE")
    link.close()
    link = a.connect()
    link.send("hello", {"min_version": 1, "max_version": 1})
    expect("a second Hello when ready", code_of(link.expect("hello_ack", skip=("pull_command", "heartbeat_ack"))), "ERROR_UNEXPECTED_MESSAGE")
    link.close()


@case("§7 enrollment: a valid token and an SPKI key of 2048-4096 bits, enrolled once")
def enrollment(s: Server, a: Agent):
    fresh = Agent(s)
    name, response = fresh.enroll()
    expect("a fresh 2048-bit key", (name, response.get("agent_id")), ("enroll_response", fresh.agent_id))
    expect("the same key again", code_of(fresh.enroll()), "ERROR_ENROLLMENT_REFUSED")
    expect("a wrong token", code_of(Agent(s).enroll(token="dredge_enr_" + "0" * 48)), "ERROR_ENROLLMENT_REFUSED")
    pkcs1 = Agent(s)
    der = pkcs1.key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.PKCS1)
    expect("a PKCS#1 key", code_of(pkcs1.enroll(public_key=der)), "ERROR_ENROLLMENT_REFUSED")
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    expect("a 1024-bit key", code_of(Agent(s).enroll(public_key=spki(small.public_key()))), "ERROR_ENROLLMENT_REFUSED")
    large = rsa.generate_private_key(public_exponent=65537, key_size=4104)
    expect("a 4104-bit key", code_of(Agent(s).enroll(public_key=spki(large.public_key()))), "ERROR_ENROLLMENT_REFUSED")
    padded = bytearray(spki(Agent(s).key.public_key()))
    expect("an SPKI with bytes after it", code_of(Agent(s).enroll(public_key=bytes(padded) + b"\x00")), "ERROR_ENROLLMENT_REFUSED")


@case("§8 authentication: the agent's signature over the server's own challenge")
def authentication(s: Server, a: Agent):
    link = a.connect()
    session = link.session
    expect("a valid signature", session["agent_id"], a.agent_id)
    expect("window within [8, 64]", 8 <= session.get("window", 0) <= 64, True)
    expect("max_chunk_bytes within [262,144, 1,048,576]", 262_144 <= session.get("max_chunk_bytes", 0) <= 1_048_576, True)
    link.close()
    for what, agent_id, sign in [
        ("a signature over another challenge", a.agent_id, lambda ch: a.key.sign(spec.auth_signing_input(os.urandom(32), a.agent_id), PSS, hashes.SHA256())),
        ("an agent that is not enrolled", "0" * 32, lambda ch: a.key.sign(spec.auth_signing_input(ch, "0" * 32), PSS, hashes.SHA256())),
    ]:
        link = fresh_link(s)
        ack = a.hello(link)
        link.send("auth_response", {"agent_id": agent_id, "signature": sign(ack["challenge"])})
        expect(what, code_of(link.expect("auth_result")), "ERROR_AUTH_FAILED")
        link.close()
    link = fresh_link(s)
    a.hello(link)
    link.send("auth_response", {"agent_id": "", "signature": b"x"})
    expect("an empty agent id", code_of(link.expect("auth_result")), "ERROR_MALFORMED_FRAME")
    link.close()


@case("§9 a heartbeat has at most MAX_ACTIVE_UIDS valid uids")
def heartbeats(s: Server, a: Agent):
    link = a.connect()
    link.send("heartbeat", {"seq": 1, "active_uids": [f"u-{i}" for i in range(1023)] + ["x" * 256]})
    name, ack = link.expect("heartbeat_ack", skip=("pull_command",))
    expect("1,024 uids, one of 256 bytes", (name, ack.get("seq")), ("heartbeat_ack", 1))
    link.close()
    for what, uids in [("1,025 uids", [f"u-{i}" for i in range(1025)]), ("a uid of 257 bytes", ["x" * 257]),
                       ("a uid with a control character", ["u-1\nx"]), ("an empty uid", [""])]:
        link = a.connect()
        link.send("heartbeat", {"seq": 1, "active_uids": uids})
        expect(what, code_of(link.expect("heartbeat_ack", skip=("pull_command",))), "ERROR_MALFORMED_FRAME")
        link.close()


@case("§9 store stats are informational; a last_seen_us off the hour is kept truncated to it")
def stats_and_hours(s: Server, a: Agent):
    hour = 3_600_000_000
    uid = "hours-" + os.urandom(4).hex()
    for what, stats in [("negative times", {"records": 5, "oldest_us": -5, "newest_us": -9}),
                        ("newest before oldest, huge counts", {"records": 2**64 - 1, "oldest_us": 2**62, "newest_us": 1, "bytes_on_disk": 2**64 - 1, "dropped": 2**64 - 1}),
                        ("no stats at all", None)]:
        link = a.connect()
        beat = {"seq": 1} if stats is None else {"seq": 1, "stats": stats}
        link.send("heartbeat", beat)
        expect(f"a heartbeat whose stats have {what}", code_of(link.expect("heartbeat_ack", skip=("pull_command",))), "heartbeat_ack")
        link.close()
    seen = (now_us() - 30 * hour) // hour * hour
    link = a.connect()
    link.send("heartbeat", {"seq": 1, "users": {"users": [{"uid": uid, "last_seen_us": seen + hour // 2 + 123}]}})
    expect("a report whose last_seen_us is half an hour past an hour", code_of(link.expect("heartbeat_ack", skip=("pull_command",))), "heartbeat_ack")
    link.close()
    holders = s.admin("GET", f"/v1/agents?uid={uid}")
    expect("the server keeps it truncated to the hour", [(h["agentID"], h.get("uidLastSeen")) for h in holders],
           [(a.agent_id, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seen // 1_000_000)))])


@case("§7 host info is kept within its bounds: replaced, then cut; empty keys dropped, long keys cut")
def host_info(s: Server, a: Agent):
    b = Agent(s)
    assert b.enroll()[0] == "enroll_response"
    labels = {"": "empty key", "\x00": "a key that is one control character", "k" * 70: "long key", "k" * 64 + "zz": "the same key once cut",
              "a-region": "\u202e" + "é" * 200}
    labels.update({f"n{i:02d}": str(i) for i in range(40)})
    host = {"hostname": "h" * 254 + "\x01", "os": "Linux", "app": "a", "app_version": "1", "extra": labels}
    link = wire.Link(s.port, s.ca, timeout=60)
    ack = b.hello(link)
    link.send("auth_response", {"agent_id": b.agent_id, "signature": b.key.sign(spec.auth_signing_input(ack["challenge"], b.agent_id), PSS, hashes.SHA256()),
                                "host": host})
    expect("an agent whose host info breaks every bound is not refused", link.expect("auth_result")[0], "auth_result")
    link.close()
    record = next(r for r in s.admin("GET", "/v1/agents") if r["agentID"] == b.agent_id)
    expect("a host name of 254 bytes and a control character: replaced by U+FFFD (3 bytes), then cut at 256 bytes",
           record["hostname"], "h" * 254)
    got = record["labels"]
    expect("a key that is a control character becomes U+FFFD; an empty key is dropped", ("\ufffd" in got, "" in got), (True, False))
    expect("a long key is cut to 64 bytes, and the first of two keys equal once cut wins", got.get("k" * 64), "long key")
    expect("a value of a bidi control and 200 é: replaced, then cut at a whole character (256 bytes)",
           (got.get("a-region"), len(got.get("a-region", "").encode())), ("\ufffd" + "é" * 126, 255))
    # In byte order: U+0000's key, a-region, the long k key, n00 to n28 (32), then n29 onwards dropped.
    expect("labels beyond 32 dropped, the first keys in byte order kept", (len(got), "n28" in got, "n29" in got), (32, True, False))


@case("§9 a user report has at most MAX_REPORTED_USERS distinct valid uids, each seen in 1970-9999")
def user_reports(s: Server, a: Agent):
    hour = 3_600_000_000
    link = a.connect()
    users = [{"uid": f"r-{i}", "last_seen_us": hour * (i % 50)} for i in range(4096)]
    link.send("heartbeat", {"seq": 1, "users": {"users": users, "truncated": True}})
    name, ack = link.expect("heartbeat_ack", skip=("pull_command",))
    expect("4,096 users", (name, ack.get("seq")), ("heartbeat_ack", 1))
    link.close()
    for what, report in [("4,097 users", [{"uid": f"r-{i}", "last_seen_us": 0} for i in range(4097)]),
                         ("a uid listed twice", [{"uid": "r-1", "last_seen_us": 0}, {"uid": "r-1", "last_seen_us": hour}]),
                         ("a negative last_seen_us", [{"uid": "r-1", "last_seen_us": -1}]),
                         ("a last_seen_us after 9999", [{"uid": "r-1", "last_seen_us": 253_402_300_800_000_000}]),
                         ("an invalid uid", [{"uid": "r-1\x7fx", "last_seen_us": 0}])]:
        link = a.connect()
        link.send("heartbeat", {"seq": 1, "users": {"users": report}})
        expect(f"a report with {what}", code_of(link.expect("heartbeat_ack", skip=("pull_command",))), "ERROR_MALFORMED_FRAME")
        link.close()
    # Two spellings of one accented name are two uids (compared byte for byte).
    link = a.connect()
    link.send("heartbeat", {"seq": 1, "users": {"users": [{"uid": "r-\u00e9", "last_seen_us": 0}, {"uid": "r-e\u0301", "last_seen_us": 0}]}})
    expect("two spellings of one accented uid", link.expect("heartbeat_ack", skip=("pull_command",))[0], "heartbeat_ack")
    link.close()


def honest_pull(s, a, link):
    command, key = a.pull(link)
    cid = command["command_id"]
    data, _ = payload(cid, a.agent_id)
    h = header(cid, a.agent_id, len(data))
    return cid, key, data, h


@case("§11 an honest pull upload completes, and begun again gets its result again")
def honest_upload(s: Server, a: Agent):
    link = a.connect()
    cid, key, data, h = honest_pull(s, a, link)
    name, result = upload(link, h, seal(key, h, data))
    expect("the upload", (code_of((name, result)), result.get("files"), result.get("records")), ("ok", 1, 2))
    expect("the pull", s.pull_status(cid, a.agent_id), "complete")
    link.close()
    link = a.connect()
    link.send("upload_begin", {"header": h})
    name, again = link.expect("upload_ready", "upload_result")
    expect("begun again on a new connection", (name, again.get("ok"), again.get("files"), again.get("records")), ("upload_result", True, 1, 2))
    link.send("upload_status_query", {"upload_id": cid})
    name, status = link.expect("upload_status")
    expect("its status", wire.STATES[status.get("state", 0)], "COMPLETE")
    link.close()


@case("§22 urgent: an urgent pull's command is marked, and signed with the mark, only for an agent that agreed `urgent`")
def urgent_pulls(s: Server, a: Agent):
    plain = a.connect()
    expect("urgent not agreed unasked", "urgent" in plain.agreed, False)
    command, _ = a.pull(plain, urgent=True)  # its signature verified as the base protocol's
    expect("not marked for an agent that did not agree", command.get("urgent", False), False)
    plain.close()
    link = a.connect(capabilities=("urgent",))
    expect("urgent agreed", link.agreed, ["urgent"])
    command, _ = a.pull(link, urgent=True)  # verified with the mark in the signing input
    expect("marked for one that agreed", command.get("urgent", False), True)
    command, _ = a.pull(link)
    expect("a pull not urgent is not marked", command.get("urgent", False), False)
    link.close()


@case("§11/§12 header rules: ERROR_UPLOAD_INVALID for a header that breaks them")
def header_rules(s: Server, a: Agent):
    link = a.connect()
    cid, key, data, h = honest_pull(s, a, link)
    bad = [
        ("another agent's id", dict(h, agent_id="0" * 32)),
        ("a 6-byte nonce prefix", dict(h, nonce_prefix=os.urandom(6))),
        ("chunk_size 4,095", dict(h, chunk_size=4095, chunk_count=-(-len(data) // 4095))),
        ("chunk_size over max_chunk_bytes", dict(h, chunk_size=link.session["max_chunk_bytes"] + 1, chunk_count=1)),
        ("a wrong chunk_count", dict(h, chunk_count=h["chunk_count"] + 1)),
        ("kind EXPORT", dict(h, kind=3)),
        ("a pull header with feedback", dict(h, feedback={"feedback_id": cid, "uid": "u-3", "text": "x", "created_at_us": now_us()})),
        ("a pull header with a wrapped key", dict(h, wrapped_key=b"\x01" * 256)),
        ("a pull header carrying a capture (§21: bound into nothing)", dict(h, capture={"trigger_id": os.urandom(16).hex(), "set_version": 1, "uid": "u-3",
                                                                                      "since_us": now_us() - 1000, "until_us": now_us(), "matched_at_us": now_us() - 1})),
        ("kind CAPTURE without the capability (§21)", dict(h, kind=4)),
        ("an upload id of no pull", dict(h, upload_id=os.urandom(16).hex())),
        ("an upload id that is not 32 hex digits", dict(h, upload_id="../" + cid)),
        ("created_at_us after 9999", dict(h, created_at_us=253_402_300_800_000_000)),
    ]
    for what, hh in bad:
        link.send("upload_begin", {"header": hh})
        expect(what, code_of(link.expect("upload_ready", "upload_result")), "ERROR_UPLOAD_INVALID")
    name, result = upload(link, h, seal(key, h, data))
    expect("then the honest header", code_of((name, result)), "ok")
    link.close()


@case("§11 chunks: unknown upload, index, length, authentication, completeness")
def chunk_rules(s: Server, a: Agent):
    link = a.connect()
    link.send("upload_chunk", {"upload_id": os.urandom(16).hex(), "index": 0, "ciphertext": b"x" * 32})
    expect("a chunk of an upload not begun", code_of(link.expect("chunk_ack")), "ERROR_UPLOAD_UNKNOWN")
    link.send("upload_status_query", {"upload_id": os.urandom(16).hex()})
    expect("the status of an upload not begun", wire.STATES[link.expect("upload_status")[1].get("state", 0)], "UNKNOWN")

    for what, mutate, wanted in [
        ("an index past chunk_count", lambda h, cs: [(h["chunk_count"], cs[0])], "ERROR_CHUNK_INVALID"),
        ("a chunk one byte short", lambda h, cs: [(0, cs[0][:-1])], "ERROR_CHUNK_INVALID"),
        ("a chunk that does not authenticate", lambda h, cs: [(0, bytes([cs[0][0] ^ 1]) + cs[0][1:])], "ERROR_CHUNK_AUTH_FAILED"),
    ]:
        cid, key, data, h = honest_pull(s, a, link)
        chunks = seal(key, h, data + b"")
        link.send("upload_begin", {"header": h})
        link.expect("upload_ready")
        for index, c in mutate(h, chunks):
            link.send("upload_chunk", {"upload_id": cid, "index": index, "ciphertext": c})
        expect(what, code_of(link.expect("chunk_ack", "upload_result")), wanted)
        expect(f"{what}: the pull", s.pull_status(cid, a.agent_id), "failed")

    # Completing with a chunk missing, then finishing it.
    command, key = a.pull(link)
    cid = command["command_id"]
    data, _ = payload(cid, a.agent_id, records=5000)
    h = header(cid, a.agent_id, len(data))
    chunks = seal(key, h, data)
    assert len(chunks) >= 2, len(chunks)
    name, answer = upload(link, h, chunks[:-1], complete=False)
    link.send("upload_status_query", {"upload_id": cid})
    status = link.expect("upload_status")[1]
    expect("the status of a partial upload", wire.STATES[status.get("state", 0)], "RECEIVING")
    expect("its bitmap", status.get("received", b"")[0] & 1, 1)
    link.send("upload_complete", {"upload_id": cid})
    expect("complete with a chunk missing", code_of(link.expect("upload_result")), "ERROR_UPLOAD_INCOMPLETE")
    link.close()
    link = a.connect()  # resumed on another connection: only the missing chunk
    link.send("upload_begin", {"header": h})
    name, ready = link.expect("upload_ready")
    held = [i for i in range(len(chunks)) if ready["received"][i // 8] >> (i % 8) & 1]
    expect("UploadReady lists the chunks already held", held, list(range(len(chunks) - 1)))
    link.send("upload_chunk", {"upload_id": cid, "index": len(chunks) - 1, "ciphertext": chunks[-1]})
    link.expect("chunk_ack")
    link.send("upload_complete", {"upload_id": cid})
    expect("the resumed upload", code_of(link.expect("upload_result")), "ok")
    link.close()


@case("§11 an upload's identity: the stored header, the connection, another agent's feedback id")
def upload_identity(s: Server, a: Agent):
    link = a.connect()
    cid, key, data, h = honest_pull(s, a, link)
    chunks = seal(key, h, data + b"")
    link.send("upload_begin", {"header": h})
    link.expect("upload_ready")
    link.send("upload_chunk", {"upload_id": cid, "index": 0, "ciphertext": chunks[0]})
    expect("a first chunk", code_of(link.expect("chunk_ack")), "chunk_ack")
    link.close()
    link = a.connect()
    link.send("upload_chunk", {"upload_id": cid, "index": 0, "ciphertext": chunks[0]})
    expect("a chunk of an upload begun on another connection", code_of(link.expect("chunk_ack")), "ERROR_UPLOAD_UNKNOWN")
    link.send("upload_complete", {"upload_id": cid})
    name, answer = link.expect("upload_result")
    expect("UploadComplete of an upload begun on another connection", (code_of((name, answer)), answer.get("upload_id")), ("ERROR_UPLOAD_UNKNOWN", cid))
    link.send("upload_complete", {"upload_id": os.urandom(16).hex()})
    expect("UploadComplete for an upload never begun", code_of(link.expect("upload_result")), "ERROR_UPLOAD_UNKNOWN")
    changed = dict(h, created_at_us=h["created_at_us"] + 1)
    link.send("upload_begin", {"header": changed})
    expect("a header that differs from the stored one", code_of(link.expect("upload_ready", "upload_result")), "ERROR_UPLOAD_INVALID")
    name, result = upload(link, h, chunks)
    expect("the stored header, begun again", code_of((name, result)), "ok")
    link.close()

    # Another agent's feedback id.
    other = Agent(s)
    assert other.enroll()[0] == "enroll_response"
    fid, fkey, created = os.urandom(16).hex(), os.urandom(32), now_us()
    link = other.connect()
    expect("a feedback", code_of(upload(link, *feedback_upload(other, fid, fkey, created, text="mine"))), "ok")
    link.close()
    link = a.connect()
    expect("the same feedback id from another agent", code_of(upload(link, *feedback_upload(a, fid, fkey, created, text="mine"))), "ERROR_UPLOAD_INVALID")
    link.close()


@case("§9 routing: a pull by uid alone goes to the agents that hold it, and to agents that come to hold it until it expires")
def routing(s: Server, a: Agent):
    b = Agent(s)
    assert b.enroll()[0] == "enroll_response"
    uid, old = "routed-" + os.urandom(4).hex(), "reported-" + os.urandom(4).hex()
    hour = 3_600_000_000
    for agent, beat in ((a, {"active_uids": [uid, "u-3"]}), (b, {"active_uids": ["u-3"], "users": {"users": [{"uid": old, "last_seen_us": (now_us() - 40 * hour) // hour * hour}]}})):
        link = agent.connect()
        link.send("heartbeat", dict(beat, seq=1))
        link.expect("heartbeat_ack", skip=("pull_command",))
        link.close()
    pull = s.admin("POST", "/v1/pulls", {"uid": uid, "filter": {}})
    expect("a pull by a uid one agent's active uids list", sorted(t["agentID"] for t in pull["targets"]), [a.agent_id])
    link = a.connect()
    command = Agent.command(link, pull["id"])
    expect("its command names the agent it was sent to in target.agent_id (§10)", command.get("target", {}).get("agent_id"), a.agent_id)
    link.send("command_rejected", {"command_id": pull["id"], "reason": 8})
    link.close()
    pull = s.admin("POST", "/v1/pulls", {"uid": old, "filter": {}})
    expect("a pull by a uid only a user report lists (records 40 hours old)", sorted(t["agentID"] for t in pull["targets"]), [b.agent_id])
    link = a.connect()
    link.send("heartbeat", {"seq": 1, "active_uids": ["u-3"]})  # the next heartbeat replaces the set
    link.expect("heartbeat_ack", skip=("pull_command",))
    link.close()
    waiting = s.admin("POST", "/v1/pulls", {"uid": uid, "filter": {}, "expiresInSeconds": 600})
    expect("the same uid once no agent holds it: made, with no target yet", waiting["targets"], [])
    # b comes to hold the uid: it joins the waiting pull (not the finished ones), queued.
    link = b.connect()
    link.send("heartbeat", {"seq": 1, "active_uids": [uid]})
    link.expect("heartbeat_ack", skip=("pull_command",))
    joined = []
    for _ in range(100):
        joined = [t["agentID"] for t in s.admin("GET", f"/v1/pulls/{waiting['id']}")["targets"]]
        if joined:
            break
        time.sleep(0.1)
    link.close()
    expect("an agent that comes to hold the uid joins the pull", joined, [b.agent_id])


def feedback_upload(agent: Agent, fid=None, key=None, created=None, text="it stopped", mutate_header=lambda h: h, **fields) -> tuple:
    """(header, sealed chunks) of an honest feedback by `agent`, with `fields` of its header's
    feedback replaced (the manifest keeps the honest ones)."""
    fid, key, created = fid or os.urandom(16).hex(), key or os.urandom(32), created or now_us()
    fb = dict({"feedback_id": fid, "uid": "u-3", "text": text, "created_at_us": created}, **fields)
    data, _ = payload(fid, agent.agent_id, kind="feedback", created_us=created,
                      feedback={"feedback_id": fid, "uid": "u-3", "text": text, "created_at": rfc3339(created)},
                      filter={"uid": "u-3", "since": rfc3339(created - 86_400_000_000), "until": rfc3339(created + 1_000_000)})
    h = mutate_header(header(fid, agent.agent_id, len(data), kind=2, feedback=fb, wrapped_key=agent.encryption_key.encrypt(key, OAEP)))
    return h, seal(key, h, data)


def zip_bytes_case(s, a, link, what, mutate):
    """A pull whose honest zip is changed byte by byte by `mutate` (a bytearray) is refused."""
    command, key = a.pull(link)
    cid = command["command_id"]
    data = bytearray(payload(cid, a.agent_id)[0])
    mutate(data)
    h = header(cid, a.agent_id, len(data))
    expect(what, code_of(upload(link, h, seal(key, h, bytes(data)))), "ERROR_PAYLOAD_INVALID")


def payload_case(s, a, link, what, wanted="ERROR_PAYLOAD_INVALID", empty=None, **changes):
    command, key = a.pull(link)
    cid = command["command_id"]
    data, manifest = payload(cid, a.agent_id, **changes)
    h = header(cid, a.agent_id, len(data), empty=manifest["empty"] if empty is None else empty)
    expect(what, code_of(upload(link, h, seal(key, h, data))), wanted)
    expect(f"{what}: the pull", s.pull_status(cid, a.agent_id), "complete" if wanted == "ok" else "failed")


@case("§13 the payload: schema, rules by kind, entries, CRCs, counts")
def payload_rules(s: Server, a: Agent):
    link = a.connect()
    payload_case(s, a, link, "an honest payload made with zipfile", "ok")
    payload_case(s, a, link, "an empty selection", "ok", records=0)
    payload_case(s, a, link, "entries with data descriptors (flag bit 3)", "ok", zip_form="descriptors")
    payload_case(s, a, link, "stored entries", "ok", zip_form="stored")
    payload_case(s, a, link, "an archive comment", "ok", zip_form="comment")
    payload_case(s, a, link, "a manifest without losses", manifest_changes={"losses": None})
    payload_case(s, a, link, "a manifest time without six fractional digits", manifest_changes={"created_at": "2026-11-21T08:00:00Z"})
    payload_case(s, a, link, "a manifest naming another command", manifest_changes={"command_id": os.urandom(16).hex()})
    payload_case(s, a, link, "a manifest with a wider filter than the pull's", filter={})
    payload_case(s, a, link, "a manifest with another agent", manifest_changes={"agent_id": "0" * 32})
    payload_case(s, a, link, "a header that says empty over records", empty=True)
    payload_case(s, a, link, "a record_count that is not the days' sum", manifest_changes={"record_count": 3})
    payload_case(s, a, link, "a manifest created_at an hour before the header's created_at_us (not compared)", "ok",
                 manifest_changes={"created_at": rfc3339(now_us() - 3_600_000_000)})

    def one_line_short(entries):
        manifest = json.loads(entries[-1][1])
        manifest["days"][0]["records"] += 1
        manifest["record_count"] += 1
        return entries[:-1] + [("manifest.json", json.dumps(manifest).encode())]
    payload_case(s, a, link, "a day whose line count is not the manifest's", entries_changes=one_line_short)

    def rename(entries):
        return [("2026-02-30.jsonl" if n.endswith(".jsonl") else n, d) for n, d in entries]
    payload_case(s, a, link, "a day file of a date that does not exist", entries_changes=rename)

    def traverse(entries):
        return entries + [("../escape.jsonl", b"{}\n")]
    payload_case(s, a, link, "an entry name with ..", entries_changes=traverse)

    def unlisted(entries):
        return [("2020-01-01.jsonl", b'{"a":1}\n')] + entries
    payload_case(s, a, link, "a day the manifest does not list", entries_changes=unlisted)

    def no_manifest(entries):
        return [(n, d) for n, d in entries if n != "manifest.json"]
    payload_case(s, a, link, "no manifest", entries_changes=no_manifest)

    def wrong_crc(data):
        # The first entry's stored CRC, in its local header and in the central directory.
        for sig, offset in ((b"PK\x03\x04", 14), (b"PK\x01\x02", 16)):
            data[data.find(sig) + offset] ^= 0x5A
    zip_bytes_case(s, a, link, "an entry whose CRC-32 is wrong", wrong_crc)

    def encrypted(data):
        for sig, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
            at = data.find(sig)
            while at >= 0:
                data[at + offset] |= 1
                at = data.find(sig, at + 4)
    zip_bytes_case(s, a, link, "entries marked encrypted", encrypted)
    link.close()


@case("§5/§11 feedback: feedback_id = upload_id, a valid uid and text, a key the server can unwrap")
def feedback_rules(s: Server, a: Agent):
    link = a.connect()

    def send(what, wanted, mutate_header=lambda h: h, **fields):
        expect(what, code_of(upload(link, *feedback_upload(a, mutate_header=mutate_header, **fields))), wanted)

    send("an honest feedback", "ok")
    send("a feedback_id other than the upload id", "ERROR_UPLOAD_INVALID", feedback_id=os.urandom(16).hex())
    send("an empty text", "ERROR_UPLOAD_INVALID", text="")
    send("a text over 16,384 bytes", "ERROR_UPLOAD_INVALID", text="x" * 16_385)
    send("a uid with a control character", "ERROR_UPLOAD_INVALID", uid="u\x00")
    send("a wrapped key the server cannot unwrap", "ERROR_UPLOAD_INVALID", mutate_header=lambda h: dict(h, wrapped_key=os.urandom(256)))
    send("the header's own created_at_us before 1970", "ERROR_UPLOAD_INVALID", mutate_header=lambda h: dict(h, created_at_us=-1))
    send("the header's own created_at_us after 9999", "ERROR_UPLOAD_INVALID", mutate_header=lambda h: dict(h, created_at_us=253_402_300_800_000_000))
    link.close()


@case("§10 redelivery: a delivered command left unanswered is sent again on the next connection")
def redelivery(s: Server, a: Agent):
    link = a.connect()
    record = s.admin("POST", "/v1/pulls", {"uid": "u-3", "agent": a.agent_id, "filter": {}})
    command = Agent.command(link, record["id"])
    link.close()  # no answer
    link = a.connect()
    again = Agent.command(link, record["id"])
    same = lambda c: (c["command_id"], c.get("target"), c.get("filter"), c["issued_at_us"], c["expires_at_us"])
    expect("the same command, delivered again", same(again), same(command))
    expect("its key wrapped anew, to the same key", a.key.decrypt(again["wrapped_key"], OAEP) == a.key.decrypt(command["wrapped_key"], OAEP), True)
    link.send("command_rejected", {"command_id": record["id"], "reason": 8, "detail": "busy"})
    link.send("heartbeat", {"seq": 1})
    link.expect("heartbeat_ack", skip=("pull_command",))
    expect("rejected busy", s.pull_status(record["id"], a.agent_id), "rejected")
    link.close()
    # Answered: not sent again. A second pull made while the agent is away is delivered on the
    # next connection with whatever else is due; the answered one must not be among them.
    second = s.admin("POST", "/v1/pulls", {"uid": "u-3", "agent": a.agent_id, "filter": {}})
    link = a.connect()
    seen = []
    while second["id"] not in seen:
        name, message = link.receive()
        if name == "pull_command":
            seen.append(message["command_id"])
    link.send("heartbeat", {"seq": 1})
    while True:
        name, message = link.receive()
        if name == "pull_command":
            seen.append(message["command_id"])
        if name == "heartbeat_ack":
            break
    expect("the unanswered second pull is delivered", second["id"] in seen, True)
    expect("the answered first is not delivered again", record["id"] in seen, False)
    link.send("command_rejected", {"command_id": second["id"], "reason": 8})
    link.close()


def tail_command(link: wire.Link, tail_id: str) -> dict:
    """The next TailCommand of this tail (other frames passed over)."""
    while True:
        name, command = link.receive()
        if name == "tail_command" and command["tail_id"] == tail_id:
            return command


def tail_key(a: Agent, command: dict) -> bytes:
    """Checks a TailCommand's signature (§20) and unwraps its key."""
    f = command.get("filter", {})
    fields = dict(tail_id=command["tail_id"], target_uid=command.get("target", {}).get("uid", ""),
                  target_agent_id=command.get("target", {}).get("agent_id", ""), issued_at_us=command["issued_at_us"],
                  expires_at_us=command["expires_at_us"], max_records_per_s=command.get("max_records_per_s", 0),
                  max_bytes_per_s=command.get("max_bytes_per_s", 0), verbose=command.get("verbose", False),
                  verbose_types=command.get("verbose_types", []), wrapped_key=command.get("wrapped_key", b"").hex(),
                  types=f.get("types", []), levels=f.get("levels", []))
    for k in ("uid", "text"):
        if k in f:
            fields[k] = f[k]
    a.signing_key.verify(command["signature"], spec.tail_command_signing_input(fields))
    return a.key.decrypt(command["wrapped_key"], OAEP)


def tail_batch(key: bytes, tail_id: str, agent_id: str, seq: int, cursor: int, messages=(), dropped=0, uid="u-3") -> dict:
    """A TailBatch (§20) of records of `uid`, sealed under `key`."""
    records = [json.loads(record_line(now_us(), m, uid=uid)) for m in messages]
    plaintext = json.dumps({"contexts": {"1": CONTEXT}, "records": records}, separators=(",", ":")).encode()
    nonce = os.urandom(12)
    sealed = AESGCM(key).encrypt(nonce, plaintext, spec.tail_batch_associated_data(tail_id, agent_id, seq, dropped, cursor))
    batch = {"tail_id": tail_id, "seq": seq, "cursor": cursor, "nonce": nonce, "ciphertext": sealed}
    if dropped:
        batch["dropped"] = dropped
    return batch


@case("§20 a live tail: offered to an agent with the capability only, signed and wrapped for it, batches acknowledged in order, resumed on a new connection, and ended when one breaks the order")
def live_tail(s: Server, a: Agent):
    # Without the capability: nothing of it, whatever tails of its users run.
    plain = a.connect()
    expect("live-tail not agreed unasked", "live-tail" in plain.agreed, False)
    plain.send("heartbeat", {"seq": 1, "active_uids": ["u-3"]})
    plain.expect("heartbeat_ack")
    tail = s.admin("POST", "/v1/tails", {"uid": "u-3", "filter": {"levels": ["info", "warning"]}, "durationSeconds": 600})
    plain.send("heartbeat", {"seq": 2, "active_uids": ["u-3"]})
    name, _ = plain.expect("heartbeat_ack", "tail_command", skip=("pull_command",))
    expect("no TailCommand to an agent without the capability", name, "heartbeat_ack")
    plain.close()

    try:
        live_tail_exchange(s, a, tail)
    finally:
        # Stopped however the checks went: a failing run leaves no tail open (5 per caller).
        try:
            s.admin("DELETE", f"/v1/tails/{tail['id']}")
        except Exception:
            pass


def live_tail_exchange(s: Server, a: Agent, tail: dict):
    link = a.connect(capabilities=("live-tail",))
    expect("live-tail agreed", "live-tail" in link.agreed, True)
    command = tail_command(link, tail["id"])
    key = tail_key(a, command)
    expect("the tail is of the target uid, for this agent", (command["target"].get("uid"), command["target"].get("agent_id")), ("u-3", a.agent_id))
    expect("a tail lasts at most an hour", 0 < command["expires_at_us"] - command["issued_at_us"] <= 3_600_000_000, True)
    link.send("tail_accepted", {"tail_id": tail["id"], "start_cursor": 100})
    _, ack = link.expect("tail_ack")
    expect("acknowledged: nothing held, from the start cursor", (ack.get("seq", 0), ack.get("cursor", 0)), (0, 100))
    link.send("tail_batch", tail_batch(key, tail["id"], a.agent_id, 1, 102, ["tailed one", "tailed two"]))
    _, ack = link.expect("tail_ack")
    expect("batch 1 held", (ack.get("seq", 0), ack.get("cursor", 0)), (1, 102))
    # The same batch again (a reconnection's resend): acknowledged again, kept once.
    link.send("tail_batch", tail_batch(key, tail["id"], a.agent_id, 1, 102, ["tailed one", "tailed two"]))
    _, ack = link.expect("tail_ack")
    expect("batch 1 acknowledged again", ack.get("seq", 0), 1)
    link.close()

    # A new connection: sent again, accepted again, going on after what the server holds (its first start cursor kept).
    link = a.connect(capabilities=("live-tail",))
    again = tail_command(link, tail["id"])
    expect("the same tail, its key wrapped anew to the same key", tail_key(a, again) == key, True)
    link.send("tail_accepted", {"tail_id": tail["id"], "start_cursor": 999})
    _, ack = link.expect("tail_ack")
    expect("acknowledged with what is held", (ack.get("seq", 0), ack.get("cursor", 0)), (1, 102))
    link.send("tail_batch", tail_batch(key, tail["id"], a.agent_id, 2, 103, dropped=5))
    _, ack = link.expect("tail_ack")
    expect("a batch of drops alone is held", ack.get("seq", 0), 2)
    # Sealed as another agent's, or out of order: the agent's part ends.
    link.send("tail_batch", tail_batch(key, tail["id"], "0" * 32, 3, 104, ["moved"]))
    name, stop = link.expect("tail_stop", "tail_ack")
    expect("a batch sealed for another agent ends the part", (name, stop.get("tail_id")), ("tail_stop", tail["id"]))
    link.send("heartbeat", {"seq": 3})
    link.expect("heartbeat_ack", skip=("pull_command", "tail_ack", "tail_stop"))
    shown = s.admin("GET", f"/v1/tails/{tail['id']}")
    part = [p for p in shown["parts"] if p["agentID"] == a.agent_id][0]
    expect("the server held two records and five left out, then ended the part",
           (part["records"], part["dropped"], part["heldSeq"], part["startCursor"], part["status"]), (2, 5, 2, 100, "ended"))
    link.close()


def trigger_set(link: wire.Link) -> dict:
    """The next TriggerSet (other frames passed over)."""
    while True:
        name, message = link.receive()
        if name == "trigger_set":
            return message


def check_trigger_set(a: Agent, ts: dict):
    """§21: a set's signature verifies under the server signing key over its signing input."""
    triggers = []
    for t in ts.get("triggers", []):
        t = dict(t)
        for k in ("before_s", "after_s", "max_per_device_day", "expires_at_us"):
            t.setdefault(k, 0)
        triggers.append(t)
    fields = dict(agent_id=ts.get("agent_id", ""), version=ts.get("version", 0), issued_at_us=ts.get("issued_at_us", 0), triggers=triggers)
    a.signing_key.verify(ts["signature"], spec.trigger_set_signing_input(fields))


def capture_upload(link: wire.Link, a: Agent, trigger_id: str, matched_us: int, before_s: int, after_s: int, uid="u-3", set_version=1, upload_id=None) -> tuple:
    """A capture (§21) of `trigger_id` for a match at `matched_us`, with its window: the server's answer."""
    upload_id = upload_id or os.urandom(16).hex()
    since, until = matched_us - before_s * 1_000_000, matched_us + after_s * 1_000_000 + 1
    match = {"ts": rfc3339(matched_us), "level": "error", "type": "app", "uid": uid, "message": "conformance match", "metadata": {}, "context": 1}
    data, _ = payload(upload_id, a.agent_id, kind="capture", filter={"since": rfc3339(since), "until": rfc3339(until), "uid": uid},
                      manifest_changes={"capture": {"trigger_id": trigger_id, "set_version": set_version, "crash": False,
                                                    "matched_at": rfc3339(matched_us), "match": match}})
    key = os.urandom(32)
    h = header(upload_id, a.agent_id, len(data), kind=4, wrapped_key=a.encryption_key.encrypt(key, OAEP),
               capture={"trigger_id": trigger_id, "set_version": set_version, "uid": uid, "since_us": since, "until_us": until, "matched_at_us": matched_us})
    return upload(link, h, seal(key, h, data))


@case("§21 triggers: a signed set for the agent that agreed (none for one that did not), after its AuthResult and again when a trigger is made; a capture of its trigger lands once per budget; one of no trigger of its, or overlapping, is refused")
def triggers_and_captures(s: Server, a: Agent):
    plain = a.connect()
    expect("triggers not agreed unasked", "triggers" in plain.agreed, False)
    plain.close()
    made = []
    try:
        made.append(s.admin("POST", "/v1/triggers", {"name": "conformance errors", "match": {"levels": ["error"]}, "beforeSeconds": 60, "afterSeconds": 10,
                                                     "perDevicePerDay": 2}))
        link = a.connect(capabilities=("triggers",))
        expect("triggers agreed", "triggers" in link.agreed, True)
        ts = trigger_set(link)
        check_trigger_set(a, ts)
        print("  ok: the set's signature verifies")
        expect("the set is for this agent", ts.get("agent_id"), a.agent_id)
        ids = [t["trigger_id"] for t in ts.get("triggers", [])]
        expect("it holds the trigger", made[0]["id"] in ids, True)
        link.send("trigger_set_ack", {"version": ts.get("version", 0), "issued_at_us": ts.get("issued_at_us", 0)})
        # A new trigger: a new set at once, on the same connection.
        made.append(s.admin("POST", "/v1/triggers", {"name": "conformance timeouts", "match": {"text": "timed out"}}))
        again = trigger_set(link)
        check_trigger_set(a, again)
        expect("the next set holds both, a later version", (sorted(t["trigger_id"] for t in again.get("triggers", [])) == sorted(m["id"] for m in made),
                                                            again.get("version", 0) > ts.get("version", 0)), (True, True))
        link.send("trigger_set_ack", {"version": again.get("version", 0), "issued_at_us": again.get("issued_at_us", 0)})
        # The agent names its user before it captures the user's records.
        link.send("heartbeat", {"seq": 1, "active_uids": ["u-3"]})
        link.expect("heartbeat_ack")
        t = now_us() - 30_000_000
        trigger = made[0]["id"]
        expect("a capture of its trigger", code_of(capture_upload(link, a, trigger, t, 60, 10)), "ok")
        expect("a window overlapping it", code_of(capture_upload(link, a, trigger, t + 5_000_000, 1, 10)), "ERROR_UPLOAD_INVALID")
        expect("a capture of no trigger of this agent", code_of(capture_upload(link, a, os.urandom(16).hex(), t, 60, 10)), "ERROR_UPLOAD_INVALID")
        expect("a window longer than the trigger's", code_of(capture_upload(link, a, trigger, t + 20_000_000, 61, 10)), "ERROR_UPLOAD_INVALID")
        expect("the second of the day", code_of(capture_upload(link, a, trigger, t + 20_000_000, 5, 1)), "ok")
        expect("the third: the budget is spent", code_of(capture_upload(link, a, trigger, t + 25_000_000, 1, 1)), "ERROR_BUDGET_SPENT")
        link.close()
    finally:
        for m in made:
            try:
                s.admin("DELETE", f"/v1/triggers/{m['id']}")
            except Exception:
                pass


@case("§10 answers the server does not expect change nothing")
def unexpected_answers(s: Server, a: Agent):
    link = a.connect()
    cid, key, data, h = honest_pull(s, a, link)
    link.send("command_rejected", {"command_id": cid, "reason": 8})  # after CommandAccepted: ignored
    link.send("command_accepted", {"command_id": os.urandom(16).hex(), "upload_id": "x"})  # no such pull: ignored
    link.send("error", {"code": 14, "detail": "x", "upload_id": os.urandom(16).hex()})  # no such pull: ignored
    link.send("command_accepted", {"command_id": "not-an-id"})
    expect("an answer whose id is not of the §5 form", code_of(link.expect("heartbeat_ack")), "ERROR_UPLOAD_INVALID")
    name, result = upload(link, h, seal(key, h, data))
    expect("the accepted pull still uploads", code_of((name, result)), "ok")
    expect("and completes", s.pull_status(cid, a.agent_id), "complete")
    link.close()


@case("§11 a failed upload begun again is answered its original result, on any connection")
def failed_again(s: Server, a: Agent):
    link = a.connect()
    cid, key, data, h = honest_pull(s, a, link)
    chunks = seal(key, h, data)
    chunks[0] = bytes([chunks[0][0] ^ 1]) + chunks[0][1:]
    first = upload(link, h, chunks)
    expect("a chunk that does not authenticate", code_of(first), "ERROR_CHUNK_AUTH_FAILED")
    link.close()
    link = a.connect()
    link.send("upload_begin", {"header": h})
    again = link.expect("upload_ready", "upload_result")
    expect("begun again", (again[0], again[1].get("error")), ("upload_result", first[1].get("error")))
    link.send("upload_status_query", {"upload_id": cid})
    expect("its status", wire.STATES[link.expect("upload_status")[1].get("state", 0)], "FAILED")
    link.close()


def many_days(count: int):
    """Entries for `count` days of one record each, listed in the manifest: (entries changer,
    manifest changes)."""
    start = 946_684_800_000_000  # 2000-01-01
    lines = [(start + i * 86_400_000_000, record_line(start + i * 86_400_000_000, f"day {i}")) for i in range(count)]
    days = [{"file": rfc3339(ts)[:10] + ".jsonl", "records": 1, "bytes": len(line.encode()), "first": rfc3339(ts), "last": rfc3339(ts)} for ts, line in lines]

    def entries(original):
        manifest = json.loads(original[-1][1])
        manifest.update(days=days, record_count=count)
        return [(d["file"], line.encode()) for d, (_, line) in zip(days, lines)] + [("manifest.json", json.dumps(manifest).encode())]
    return entries


TEMPLATE_PULL, TEMPLATE_AGENT, TEMPLATE_FEEDBACK = "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e", "4f1c2a9e0b7d3c5a6e8f9a1b2c3d4e5f", "5e0c1d2f3a4b5c6d7e8f90a1b2c3d4e5"


def day_lines(file: str, records: int, size: int) -> bytes:
    """`records` record lines of u-1002 inside the day `file` names, `size` bytes in all."""
    try:
        start = parse_rfc3339(file[:10] + "T12:00:00.000000Z")
    except ValueError:
        start = 1_795_176_000_000_000
    lines = [record_line(start + i, "", uid="u-1002") for i in range(records)]
    pad = size - len("".join(lines).encode())
    if lines and pad > 0:
        lines[-1] = record_line(start + records - 1, "x" * pad, uid="u-1002")
    return "".join(lines).encode()


@case("§13/§17 every case of manifests.json gets its receiver's verdict (`wire`) on the wire")
def manifest_cases(s: Server, a: Agent):
    with open(os.path.join(HERE, "..", "..", "Protocol", "vectors", "manifests.json")) as f:
        cases = json.load(f)["cases"]
    link = a.connect()
    for c in cases:
        wanted = "ok" if c["wire"] == "accepted" else "ERROR_PAYLOAD_INVALID"
        try:
            m = json.loads(c["manifest"])
        except ValueError:
            m = None
        m = m if isinstance(m, dict) else {}
        if m.get("kind") == "feedback":
            fid, key, created = os.urandom(16).hex(), os.urandom(32), parse_rfc3339("2026-11-21T08:00:00.000000Z")
            upload_id, cid = fid, None
        else:
            pull_filter = {}
            f = m.get("filter") if c["wire"] == "accepted" else None
            if isinstance(f, dict):
                levels = ["trace", "debug", "info", "notice", "warning", "error", "critical"]
                pull_filter = {k: v for k, v in (("since", f.get("since") and parse_rfc3339(f["since"])), ("until", f.get("until") and parse_rfc3339(f["until"])),
                                                 ("types", f.get("types")), ("levels", [levels.index(l) for l in f.get("levels", [])] or None), ("text", f.get("text"))) if v}
            command, key = a.pull(link, uid="u-1002", filter=pull_filter)
            cid = upload_id = command["command_id"]
            fid = os.urandom(16).hex()
        text = c["manifest"].replace(TEMPLATE_PULL, cid or TEMPLATE_PULL).replace(TEMPLATE_AGENT, a.agent_id).replace(TEMPLATE_FEEDBACK, fid)
        entries = [(d["file"], day_lines(d["file"], d["records"], d["bytes"])) for d in m.get("days", []) if isinstance(d, dict)
                   and isinstance(d.get("file"), str) and isinstance(d.get("records"), int) and isinstance(d.get("bytes"), int)]
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data in entries + [("manifest.json", text.encode())]:
                z.writestr(name, data)
        data = out.getvalue()
        empty = m.get("empty") is True
        if m.get("kind") == "feedback":
            fb = {"feedback_id": fid, "uid": "u-1002", "text": "The oven beeps twice and stops.", "created_at_us": created}
            h = header(fid, a.agent_id, len(data), kind=2, empty=empty, feedback=fb, wrapped_key=a.encryption_key.encrypt(key, OAEP))
        else:
            h = header(upload_id, a.agent_id, len(data), empty=empty)
        expect(f"{c['name']}: {c['wire']}", code_of(upload(link, h, seal(key, h, data))), wanted)
    link.close()


@case("§13 what a receiver makes of each line: off its file's day, or not a type name, it is set aside; the upload completes")
def record_lines(s: Server, a: Agent):
    link = a.connect()
    command, key = a.pull(link)
    cid = command["command_id"]
    base = 1_795_132_800_000_000  # 2026-11-21T00:00:00Z, the day of payload()'s one file
    lines = [record_line(base + 1_000_000, "kept on its day"), record_line(base - 1, "the day before"),
             record_line(base + 86_400_000_000, "the day after"), record_line(base + 2_000_000, "kept, escaped type").replace('"type":"app"', '"type":"\\u0061pp"'),
             record_line(base + 3_000_000, "a capital type").replace('"type":"app"', '"type":"App"')]
    text = "".join(lines).encode()

    def entries(original):
        manifest = json.loads(original[-1][1])
        manifest["days"][0].update(records=len(lines), bytes=len(text), first=rfc3339(base - 1), last=rfc3339(base + 86_400_000_000))
        manifest["record_count"] = len(lines)
        return [(original[0][0], text), ("manifest.json", json.dumps(manifest).encode())]
    data, _ = payload(cid, a.agent_id, entries_changes=entries)
    h = header(cid, a.agent_id, len(data))
    name, result = upload(link, h, seal(key, h, data))
    expect("an upload whose day file holds such lines", (code_of((name, result)), result.get("records")), ("ok", len(lines)))
    link.close()
    found = []
    for _ in range(200):
        page = s.admin("POST", "/v1/records/search", {"pull": cid, "limit": 100})
        found = sorted(r["message"] for r in page["records"])
        if found and not page.get("indexing"):
            break
        time.sleep(0.1)
    expect("what the server indexed of them", found, ["kept on its day", "kept, escaped type"])


@case("§13 limits counted on the bytes inflated: entries, compression ratio")
def payload_limits(s: Server, a: Agent):
    link = a.connect()
    payload_case(s, a, link, "999 day files and the manifest (1,000 entries)", "ok", entries_changes=many_days(999))
    payload_case(s, a, link, "1,000 day files and the manifest (1,001 entries)", entries_changes=many_days(1000))

    def bomb(entries):
        manifest = json.loads(entries[-1][1])
        text = b"\n" * (8 << 20)
        manifest["days"][0].update(records=len(text), bytes=len(text))
        manifest["record_count"] = len(text)
        return [(entries[0][0], text), ("manifest.json", json.dumps(manifest).encode())]
    payload_case(s, a, link, "a day file that inflates over 200 times its size", entries_changes=bomb)
    link.close()


def second_server_cases(binary: str, failures: list):
    """Rules that need the server's deadlines and caps set small (server.json)."""
    # Deadlines small enough to wait for, with room for a slow machine: an 8 s handshake, a
    # 2 s heartbeat interval (so 6 s without a frame closes a connection).
    config = {"connections": {"handshakeSeconds": 8, "missedHeartbeats": 3, "maxUnauthenticatedPerAddress": 4, "restartWithinSeconds": 30},
              "feedback": {"perHour": 2}}
    s = Server(binary, config=config, heartbeat_seconds=2)
    try:
        a = Agent(s)
        assert a.enroll()[0] == "enroll_response"
        checks = []

        def check(rule):
            def register(fn):
                checks.append((rule, fn))
                return fn
            return register

        @check("§6 HANDSHAKE_TIMEOUT: a connection not ready in time is closed, whatever it sent")
        def handshake():
            link = a.connect()
            expect("a connection that authenticates at once", link.session["agent_id"], a.agent_id)
            link.send("heartbeat", {"seq": 1})
            expect("is served", code_of(link.expect("heartbeat_ack")), "heartbeat_ack")
            link.close()
            silent = fresh_link(s)
            expect("a connection that sends nothing: open after 6 s (no sooner than the 8 s deadline)", silent.closed(within=6), False)
            expect("a connection that sends nothing: closed by the 8 s deadline", silent.closed(within=20), True)
            slow = fresh_link(s)
            a.hello(slow)
            expect("a connection that stops after Hello", slow.closed(within=20), True)

        @check("§9 MISSED_HEARTBEATS: a ready connection with no whole frame for 3 intervals gets Goodbye and is closed")
        def heartbeat_deadline():
            link = a.connect()
            for seq in range(1, 9):
                time.sleep(1)
                link.send("heartbeat", {"seq": seq})
                expect(f"heartbeat {seq} at {seq} s (past the 6 s deadline from the start)", code_of(link.expect("heartbeat_ack")), "heartbeat_ack")
            expect("then silence", link.frames_until_closed(within=20), ["goodbye"])

        @check("§6 one connection per agent: a new authenticated one replaces the old")
        def one_connection():
            old = a.connect()
            new = a.connect()
            expect("the old connection", old.frames_until_closed(within=10), ["goodbye"])
            new.send("heartbeat", {"seq": 1})
            expect("the new one is served", code_of(new.expect("heartbeat_ack")), "heartbeat_ack")
            new.close()

        @check("§6 caps: unauthenticated connections per address are capped, enrolled agents still connect")
        def caps():
            held = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(4)]
            time.sleep(0.5)
            started = time.time()
            refused = False
            try:
                link = fresh_link(s)
                refused = link.closed(within=2)
            except (OSError, wire.Closed):
                refused = True
            # Well before the 8 s handshake deadline, which would close it anyway.
            expect("4 allowed from one address, the 5th closed at once", refused and time.time() - started < 4, True)

            def still_open(sock):
                sock.setblocking(False)
                try:
                    return sock.recv(1) != b""
                except BlockingIOError:
                    return True
                except OSError:
                    return False
            expect("the 4 held ones are still open", all(still_open(sock) for sock in held), True)
            for sock in held:
                sock.close()
            link, deadline = None, time.time() + 15
            while link is None:
                try:
                    link = a.connect()
                except (OSError, wire.Closed, AssertionError):
                    if time.time() > deadline:
                        raise
                    time.sleep(0.2)
            expect("once they are gone, the agent connects", link.session["agent_id"], a.agent_id)
            link.close()

        @check("§11 feedback quotas: over the quota is ERROR_LIMIT_EXCEEDED before anything is stored; what counts")
        def quotas():
            link = a.connect()
            # A refused header counts nothing.
            expect("a refused feedback header", code_of(upload(link, *feedback_upload(a, text=""))), "ERROR_UPLOAD_INVALID")
            # A failed one counts: its first chunk does not authenticate.
            failed = feedback_upload(a, text="broken")
            h, chunks = failed
            expect("a first feedback of two an hour, that fails", code_of(upload(link, h, [bytes([chunks[0][0] ^ 1]) + chunks[0][1:]] + chunks[1:])),
                   "ERROR_CHUNK_AUTH_FAILED")
            # One begun and not finished counts too.
            second = feedback_upload(a, text="slow")
            expect("a second, begun and left unfinished", code_of(upload(link, second[0], second[1], complete=False)), "chunk_ack")
            expect("a third feedback in the hour", code_of(upload(link, *feedback_upload(a, text="slow"))), "ERROR_LIMIT_EXCEEDED")
            link.close()
            # Resumed (on a new connection) at the quota, the second is never refused and completes;
            # the failed one begun again gets its result.
            link = a.connect()
            expect("the second resumed at the quota, and completed", code_of(upload(link, *second)), "ok")
            link.send("upload_begin", {"header": failed[0]})
            name, again = link.expect("upload_ready", "upload_result")
            expect("the failed one begun again", (name, code_of((name, again))), ("upload_result", "ERROR_CHUNK_AUTH_FAILED"))
            link.close()

        # Last: it stops the server.
        @check("§6 planned restarts: a stopping server's Goodbye says when it expects to be back")
        def planned_restart():
            replaced = a.connect()
            link = a.connect()
            name, replacement = replaced.expect("goodbye")
            expect("a replaced connection's Goodbye names no return", (replacement.get("back_within_ms", 0), replacement.get("retry_every_ms", 0)), (0, 0))
            s.process.send_signal(signal.SIGTERM)
            name, goodbye = link.expect("goodbye")
            expect("the stopping server's Goodbye: back within restartWithinSeconds (30 s), retry every 2 s (a small fleet)",
                   (goodbye.get("back_within_ms"), goodbye.get("retry_every_ms")), (30000, 2000))
            expect("then it closes", link.frames_until_closed(within=20), [])

        run_rules(checks, failures)
        return len(checks)
    finally:
        s.stop()
        if not failures:
            shutil.rmtree(s.dir, ignore_errors=True)


def run_rules(rules, failures: list):
    """Runs each (rule, check) in turn, printing the rule; a check that raises adds its rule to
    `failures`, and the next goes on."""
    for rule, fn in rules:
        print(rule)
        try:
            fn()
        except Exception:
            failures.append(rule)
            print("  FAIL:", traceback.format_exc().strip().splitlines()[-1])
            traceback.print_exc()


def rotation_cases(binary: str, failures: list) -> int:
    """§4 capabilities and §5 key rotation, on a server of their own rotated by its command
    (`keys rotate`), with a heartbeat a second. Returns the number of rules."""
    s = Server(binary, heartbeat_seconds=1, config={"connections": {"missedHeartbeats": 60}})
    data = os.path.join(s.dir, "server")
    checks = []

    def check(rule):
        def register(fn):
            checks.append((rule, fn))
            return fn
        return register

    try:
        old, capable = Agent(s), Agent(s)
        enrolled_old, enrolled_capable = old.enroll(), capable.enroll(capabilities=["key-rotation"])
        assert enrolled_old[0] == "enroll_response" and enrolled_capable[0] == "enroll_response"

        @check("§4 capabilities: the server agrees to those it knows, once each, in the order listed; none to an agent that lists none")
        def capabilities():
            link = fresh_link(s)
            ack = old.hello(link, ["no-such-capability", "key-rotation", "key-rotation"])
            expect("agreed", ack.get("capabilities", []), ["key-rotation"])
            link.close()
            link = fresh_link(s)
            expect("an agent that lists none", old.hello(link).get("capabilities", []), [])
            link.close()
            expect("an enrollment with key-rotation agreed names the keys' generation", enrolled_capable[1].get("key_generation"), 1)
            expect("one without it: the base protocol's answer, no key_generation", "key_generation" in enrolled_old[1], False)

        @check("§5 key rotation: announced to an agent behind, signed by the previous key; its commands then signed with the new one; an agent without the capability is served as before")
        def rotation():
            generation1 = capable.signing_key
            subprocess.run([binary, "keys", "rotate", "--data", data, "--overlap", "1h"], check=True, capture_output=True)
            link = capable.connect(capabilities=["key-rotation"], key_generation=1)
            expect("agreed", link.agreed, ["key-rotation"])
            # The server looks at its key ring every few seconds: heartbeat until it announces.
            announced, seq, deadline = [], 0, time.time() + 60
            while not announced and time.time() < deadline:
                seq += 1
                link.send("heartbeat", {"seq": seq, "key_generation": 1})
                name, ack = link.expect("heartbeat_ack", skip=("pull_command",))
                assert name == "heartbeat_ack", (name, ack)
                announced = ack.get("key_announcements", [])
                if not announced:
                    time.sleep(1)
            expect("one announcement", len(announced), 1)
            a = announced[0]
            expect("of generation 2", a.get("generation"), 2)
            generation1.verify(a["signature"], spec.key_announcement_signing_input(a))
            print("  ok: signed by generation 1's key")
            expect("generation 1 retires in an hour", abs(a["previous_retires_at_us"] - (now_us() + 3_600_000_000)) < 300_000_000, True)
            forged = dict(a, previous_retires_at_us=a["previous_retires_at_us"] + 1)
            try:
                generation1.verify(a["signature"], spec.key_announcement_signing_input(forged))
                raise AssertionError("a changed announcement verified")
            except InvalidSignature:
                print("  ok: a changed announcement does not verify")
            new_signing = ed25519.Ed25519PublicKey.from_public_bytes(a["signing_key"])
            new_encryption = serialization.load_der_public_key(a["encryption_key"])
            expect("an RSA key of 3072 bits", new_encryption.key_size, 3072)
            seq += 1
            link.send("heartbeat", {"seq": seq, "key_generation": 2})
            name, ack = link.expect("heartbeat_ack", skip=("pull_command",))
            expect("nothing announced once it pins generation 2", ack.get("key_announcements", []), [])
            capable.signing_key, capable.encryption_key = new_signing, new_encryption
            command, key = capable.pull(link)  # verifies under the new key
            print("  ok: its command is signed with generation 2's key")
            link.close()
            link = capable.connect(capabilities=["key-rotation"], key_generation=2)
            expect("a feedback sealed for generation 2's key", code_of(upload(link, *feedback_upload(capable))), "ok")
            link.close()

            link = old.connect()
            expect("nothing agreed", link.agreed, [])
            link.send("heartbeat", {"seq": 1})
            name, ack = link.expect("heartbeat_ack", skip=("pull_command",))
            expect("no announcement to an agent without the capability", ack.get("key_announcements", []), [])
            old.pull(link)  # verifies under generation 1's key
            print("  ok: its command is signed with generation 1's key, which it pins")
            expect("a feedback sealed for generation 1's key", code_of(upload(link, *feedback_upload(old))), "ok")
            link.close()

        run_rules(checks, failures)
    finally:
        s.stop()
    if not any(rule for rule, _ in checks if rule in failures):
        shutil.rmtree(s.dir, ignore_errors=True)
    return len(checks)


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    # Ten missed heartbeats (50 s) before the server closes a quiet connection: the agent
    # here answers in lock step and sends heartbeats only where a case needs them.
    server = Server(sys.argv[1], config={"connections": {"missedHeartbeats": 10}})
    failures = []
    try:
        agent = Agent(server)
        name, _ = agent.enroll()
        assert name == "enroll_response", name
        run_rules([(rule, lambda fn=fn: fn(server, agent)) for rule, fn in CASES], failures)
    finally:
        server.stop()
    total = len(CASES) + second_server_cases(sys.argv[1], failures) + rotation_cases(sys.argv[1], failures)
    if failures:
        print(f"{len(failures)} of {total} rules FAILED; the servers' logs are under {tempfile.gettempdir()}/dredge-conformance-*")
        raise SystemExit(1)
    shutil.rmtree(server.dir, ignore_errors=True)
    print(f"all {total} rules hold")


if __name__ == "__main__":
    main()
