"""An independent implementation of the parts of Protocol/README.md the checks need.

Written from the specification, not from the Swift code: canonical encoding, the signing
inputs, the chunk nonce and associated data, agent ids, and a minimal protobuf reader.
Uses only the standard library and the `cryptography` package.
"""
import hashlib
import io
import json
import struct
import zipfile
import zlib

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

# --- Canonical encoding (README § Canonical encoding) ---------------------------------------


class Canonical:
    def __init__(self, domain: str):
        self.out = bytearray(domain.encode("ascii") + b"\x00")

    def string(self, s: str):
        self.bytes(s.encode("utf-8"))

    def bytes(self, b: bytes):
        self.out += struct.pack(">I", len(b)) + b

    def u32(self, v: int):
        self.out += struct.pack(">I", v)

    def u64(self, v: int):
        self.out += struct.pack(">Q", v)

    def i64(self, v: int):
        self.out += struct.pack(">q", v)

    def boolean(self, v: bool):
        self.out += b"\x01" if v else b"\x00"

    def optional(self, value, write):
        if value is None:
            self.out += b"\x00"
        else:
            self.out += b"\x01"
            write(value)

    def list(self, values, write):
        self.u32(len(values))
        for v in values:
            write(v)


def pull_command_signing_input(c: dict) -> bytes:
    w = Canonical("dredge.v1.pull-command")
    w.string(c["command_id"])
    w.string(c.get("target_uid", ""))
    w.string(c.get("target_agent_id", ""))
    w.optional(c.get("since_us"), w.i64)
    w.optional(c.get("until_us"), w.i64)
    w.optional(c.get("uid"), w.string)
    w.list(sorted(c.get("types", []), key=lambda t: t.encode("utf-8")), w.string)
    w.list(sorted(c.get("levels", [])), w.u32)
    w.optional(c.get("text"), w.string)
    w.i64(c["issued_at_us"])
    w.i64(c["expires_at_us"])
    w.bytes(bytes.fromhex(c.get("wrapped_key", "")))
    if c.get("urgent"):  # § 22: only when set
        w.boolean(True)
    return bytes(w.out)


def upload_header_canonical(h: dict) -> bytes:
    w = Canonical("dredge.v1.upload-header")
    w.string(h["upload_id"])
    w.u32(h["kind"])
    w.string(h["agent_id"])
    w.bytes(bytes.fromhex(h["nonce_prefix"]))
    w.u32(h["chunk_size"])
    w.u64(h["plaintext_size"])
    w.u32(h["chunk_count"])
    w.bytes(bytes.fromhex(h.get("wrapped_key", "")))
    fb = h.get("feedback")

    def feedback(f):
        w.string(f["feedback_id"])
        w.string(f["uid"])
        w.string(f["text"])
        w.i64(f["created_at_us"])

    w.optional(fb, feedback)
    w.boolean(h.get("empty", False))
    w.i64(h["created_at_us"])
    if h["kind"] == 4:  # CAPTURE (§21): the capture goes on; every other kind ends here

        def capture(c):
            w.string(c["trigger_id"])
            w.u64(c["set_version"])
            w.string(c.get("uid", ""))
            w.i64(c["since_us"])
            w.i64(c["until_us"])
            w.i64(c["matched_at_us"])
            w.boolean(c.get("crash", False))

        w.optional(h.get("capture"), capture)
    return bytes(w.out)


def trigger_set_signing_input(s: dict) -> bytes:
    """README § 21: what the server signs in a TriggerSet."""
    by_bytes = lambda t: t.encode("utf-8")
    w = Canonical("dredge.v1.trigger-set")
    w.string(s["agent_id"])
    w.u64(s["version"])
    w.i64(s["issued_at_us"])

    def match(m):
        w.list(sorted(m.get("levels", [])), w.u32)
        w.list(sorted(m.get("types", []), key=by_bytes), w.string)
        w.optional(m.get("text"), w.string)
        w.optional(m.get("metadata_key"), w.string)
        w.optional(m.get("metadata_value"), w.string)

    def trigger(t):
        w.string(t["trigger_id"])
        w.string(t["name"])
        w.optional(t.get("match"), match)
        w.boolean(t.get("crash", False))
        for name in ("uid", "app", "min_app_version", "max_app_version"):
            w.string(t.get(name, ""))
        w.u32(t["before_s"])
        w.u32(t["after_s"])
        w.u32(t["max_per_device_day"])
        w.i64(t["expires_at_us"])

    w.list(s["triggers"], trigger)
    return bytes(w.out)


