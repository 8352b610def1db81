/// Applies ``StoreLimits`` to an entry and encodes its metadata, on the writer thread.
///
/// Truncation is marked so a reader knows it happened: a message ends with
/// `…[truncated N bytes]`, a metadata string value likewise, and metadata cut as a whole gets
/// the key `dredge.truncated` set to the number of keys left out.
struct EntryEncoder {
    let limits: StoreLimits
    private var json = JSONWriter(reservingCapacity: 1024)

    init(limits: StoreLimits) { self.limits = limits }

    static func truncate(_ s: String, maxBytes: Int, marked: Bool = true) -> String {
        let count = s.utf8.count
        guard count > maxBytes else { return s }
        let marker = marked ? "…[truncated \(count - maxBytes) bytes]" : ""
        var keep = max(0, maxBytes - marker.utf8.count)
        let bytes = Array(s.utf8)
        // Back up to the start of a UTF-8 sequence so no character is split.
        while keep > 0 && keep < bytes.count && (bytes[keep] & 0xC0) == 0x80 { keep -= 1 }
        return String(decoding: bytes[..<keep], as: UTF8.self) + marker
    }

    func message(_ entry: LogEntry) -> String {
        Self.truncate(entry.message, maxBytes: limits.maxMessageBytes)
    }

    func uid(_ entry: LogEntry) -> String {
        Self.truncate(entry.uid, maxBytes: limits.maxUIDBytes, marked: false)
    }

    /// Encodes the metadata into an internal buffer and calls `body` with its bytes, or with nil
    /// when there is no metadata.
    mutating func withMetadata<R>(_ metadata: LogMetadata, _ body: (UnsafeBufferPointer<UInt8>?) throws -> R) rethrows -> R {
        if metadata.isEmpty { return try body(nil) }
        json.reset()
        json.writeObject(clamped(metadata))
        if json.bytes.count > limits.maxMetadataBytes {
            json.reset()
            json.writeObject(cutToBudget(metadata))
        }
        return try json.bytes.withUnsafeBufferPointer { try body($0) }
    }

    private func clamped(_ metadata: LogMetadata) -> LogMetadata {
        var needsClamp = false
        for value in metadata.values where !fits(value) { needsClamp = true; break }
        guard needsClamp else { return metadata }
        return metadata.mapValues(clamp)
    }

    private func fits(_ value: LogValue) -> Bool {
        switch value {
        case .string(let s): return s.utf8.count <= limits.maxMetadataValueBytes
        case .array(let a): return a.allSatisfy(fits)
        case .object(let o): return o.values.allSatisfy(fits)
        default: return true
        }
    }

    private func clamp(_ value: LogValue) -> LogValue {
        switch value {
        case .string(let s): return .string(Self.truncate(s, maxBytes: limits.maxMetadataValueBytes))
        case .array(let a): return .array(a.map(clamp))
        case .object(let o): return .object(o.mapValues(clamp))
        default: return value
        }
    }

    /// Keeps keys in sorted order while they fit in the budget; the rest are left out and counted.
    private func cutToBudget(_ metadata: LogMetadata) -> LogMetadata {
        let budget = limits.maxMetadataBytes - 64
        var kept: LogMetadata = [:]
        var used = 2
        var omitted = 0
        var w = JSONWriter()
        for key in metadata.keys.sorted() {
            let value = clamp(metadata[key]!)
            w.reset()
            w.writeString(key)
            w.write(value)
            let size = w.bytes.count + 2
            if used + size <= budget {
                kept[key] = value
                used += size
            } else {
                omitted += 1
            }
        }
        kept["dredge.truncated"] = .int(Int64(omitted))
        return kept
    }
}
