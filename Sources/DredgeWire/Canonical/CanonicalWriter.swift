/// The canonical byte encoding signatures and associated data are computed over
/// (README § Canonical encoding). Protobuf encodings are not canonical across implementations,
/// so what is signed is this: a domain tag, then fixed fields in a fixed order.
///
/// - domain tag: ASCII, then one 0x00 byte
/// - string, bytes: u32 big-endian length, then the UTF-8 / raw bytes
/// - u32, u64, i64: fixed width, big-endian (i64 two's complement)
/// - bool: one byte, 0x00 or 0x01
/// - optional: 0x00 when absent, or 0x01 then the value
/// - list: u32 big-endian count, then each element
public struct CanonicalWriter {
    public private(set) var bytes: [UInt8] = []

    public init(domain: String) {
        bytes.append(contentsOf: domain.utf8)
        bytes.append(0)
    }

    public mutating func string(_ s: String) { self.bytes(Array(s.utf8)) }

    public mutating func bytes(_ b: [UInt8]) {
        u32(UInt32(b.count))
        bytes.append(contentsOf: b)
    }

    public mutating func u32(_ v: UInt32) { withUnsafeBytes(of: v.bigEndian) { bytes.append(contentsOf: $0) } }
    public mutating func u64(_ v: UInt64) { withUnsafeBytes(of: v.bigEndian) { bytes.append(contentsOf: $0) } }
    public mutating func i64(_ v: Int64) { u64(UInt64(bitPattern: v)) }
    public mutating func bool(_ v: Bool) { bytes.append(v ? 1 : 0) }

    public mutating func optional<T>(_ value: T?, _ write: (inout CanonicalWriter, T) -> Void) {
        if let value {
            bytes.append(1)
            write(&self, value)
        } else {
            bytes.append(0)
        }
    }

    public mutating func list<T>(_ values: [T], _ write: (inout CanonicalWriter, T) -> Void) {
        u32(UInt32(values.count))
        for value in values { write(&self, value) }
    }
}

/// The signing inputs of the protocol.
public enum SigningInput {
    /// What the server signs in a `PullCommand` (README § Pull commands): every field but the
    /// signature. Types are sorted by their UTF-8 bytes and levels ascending, so the order they
    /// are listed in does not matter.
    public static func pullCommand(_ c: WirePullCommand) -> [UInt8] {
        var w = CanonicalWriter(domain: "dredge.v1.pull-command")
        w.string(c.commandID)
        w.string(c.target.uid)
        w.string(c.target.agentID)
        let f = c.filter
        w.optional(f.hasSinceUs ? f.sinceUs : nil) { $0.i64($1) }
        w.optional(f.hasUntilUs ? f.untilUs : nil) { $0.i64($1) }
        w.optional(f.hasUid ? f.uid : nil) { $0.string($1) }
        w.list(byBytes(f.types)) { $0.string($1) }
        w.list(f.levels.map { UInt32(truncatingIfNeeded: $0.rawValue) }.sorted()) { $0.u32($1) }
        w.optional(f.hasText ? f.text : nil) { $0.string($1) }
        w.i64(c.issuedAtUs)
        w.i64(c.expiresAtUs)
        w.bytes(Array(c.wrappedKey))
        // Only when set (capability `urgent`, § 22): a command that is not urgent signs as before.
        if c.urgent { w.bool(true) }
        return w.bytes
    }

