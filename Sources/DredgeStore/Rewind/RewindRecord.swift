import DredgeDomain

/// One record of a ``RewindBuffer``: what a log call below the stored level would have stored.
/// Its metadata is kept as JSON text (a log call writes its members unsorted; the store writes
/// them canonically when the record is frozen), encoded on the caller's thread as the ring
/// takes bytes only.
///
/// Payload: timestamp (i64 µs), level (u8), then type, uid, message and metadata JSON, each a
/// u32 length and its UTF-8.
public struct RewindRecord: Sendable, Hashable {
    public var timestamp: Timestamp
    public var level: LogLevel
    public var type: LogType
    public var uid: String
    public var message: String
    /// `{}` when there is none.
    public var metadataJSON: String

    public init(timestamp: Timestamp, level: LogLevel, type: LogType, uid: String, message: String, metadataJSON: String = "{}") {
        self.timestamp = timestamp
        self.level = level
        self.type = type
        self.uid = uid
        self.message = message
        self.metadataJSON = metadataJSON
    }

    /// An entry's record: its metadata written as the store writes it.
    public init(_ entry: LogEntry) {
        var json = JSONWriter(reservingCapacity: 64)
        if entry.metadata.isEmpty { json.writeRaw("{}") } else { json.writeObject(entry.metadata) }
        self.init(
            timestamp: entry.timestamp, level: entry.level, type: entry.type, uid: entry.uid, message: entry.message,
            metadataJSON: String(decoding: json.bytes, as: UTF8.self))
    }

    struct Encoder {
        var bytes: [UInt8] = []

        mutating func integer<T: FixedWidthInteger>(_ value: T) {
            withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) }
        }

        mutating func text(_ value: String) {
            var value = value
            value.withUTF8 { utf8 in
                integer(UInt32(utf8.count))
                bytes.append(contentsOf: utf8)
            }
        }
    }

    func encode(into encoder: inout Encoder) {
        encoder.bytes.reserveCapacity(25 + type.rawValue.utf8.count + uid.utf8.count + message.utf8.count + metadataJSON.utf8.count)
        encoder.integer(timestamp.microseconds)
        encoder.integer(UInt8(level.rawValue))
        encoder.text(type.rawValue)
        encoder.text(uid)
        encoder.text(message)
        encoder.text(metadataJSON)
    }

    /// Reads a payload back; nil when it is not one.
    init?(decoding payload: [UInt8]) {
        var at = 0
        func integer<T: FixedWidthInteger>(_: T.Type) -> T? {
            guard at + MemoryLayout<T>.size <= payload.count else { return nil }
            var value: T = 0
            for i in 0..<MemoryLayout<T>.size { value |= T(payload[at + i]) << (8 * i) }
            at += MemoryLayout<T>.size
            return value
        }
        func text() -> String? {
            guard let count = integer(UInt32.self), at + Int(count) <= payload.count else { return nil }
            defer { at += Int(count) }
            return String(validating: payload[at..<(at + Int(count))], as: UTF8.self)
        }
        guard let micros = integer(Int64.self), let rawLevel = integer(UInt8.self), let level = LogLevel(rawValue: Int(rawLevel)),
            let typeName = text(), let type = LogType(typeName), let uid = text(), let message = text(), let metadata = text(), at == payload.count
        else { return nil }
        self.init(timestamp: Timestamp(microseconds: micros), level: level, type: type, uid: uid, message: message, metadataJSON: metadata)
    }
}
