"""The wire protocol of Protocol/README.md §3 and dredge.proto, written from the specification:
a minimal proto3 codec for the messages the conformance agent uses, frames, and a TLS link.

Messages are dicts; each schema below maps a field name to (number, type), where type is one of
"uint", "int", "bool", "string", "bytes", "enum", ("msg", SCHEMA), ("repeated", type) or
("map", key type, value type).
"""
import os
import socket
import ssl
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
from dredge_spec import varint as read_varint  # noqa: E402  (the interop check's protobuf reader)

HELLO = {"min_version": (1, "uint"), "max_version": (2, "uint"), "software": (3, "string"), "capabilities": (4, ("repeated", "string"))}
HELLO_ACK = {"version": (1, "uint"), "software": (2, "string"), "challenge": (3, "bytes"), "capabilities": (4, ("repeated", "string"))}
HOST_INFO = {"hostname": (1, "string"), "os": (2, "string"), "app": (3, "string"), "app_version": (4, "string"),
             "extra": (5, ("map", "string", "string"))}
ENROLL_REQUEST = {"token": (1, "string"), "public_key": (2, "bytes"), "host": (3, ("msg", HOST_INFO))}
ENROLL_RESPONSE = {"agent_id": (1, "string"), "server_signing_key": (2, "bytes"), "server_encryption_key": (3, "bytes"), "key_generation": (4, "uint")}
AUTH_RESPONSE = {"agent_id": (1, "string"), "signature": (2, "bytes"), "host": (3, ("msg", HOST_INFO)), "key_generation": (4, "uint")}
AUTH_RESULT = {"agent_id": (1, "string"), "heartbeat_interval_s": (2, "uint"), "window": (3, "uint"), "max_chunk_bytes": (4, "uint")}
STORE_STATS = {"records": (1, "uint"), "oldest_us": (2, "int"), "newest_us": (3, "int"), "bytes_on_disk": (4, "uint"), "dropped": (5, "uint")}
USER_SEEN = {"uid": (1, "string"), "last_seen_us": (2, "int")}
USER_REPORT = {"users": (1, ("repeated", ("msg", USER_SEEN))), "truncated": (2, "bool")}
HEARTBEAT = {"seq": (1, "uint"), "active_uids": (2, ("repeated", "string")), "stats": (3, ("msg", STORE_STATS)),
             "users": (4, ("msg", USER_REPORT)), "key_generation": (5, "uint")}
KEY_ANNOUNCEMENT = {"generation": (1, "uint"), "signing_key": (2, "bytes"), "encryption_key": (3, "bytes"), "issued_at_us": (4, "int"),
                    "previous_retires_at_us": (5, "int"), "signature": (6, "bytes")}
HEARTBEAT_ACK = {"seq": (1, "uint"), "key_announcements": (2, ("repeated", ("msg", KEY_ANNOUNCEMENT)))}
TARGET = {"uid": (1, "string"), "agent_id": (2, "string")}
FILTER = {"since_us": (1, "int"), "until_us": (2, "int"), "uid": (3, "string"), "types": (4, ("repeated", "string")),
          "levels": (5, ("repeated", "enum")), "text": (6, "string")}
PULL_COMMAND = {"command_id": (1, "string"), "target": (2, ("msg", TARGET)), "filter": (3, ("msg", FILTER)), "issued_at_us": (4, "int"),
                "expires_at_us": (5, "int"), "wrapped_key": (6, "bytes"), "signature": (7, "bytes"),
                "urgent": (8, "bool")}  # §22, only with `urgent` agreed
COMMAND_ACCEPTED = {"command_id": (1, "string"), "upload_id": (2, "string")}
COMMAND_REJECTED = {"command_id": (1, "string"), "reason": (2, "enum"), "detail": (3, "string")}
FEEDBACK = {"feedback_id": (1, "string"), "uid": (2, "string"), "text": (3, "string"), "created_at_us": (4, "int")}
CAPTURE = {"trigger_id": (1, "string"), "set_version": (2, "uint"), "uid": (3, "string"), "since_us": (4, "int"), "until_us": (5, "int"),
           "matched_at_us": (6, "int"), "crash": (7, "bool")}