def version_order(a: str, b: str) -> int:
    """README § 21, Versions: -1, 0 or 1 as app version a is before, equal to or after b."""
    x, y = a.split("."), b.split(".")
    n = max(len(x), len(y))
    x += ["0"] * (n - len(x))
    y += ["0"] * (n - len(y))

    def key(part: str):
        digits = len(part) - len(part.lstrip("0123456789"))
        number, rest = part[:digits], part[digits:]
        return (1 if number else 0, int(number) if number else 0, rest.encode("utf-8"))

    for p, q in zip(x, y):
        if key(p) != key(q):
            return -1 if key(p) < key(q) else 1
    return 0


def metadata_members(text: str):
    """README § 21: the top-level members of serialized metadata as (name, raw value text), in
    order; None when the text is not one well-formed JSON object (nothing after it)."""
    decoder = json.JSONDecoder()
    ws = " \t\n\r"
    i = 0

    def skip(i):
        while i < len(text) and text[i] in ws:
            i += 1
        return i

    try:
        i = skip(i)
        if i >= len(text) or text[i] != "{":
            return None
        i = skip(i + 1)
        members = []
        if i < len(text) and text[i] == "}":
            return members if skip(i + 1) == len(text) else None
        while True:
            if i >= len(text) or text[i] != '"':
                return None
            name, i = decoder.raw_decode(text, i)
            i = skip(i)
            if i >= len(text) or text[i] != ":":
                return None
            i = skip(i + 1)
            _, end = decoder.raw_decode(text, i)
            members.append((name, text[i:end]))
            i = skip(end)
            if i < len(text) and text[i] == ",":
                i = skip(i + 1)
                continue
            if i < len(text) and text[i] == "}":
                return members if skip(i + 1) == len(text) else None
            return None
    except ValueError:
        return None


def trigger_fires(t: dict, record: dict) -> bool:
    """README § 21, Matching: whether a record fires trigger t (expiry aside)."""
    m = t.get("match")
    if m is None:
        return False
    if t.get("uid") and record["uid"] != t["uid"]:
        return False
    if t.get("app") and record["app"] != t["app"]:
        return False
    bounded = t.get("min_app_version") or t.get("max_app_version")
    if bounded and record["app_version"] == "":
        return False
    if t.get("min_app_version") and version_order(record["app_version"], t["min_app_version"]) < 0:
        return False
    if t.get("max_app_version") and version_order(record["app_version"], t["max_app_version"]) > 0:
        return False
    if m.get("levels") and record["level"] not in m["levels"]:
        return False
    if m.get("types") and record["type"] not in m["types"]:
        return False
    if m.get("text") and not text_matches(m["text"], record["message"], record["metadata"]):
        return False
    if "metadata_key" in m:
        members = metadata_members(record["metadata"]) if record["metadata"] is not None else None
        if not members:
            return False
        values = [raw for name, raw in members if name == m["metadata_key"]]
        if not values:
            return False
        if "metadata_value" in m:
            wanted = m["metadata_value"]
            # A string is compared as itself, escapes undone; any other value as it is written.
            def holds(raw):
                return json.loads(raw) == wanted if raw.startswith('"') else raw == wanted
            if not any(holds(raw) for raw in values):
                return False
    return True


def key_announcement_signing_input(a: dict) -> bytes:
    w = Canonical("dredge.v1.key-announcement")
    w.u32(a["generation"])
    w.bytes(a["signing_key"] if isinstance(a["signing_key"], bytes) else bytes.fromhex(a["signing_key"]))
    w.bytes(a["encryption_key"] if isinstance(a["encryption_key"], bytes) else bytes.fromhex(a["encryption_key"]))
    w.i64(a["issued_at_us"])
    w.i64(a["previous_retires_at_us"])
    return bytes(w.out)