    /// Names in the order the signing inputs list them: by their UTF-8 bytes.
    static func byBytes(_ names: [String]) -> [String] { names.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) } }

    /// What the server signs in a `TailCommand` (README § 20, Live tail): every field but the
    /// signature; types, verbose types and levels sorted as in a pull command's.
    public static func tailCommand(_ c: WireTailCommand) -> [UInt8] {
        var w = CanonicalWriter(domain: "dredge.v1.tail-command")
        w.string(c.tailID)
        w.string(c.target.uid)
        w.string(c.target.agentID)
        let f = c.filter
        w.optional(f.hasUid ? f.uid : nil) { $0.string($1) }
        w.list(byBytes(f.types)) { $0.string($1) }
        w.list(f.levels.map { UInt32(truncatingIfNeeded: $0.rawValue) }.sorted()) { $0.u32($1) }
        w.optional(f.hasText ? f.text : nil) { $0.string($1) }
        w.i64(c.issuedAtUs)
        w.i64(c.expiresAtUs)
        w.u32(c.maxRecordsPerS)
        w.u64(c.maxBytesPerS)
        w.bool(c.verbose)
        w.list(byBytes(c.verboseTypes)) { $0.string($1) }
        w.bytes(Array(c.wrappedKey))
        if c.urgent { w.bool(true) }  // only when set (§ 22)
        return w.bytes
    }

    /// The associated data of a tail batch (README § 20): which tail, which agent, where in
    /// the stream, how many records were left out before it, and where in the store it ends.
    public static func tailBatch(tailID: String, agentID: String, seq: UInt64, dropped: UInt64, cursor: UInt64) -> [UInt8] {
        var w = CanonicalWriter(domain: "dredge.v1.tail-batch")
        w.string(tailID)
        w.string(agentID)
        w.u64(seq)
        w.u64(dropped)
        w.u64(cursor)
        return w.bytes
    }

    /// The upload header as bound into every chunk (README § Envelope); the associated data is
    /// SHA-256 of these bytes.
    public static func uploadHeader(_ h: WireUploadHeader) -> [UInt8] {
        var w = CanonicalWriter(domain: "dredge.v1.upload-header")
        w.string(h.uploadID)
        w.u32(UInt32(h.kind.rawValue))
        w.string(h.agentID)
        w.bytes(Array(h.noncePrefix))
        w.u32(h.chunkSize)
        w.u64(h.plaintextSize)
        w.u32(h.chunkCount)
        w.bytes(Array(h.wrappedKey))
        w.optional(h.hasFeedback ? h.feedback : nil) { w, f in
            w.string(f.feedbackID)
            w.string(f.uid)
            w.string(f.text)
            w.i64(f.createdAtUs)
        }
        w.bool(h.empty)
        w.i64(h.createdAtUs)
        // A capture's header goes on (README § 21); every other kind ends here, as it always has.
        if h.kind == .capture {
            w.optional(h.hasCapture ? h.capture : nil) { w, c in
                w.string(c.triggerID)
                w.u64(c.setVersion)
                w.string(c.uid)
                w.i64(c.sinceUs)
                w.i64(c.untilUs)
                w.i64(c.matchedAtUs)
                w.bool(c.crash)
            }
        }
        return w.bytes
    }

    /// What the server signs in a `TriggerSet` (README § 21): every field but the signature,
    /// the triggers in the order listed, each trigger's levels ascending and types by bytes.
    public static func triggerSet(_ s: WireTriggerSet) -> [UInt8] {
        var w = CanonicalWriter(domain: "dredge.v1.trigger-set")
        w.string(s.agentID)
        w.u64(s.version)
        w.i64(s.issuedAtUs)
        w.list(s.triggers) { w, t in
            w.string(t.triggerID)
            w.string(t.name)
            w.optional(t.hasMatch ? t.match : nil) { w, m in
                w.list(m.levels.map { UInt32(truncatingIfNeeded: $0.rawValue) }.sorted()) { $0.u32($1) }
                w.list(byBytes(m.types)) { $0.string($1) }
                w.optional(m.hasText ? m.text : nil) { $0.string($1) }
                w.optional(m.hasMetadataKey ? m.metadataKey : nil) { $0.string($1) }
                w.optional(m.hasMetadataValue ? m.metadataValue : nil) { $0.string($1) }
            }
            w.bool(t.crash)
            w.string(t.uid)
            w.string(t.app)
            w.string(t.minAppVersion)
            w.string(t.maxAppVersion)
            w.u32(t.beforeS)
            w.u32(t.afterS)
            w.u32(t.maxPerDeviceDay)
            w.i64(t.expiresAtUs)
        }
        return w.bytes
    }

    /// What the previous generation's signing key signs in a `KeyAnnouncement` (README § Key
    /// rotation): every field but the signature.
    public static func keyAnnouncement(_ a: WireKeyAnnouncement) -> [UInt8] {
        var w = CanonicalWriter(domain: "dredge.v1.key-announcement")
        w.u32(a.generation)
        w.bytes(Array(a.signingKey))
        w.bytes(Array(a.encryptionKey))
        w.i64(a.issuedAtUs)
        w.i64(a.previousRetiresAtUs)
        return w.bytes
    }

    /// What an agent signs to authenticate (README § Authentication).
    public static func auth(challenge: [UInt8], agentID: String) -> [UInt8] {
        var w = CanonicalWriter(domain: "dredge.v1.auth")
        w.bytes(challenge)
        w.string(agentID)
        return w.bytes
    }
}