UPLOAD_HEADER = {"upload_id": (1, "string"), "kind": (2, "enum"), "agent_id": (3, "string"), "nonce_prefix": (4, "bytes"),
                 "chunk_size": (5, "uint"), "plaintext_size": (6, "uint"), "chunk_count": (7, "uint"), "wrapped_key": (8, "bytes"),
                 "feedback": (9, ("msg", FEEDBACK)), "empty": (10, "bool"), "created_at_us": (11, "int"), "capture": (12, ("msg", CAPTURE))}
UPLOAD_BEGIN = {"header": (1, ("msg", UPLOAD_HEADER))}
UPLOAD_READY = {"upload_id": (1, "string"), "received": (2, "bytes")}
UPLOAD_CHUNK = {"upload_id": (1, "string"), "index": (2, "uint"), "ciphertext": (3, "bytes")}
CHUNK_ACK = {"upload_id": (1, "string"), "index": (2, "uint")}
UPLOAD_STATUS_QUERY = {"upload_id": (1, "string")}
UPLOAD_STATUS = {"upload_id": (1, "string"), "state": (2, "enum"), "received": (3, "bytes")}
UPLOAD_COMPLETE = {"upload_id": (1, "string")}
UPLOAD_RESULT = {"upload_id": (1, "string"), "ok": (2, "bool"), "error": (3, "enum"), "detail": (4, "string"), "files": (5, "uint"),
                 "records": (6, "uint")}
ERROR = {"code": (1, "enum"), "detail": (2, "string"), "fatal": (3, "bool"), "upload_id": (4, "string")}
GOODBYE = {"reason": (1, "string"), "back_within_ms": (2, "uint"), "retry_every_ms": (3, "uint")}
# Live tail (§20), only with `live-tail` agreed.
TAIL_FILTER = {"uid": (1, "string"), "types": (2, ("repeated", "string")), "levels": (3, ("repeated", "enum")), "text": (4, "string")}
TAIL_COMMAND = {"tail_id": (1, "string"), "target": (2, ("msg", TARGET)), "filter": (3, ("msg", TAIL_FILTER)), "issued_at_us": (4, "int"),
                "expires_at_us": (5, "int"), "max_records_per_s": (6, "uint"), "max_bytes_per_s": (7, "uint"), "verbose": (8, "bool"),
                "verbose_types": (9, ("repeated", "string")), "wrapped_key": (10, "bytes"), "signature": (11, "bytes"),
                "urgent": (12, "bool")}  # §22, only with `urgent` agreed
TAIL_ACCEPTED = {"tail_id": (1, "string"), "start_cursor": (2, "uint")}
TAIL_BATCH = {"tail_id": (1, "string"), "seq": (2, "uint"), "dropped": (3, "uint"), "ciphertext": (4, "bytes"), "cursor": (5, "uint"),
              "nonce": (6, "bytes")}
TAIL_ACK = {"tail_id": (1, "string"), "seq": (2, "uint"), "cursor": (3, "uint")}
TAIL_STOP = {"tail_id": (1, "string"), "reason": (2, "string")}
# Triggers and captures (§21), only with `triggers` agreed.
TRIGGER_MATCH = {"levels": (1, ("repeated", "enum")), "types": (2, ("repeated", "string")), "text": (3, "string"), "metadata_key": (4, "string"),
                 "metadata_value": (5, "string")}
TRIGGER = {"trigger_id": (1, "string"), "name": (2, "string"), "match": (3, ("msg", TRIGGER_MATCH)), "crash": (4, "bool"), "uid": (5, "string"),
           "app": (6, "string"), "min_app_version": (7, "string"), "max_app_version": (8, "string"), "before_s": (9, "uint"), "after_s": (10, "uint"),
           "max_per_device_day": (11, "uint"), "expires_at_us": (12, "int")}
TRIGGER_SET = {"agent_id": (1, "string"), "version": (2, "uint"), "issued_at_us": (3, "int"), "triggers": (4, ("repeated", ("msg", TRIGGER))),
               "signature": (5, "bytes")}