def tail_command_signing_input(c: dict) -> bytes:
    """README § 20: what the server signs in a TailCommand."""
    by_bytes = lambda t: t.encode("utf-8")
    w = Canonical("dredge.v1.tail-command")
    w.string(c["tail_id"])
    w.string(c.get("target_uid", ""))
    w.string(c.get("target_agent_id", ""))
    w.optional(c.get("uid"), w.string)
    w.list(sorted(c.get("types", []), key=by_bytes), w.string)
    w.list(sorted(c.get("levels", [])), w.u32)
    w.optional(c.get("text"), w.string)
    w.i64(c["issued_at_us"])
    w.i64(c["expires_at_us"])
    w.u32(c["max_records_per_s"])
    w.u64(c["max_bytes_per_s"])
    w.boolean(c.get("verbose", False))
    w.list(sorted(c.get("verbose_types", []), key=by_bytes), w.string)
    w.bytes(bytes.fromhex(c.get("wrapped_key", "")))
    if c.get("urgent"):  # § 22: only when set
        w.boolean(True)
    return bytes(w.out)


def tail_batch_associated_data(tail_id: str, agent_id: str, seq: int, dropped: int, cursor: int) -> bytes:
    """README § 20: what a tail batch's seal authenticates beside its plaintext."""
    w = Canonical("dredge.v1.tail-batch")
    w.string(tail_id)
    w.string(agent_id)
    w.u64(seq)
    w.u64(dropped)
    w.u64(cursor)
    return bytes(w.out)


def open_tail_batch(key: bytes, nonce: bytes, tail_id: str, agent_id: str, seq: int, dropped: int, cursor: int, ciphertext: bytes) -> bytes:
    return AESGCM(key).decrypt(nonce, ciphertext, tail_batch_associated_data(tail_id, agent_id, seq, dropped, cursor))


def auth_signing_input(challenge: bytes, agent_id: str) -> bytes:
    w = Canonical("dredge.v1.auth")
    w.bytes(challenge)
    w.string(agent_id)
    return bytes(w.out)


def agent_id(spki_der: bytes) -> str:
    return hashlib.sha256(spki_der).digest()[:16].hex()


# --- Envelope (README § Envelope) -----------------------------------------------------------


def chunk_nonce(prefix: bytes, index: int, count: int) -> bytes:
    return prefix + struct.pack(">I", index) + (b"\x01" if index + 1 == count else b"\x00")


def open_upload(key: bytes, header: dict, chunks: list) -> bytes:
    """Decrypts and reassembles an upload; raises on any failure."""
    if len(chunks) != header["chunk_count"]:
        raise ValueError("wrong chunk count")
    aad = hashlib.sha256(upload_header_canonical(header)).digest()
    prefix = bytes.fromhex(header["nonce_prefix"])
    aes = AESGCM(key)
    out = bytearray()
    for i, sealed in enumerate(chunks):
        out += aes.decrypt(chunk_nonce(prefix, i, len(chunks)), sealed, aad)
    if len(out) != header["plaintext_size"]:
        raise ValueError("plaintext size differs from the header")
    return bytes(out)


# --- Payload (README § Payload) -------------------------------------------------------------


def read_payload(zip_bytes: bytes) -> tuple:
    """Opens the zip with the standard library and checks it against its manifest."""
    z = zipfile.ZipFile(io.BytesIO(zip_bytes))
    if z.testzip() is not None:
        raise ValueError("CRC error")
    names = z.namelist()
    if names[-1] != "manifest.json":
        raise ValueError("manifest.json is not the last entry")
    manifest = json.loads(z.read("manifest.json"))
    files = {}
    for day in manifest["days"]:
        text = z.read(day["file"]).decode("utf-8")
        lines = text.split("\n")[:-1]
        if len(lines) != day["records"] or len(text.encode("utf-8")) != day["bytes"]:
            raise ValueError(day["file"] + " disagrees with the manifest")
        for line in lines:
            record = json.loads(line)
            missing = {"ts", "level", "type", "uid", "message", "metadata"} - set(record)
            if missing:
                raise ValueError("record without " + ",".join(sorted(missing)))
        files[day["file"]] = text
    if sorted(files) + ["manifest.json"] != sorted(names[:-1]) + ["manifest.json"]:
        raise ValueError("entries differ from the manifest")
    if manifest["record_count"] != sum(d["records"] for d in manifest["days"]):
        raise ValueError("record_count does not add up")
    return manifest, files


# --- Protobuf, just enough to see a frame's body field ---------------------------------------