TRIGGER_SET_ACK = {"version": (1, "uint"), "reason": (2, "enum"), "detail": (3, "string"), "issued_at_us": (4, "int")}

BODIES = {
    "hello": (1, HELLO), "hello_ack": (2, HELLO_ACK), "enroll_request": (3, ENROLL_REQUEST), "enroll_response": (4, ENROLL_RESPONSE),
    "auth_response": (5, AUTH_RESPONSE), "auth_result": (6, AUTH_RESULT), "heartbeat": (7, HEARTBEAT), "heartbeat_ack": (8, HEARTBEAT_ACK),
    "pull_command": (9, PULL_COMMAND), "command_accepted": (10, COMMAND_ACCEPTED), "command_rejected": (11, COMMAND_REJECTED),
    "upload_begin": (12, UPLOAD_BEGIN), "upload_ready": (13, UPLOAD_READY), "upload_chunk": (14, UPLOAD_CHUNK), "chunk_ack": (15, CHUNK_ACK),
    "upload_status_query": (16, UPLOAD_STATUS_QUERY), "upload_status": (17, UPLOAD_STATUS), "upload_complete": (18, UPLOAD_COMPLETE),
    "upload_result": (19, UPLOAD_RESULT), "error": (20, ERROR), "goodbye": (21, GOODBYE),
    "tail_command": (22, TAIL_COMMAND), "tail_accepted": (23, TAIL_ACCEPTED), "tail_batch": (24, TAIL_BATCH), "tail_ack": (25, TAIL_ACK),
    "tail_stop": (26, TAIL_STOP), "trigger_set": (27, TRIGGER_SET), "trigger_set_ack": (28, TRIGGER_SET_ACK),
}
BODY_BY_NUMBER = {number: (name, schema) for name, (number, schema) in BODIES.items()}

ERRORS = {0: "ERROR_UNSPECIFIED", 1: "ERROR_VERSION_UNSUPPORTED", 2: "ERROR_MALFORMED_FRAME", 3: "ERROR_FRAME_TOO_LARGE",
          4: "ERROR_UNEXPECTED_MESSAGE", 5: "ERROR_ENROLLMENT_REFUSED", 6: "ERROR_AUTH_FAILED", 7: "ERROR_UPLOAD_UNKNOWN",
          8: "ERROR_UPLOAD_INVALID", 9: "ERROR_CHUNK_INVALID", 10: "ERROR_CHUNK_AUTH_FAILED", 11: "ERROR_UPLOAD_INCOMPLETE",
          12: "ERROR_PAYLOAD_INVALID", 13: "ERROR_LIMIT_EXCEEDED", 14: "ERROR_INTERNAL", 15: "ERROR_SHUTTING_DOWN",
          16: "ERROR_KEYS_RETIRED", 17: "ERROR_BUDGET_SPENT"}
CODE = {name: number for number, name in ERRORS.items()}
STATES = {0: "UNKNOWN", 1: "RECEIVING", 2: "COMPLETE", 3: "FAILED"}
LEVELS = ["trace", "debug", "info", "notice", "warning", "error", "critical"]


# --- proto3 -----------------------------------------------------------------------------------


def varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def key(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def encode(message: dict, schema: dict) -> bytes:
    out = bytearray()
    for name, value in message.items():
        number, kind = schema[name]
        out += encode_field(number, kind, value)
    return bytes(out)


def encode_field(number, kind, value) -> bytes:
    if isinstance(kind, tuple) and kind[0] == "repeated":
        return b"".join(encode_field(number, kind[1], v) for v in value)
    if isinstance(kind, tuple) and kind[0] == "map":
        entry = {"key": (1, kind[1]), "value": (2, kind[2])}
        return b"".join(encode_field(number, ("msg", entry), {"key": k, "value": v}) for k, v in value.items())
    if isinstance(kind, tuple) and kind[0] == "msg":
        body = encode(value, kind[1])
        return key(number, 2) + varint(len(body)) + body
    if kind in ("uint", "int", "enum"):
        return key(number, 0) + varint(value)
    if kind == "bool":
        return key(number, 0) + varint(1 if value else 0)
    if kind == "string":
        value = value.encode("utf-8")
    return key(number, 2) + varint(len(value)) + bytes(value)


def decode(data: bytes, schema: dict) -> dict:
    by_number = {number: (name, kind) for name, (number, kind) in schema.items()}
    message, i = {}, 0
    while i < len(data):
        k, i = read_varint(data, i)
        number, wire_type = k >> 3, k & 7
        if wire_type == 0:
            raw, i = read_varint(data, i)
        elif wire_type == 2:
            size, i = read_varint(data, i)
            raw, i = data[i:i + size], i + size
        elif wire_type == 1:
            raw, i = data[i:i + 8], i + 8
        elif wire_type == 5:
            raw, i = data[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire_type}")
        if number not in by_number:
            continue  # unknown fields are ignored (§3)
        name, kind = by_number[number]
        repeated = isinstance(kind, tuple) and kind[0] == "repeated"
        if repeated and wire_type == 2 and kind[1] in ("uint", "int", "enum", "bool"):
            # Packed (proto3's default for repeated scalars): varints one after another.
            j, items = 0, message.setdefault(name, [])
            while j < len(raw):
                item, j = read_varint(raw, j)
                items.append(convert(item, kind[1]))
            continue
        value = convert(raw, kind[1] if repeated else kind)
        if repeated:
            message.setdefault(name, []).append(value)
        else:
            message[name] = value
    return message


def convert(raw, kind):
    if isinstance(kind, tuple) and kind[0] == "msg":
        return decode(raw, kind[1])
    if kind == "int":
        return raw - (1 << 64) if raw >= 1 << 63 else raw
    if kind in ("uint", "enum"):
        return raw
    if kind == "bool":
        return bool(raw)
    if kind == "string":
        return raw.decode("utf-8")
    return bytes(raw)


def frame(body_name: str, message: dict) -> bytes:
    number, schema = BODIES[body_name]
    body = encode_field(number, ("msg", schema), message)
    return struct.pack(">I", len(body)) + body


def parse_body(body: bytes) -> tuple:
    """(body name, message) of a Frame's bytes."""
    k, i = read_varint(body, 0)
    size, i = read_varint(body, i)
    name, schema = BODY_BY_NUMBER[k >> 3]
    return name, decode(body[i:i + size], schema)


# --- A TLS connection to the server -------------------------------------------------------------


class Closed(Exception):
    pass


class Link:
    def __init__(self, port: int, ca_path: str, timeout: float = 20.0):
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_path)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        # §2: connecting by IP address, the certificate must carry it as an iPAddress name.
        self.sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
        self.buffer = b""

    def send_raw(self, data: bytes):
        self.sock.sendall(data)

    def send(self, body_name: str, message: dict):
        self.send_raw(frame(body_name, message))

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            try:
                chunk = self.sock.recv(65536)
            except (ConnectionResetError, ssl.SSLError) as e:
                raise Closed(str(e))
            if not chunk:
                raise Closed("the server closed the connection")
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def receive(self) -> tuple:
        (length,) = struct.unpack(">I", self._read(4))
        return parse_body(self._read(length))

    def expect(self, *names, skip=("heartbeat_ack", "pull_command")) -> tuple:
        """The next frame that is one of `names` (an Error always ends the wait); frames named
        in `skip` are passed over."""
        while True:
            name, message = self.receive()
            if name in names or name == "error":
                return name, message
            if name not in skip:
                raise AssertionError(f"expected {names}, got {name} {message}")

    def closed(self, within: float = 20.0) -> bool:
        """True when the server closes the connection within `within` seconds (after anything
        still in flight); False when it is still open then."""
        self.sock.settimeout(within)
        try:
            while True:
                self.receive()
        except Closed:
            return True
        except (socket.timeout, TimeoutError):
            return False

    def frames_until_closed(self, within: float = 20.0) -> list:
        """The names of the frames the server sends before it closes (None at the end if it did
        not close within `within` seconds)."""
        self.sock.settimeout(within)
        names = []
        try:
            while True:
                names.append(self.receive()[0])
        except Closed:
            return names
        except (socket.timeout, TimeoutError):
            return names + [None]

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