def varint(data: bytes, i: int) -> tuple:
    value, shift = 0, 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def frame_body_field(frame: bytes) -> int:
    (length,) = struct.unpack(">I", frame[:4])
    body = frame[4:]
    if length != len(body):
        raise ValueError("length prefix does not match")
    key, i = varint(body, 0)
    field, wire_type = key >> 3, key & 7
    if wire_type != 2:
        raise ValueError("body is not length-delimited")
    size, i = varint(body, i)
    if i + size != len(body):
        raise ValueError("trailing bytes after the body")
    return field


def goodbye(frame: bytes) -> tuple:
    """(reason, back_within_ms, retry_every_ms) of a Goodbye frame (README § 6); 0 for a field left out."""
    body = frame[4:]
    key, i = varint(body, 0)
    if key >> 3 != 21:
        raise ValueError("not a Goodbye")
    size, i = varint(body, i)
    message = body[i:i + size]
    fields, j = {1: b"", 2: 0, 3: 0}, 0
    while j < len(message):
        key, j = varint(message, j)
        if key & 7 == 2:
            length, j = varint(message, j)
            value, j = message[j:j + length], j + length
        elif key & 7 == 0:
            value, j = varint(message, j)
        else:
            raise ValueError(f"wire type {key & 7}")
        fields[key >> 3] = value  # unknown fields are ignored (§3)
    return fields[1].decode(), fields[2], fields[3]


# --- The exporter's zip (README § Payload, informative) ---------------------------------------


def dos_time_date(rfc3339: str) -> tuple:
    """DOS time and date of a `created_at`: UTC, seconds rounded down to even, years 1980 to 2107."""
    year, month, day = int(rfc3339[0:4]), int(rfc3339[5:7]), int(rfc3339[8:10])
    hour, minute, second = int(rfc3339[11:13]), int(rfc3339[14:16]), int(rfc3339[17:19])
    year = min(max(year, 1980), 2107)
    return (hour << 11) | (minute << 5) | (second // 2), ((year - 1980) << 9) | (month << 5) | day


def deflate_in_blocks(data: bytes, block: int = 512 * 1024) -> bytes:
    """Each 512 KiB piece a fresh raw deflate stream (level 6, window bits -15, memory level 8),
    primed with the preceding 32 KiB of the entry; sync flush, the last piece finished."""
    out = bytearray()
    pieces = [data[i:i + block] for i in range(0, len(data), block)] or [b""]
    if len(data) and len(data) % block == 0:
        pieces.append(b"")
    start = 0
    for n, piece in enumerate(pieces):
        dictionary = data[max(0, start - 32 * 1024):start]
        if dictionary:
            c = zlib.compressobj(6, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY, zdict=dictionary)
        else:
            c = zlib.compressobj(6, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY)
        out += c.compress(piece)
        out += c.flush(zlib.Z_FINISH if n == len(pieces) - 1 else zlib.Z_SYNC_FLUSH)
        start += len(piece)
    return bytes(out)


def exporter_zip(entries: list, created_at: str) -> bytes:
    """The zip the Swift exporter writes for `entries` ([(name, bytes)] in order)."""
    time, date = dos_time_date(created_at)
    out, central = bytearray(), bytearray()
    for name, data in entries:
        raw = name.encode("utf-8")
        packed = deflate_in_blocks(data)
        crc = zlib.crc32(data) & 0xFFFFFFFF
        offset = len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0x0800, 8, time, date, crc, len(packed), len(data), len(raw), 0) + raw + packed
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0x0314, 20, 0x0800, 8, time, date, crc, len(packed), len(data),
                               len(raw), 0, 0, 0, 0, 0x81A40000, offset) + raw
    directory_offset = len(out)
    out += central
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(central), directory_offset, 0)
    return bytes(out)


def zip_entries(zip_bytes: bytes) -> list:
    z = zipfile.ZipFile(io.BytesIO(zip_bytes))
    return [(name, z.read(name)) for name in z.namelist()]


# --- The text filter (README § Pull commands, Text) -------------------------------------------

_ASCII_FOLD = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def text_matches(text: str, message: str, metadata) -> bool:
    """`text` in the message or the serialized metadata, ASCII letters without regard to case."""
    if text == "":
        return True
    needle = text.translate(_ASCII_FOLD)
    return needle in message.translate(_ASCII_FOLD) or (metadata is not None and needle in metadata.translate(_ASCII_FOLD))


def serialized_metadata(value: dict) -> str:
    """Metadata as a record line writes it: keys sorted, no whitespace, non-ASCII as UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
