import DredgeAdminAPI
import DredgeDomain
import DredgeJSON

/// One line of a day file (Protocol § Payload) read for the index, without building a JSON
/// tree: a single pass of ``JSONScanner`` that checks the whole line is one JSON object (its
/// grammar, nesting up to ``maxDepth``) and picks out the members the index keeps. Strings without escapes are handed out as ranges of the line, so
/// most values are bound to SQLite straight from the block they were read into.
///
/// A line is a record when it is an object whose `ts` is a string of the payload's form
/// (`YYYY-MM-DDTHH:MM:SS.ffffffZ`, a time that exists), whose `level` is one of the seven
/// names, and whose `type` is a log type name (§ 5: 1 to 64 bytes of `a-z0-9._-`). `uid` and `message` default to `""`,
/// `metadata` (an object; anything else is taken as none) to `{}`, `context` to none. Members
/// it does not know are checked and ignored; of a member given twice, the first counts.
struct RecordLine {
    static let maxDepth = 64

    /// A string value: its bytes in the line (between the quotes), and whether it holds escapes
    /// (then ``decode(_:in:)`` gives its text).
    typealias Text = JSONText

    var ts: Int64 = 0
    var level: Int = 0
    var type = Text(range: 0..<0, escaped: false)
    var uid: Text?
    var message: Text?
    /// The object's bytes, braces included, as written.
    var metadata: Range<Int>?
    var context: Int64?

    /// Nil when the line is not a record.
    static func parse(_ line: UnsafeBufferPointer<UInt8>) -> RecordLine? {
        var json = JSONScanner(line)
        return record(&json)
    }

    /// Each non-empty line of a block (lines end in `\n`) with its offset in the block, parsed:
    /// nil for a line that is not a record. What both indexes read a block with.
    static func each(
        in block: UnsafeBufferPointer<UInt8>, _ body: (_ record: RecordLine?, _ line: UnsafeBufferPointer<UInt8>, _ offset: Int) throws -> Void
    ) rethrows {
        var start = 0
        while start < block.count {
            var end = start
            while end < block.count && block[end] != 0x0A { end += 1 }
            defer { start = end + 1 }
            guard end > start else { continue }
            let line = UnsafeBufferPointer(rebasing: block[start..<end])
            try body(parse(line), line, start)
        }
    }

    /// Whether the record's uid (`""` when it has none) is `expected`, its escapes resolved.
    func holds(uid expected: [UInt8], in line: UnsafeBufferPointer<UInt8>) -> Bool {
        guard let uid else { return expected.isEmpty }
        return uid.escaped ? Self.decode(uid, in: line) == expected : line[uid.range].elementsEqual(expected)
    }

    /// The text of a string value, its escapes resolved.
    static func decode(_ text: Text, in line: UnsafeBufferPointer<UInt8>) -> [UInt8] {
        JSONString.unescape(line, text.range)
    }

    static func levelNumber(_ name: UnsafeBufferPointer<UInt8>.SubSequence) -> Int? {
        switch name.count {
        case 4: return name.elementsEqual("info".utf8) ? 2 : nil
        case 5: return name.elementsEqual("trace".utf8) ? 0 : name.elementsEqual("debug".utf8) ? 1 : name.elementsEqual("error".utf8) ? 5 : nil
        case 6: return name.elementsEqual("notice".utf8) ? 3 : nil
        case 7: return name.elementsEqual("warning".utf8) ? 4 : nil
        case 8: return name.elementsEqual("critical".utf8) ? 6 : nil
        default: return nil
        }
    }

    /// Whether a string value is a log type name (Protocol § 5), its escapes resolved (a
    /// reader does not depend on escaping, § 13).
    static func isTypeName(_ text: Text, in line: UnsafeBufferPointer<UInt8>) -> Bool {
        text.escaped ? LogType.isName(decode(text, in: line)) : LogType.isName(line[text.range])
    }

    /// `YYYY-MM-DDTHH:MM:SS.ffffffZ` → µs, only for a time that exists.
    static func timestamp(_ b: UnsafeBufferPointer<UInt8>.SubSequence) -> Int64? {
        guard b.count == 27 else { return nil }
        let s = b.startIndex
        func d(_ at: Int, _ n: Int) -> Int? {
            var v = 0
            for k in 0..<n {
                let c = b[s + at + k]
                guard c >= 48, c <= 57 else { return nil }
                v = v * 10 + Int(c - 48)
            }
            return v
        }
        guard b[s + 4] == 45, b[s + 7] == 45, b[s + 10] == 84, b[s + 13] == 58, b[s + 16] == 58, b[s + 19] == 46, b[s + 26] == 90,
            let year = d(0, 4), let month = d(5, 2), let day = d(8, 2), let hour = d(11, 2), let minute = d(14, 2), let second = d(17, 2), let micros = d(20, 6),
            (1...12).contains(month), day >= 1, day <= daysIn(month, year), hour < 24, minute < 60, second < 60
        else { return nil }
        // Days since the epoch (H. Hinnant's days_from_civil).
        let y = Int64(month <= 2 ? year - 1 : year)
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = Int64(month > 2 ? month - 3 : month + 9)
        let doy = (153 * mp + 2) / 5 + Int64(day) - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        let days = era * 146_097 + doe - 719_468
        return ((days * 86_400 + Int64(hour * 3600 + minute * 60 + second)) * 1_000_000) + Int64(micros)
    }

    private static func daysIn(_ month: Int, _ year: Int) -> Int {
        switch month {
        case 2: return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }

    /// The single pass: the line's members, the ones the index keeps read as they go by, every
    /// other value checked and skipped.
    private static func record(_ json: inout JSONScanner) -> RecordLine? {
        json.space()
        guard json.at(UInt8(ascii: "{")) else { return nil }
        var line = RecordLine()
        var seen: UInt8 = 0  // bits: ts, level, type, uid, message, metadata, context
        var ok: UInt8 = 0
        let limit = RecordLine.maxDepth + 1  // members at depth 1 up to maxDepth
        let whole = json.members { json, key in
            let bytes = json.bytes
            let start = json.i
            let keyBytes = bytes[key.range]
            let member: Int? =
                key.escaped ? nil
                : keyBytes.elementsEqual("ts".utf8) ? 0 : keyBytes.elementsEqual("level".utf8) ? 1 : keyBytes.elementsEqual("type".utf8) ? 2
                : keyBytes.elementsEqual("uid".utf8) ? 3 : keyBytes.elementsEqual("message".utf8) ? 4 : keyBytes.elementsEqual("metadata".utf8) ? 5
                : keyBytes.elementsEqual("context".utf8) ? 6 : nil
            guard let member, seen & (1 << member) == 0 else { return json.skip(depth: 1, limit: limit) }
            seen |= 1 << member
            switch member {
            case 0...4:
                guard json.at(UInt8(ascii: "\"")) else { return json.skip(depth: 1, limit: limit) }
                guard let text = json.string() else { return false }
                switch member {
                case 0: if !text.escaped, let t = RecordLine.timestamp(bytes[text.range]) { line.ts = t; ok |= 1 }
                case 1: if !text.escaped, let l = RecordLine.levelNumber(bytes[text.range]) { line.level = l; ok |= 2 }
                case 2: if RecordLine.isTypeName(text, in: bytes) { line.type = text; ok |= 4 }
                case 3: line.uid = text
                default: line.message = text
                }
                return true
            case 5:
                guard json.skip(depth: 1, limit: limit) else { return false }
                if bytes[start] == UInt8(ascii: "{") { line.metadata = start..<json.i }
                return true
            default:
                guard json.skip(depth: 1, limit: limit) else { return false }
                line.context = integer(bytes[start..<json.i])
                return true
            }
        }
        guard whole, json.atEnd(), ok == 7 else { return nil }
        return line
    }

    /// An integer written as one (no fraction or exponent) that fits in 64 bits.
    private static func integer(_ digits: Slice<UnsafeBufferPointer<UInt8>>) -> Int64? {
        guard !digits.isEmpty, digits.count <= 20 else { return nil }
        var value: Int64 = 0
        var negative = false
        for (k, c) in digits.enumerated() {
            if k == 0 && c == UInt8(ascii: "-") {
                negative = true
                continue
            }
            guard c >= 48, c <= 57 else { return nil }
            let (m, o1) = value.multipliedReportingOverflow(by: 10)
            let (a, o2) = m.addingReportingOverflow(Int64(c - 48))
            guard !o1, !o2 else { return nil }
            value = a
        }
        return negative ? -value : value
    }
}

/// Which lines of a day file a source keeps (Protocol § 13, what a receiver makes of each
/// line): a readable record, inside the UTC day its file is named for, of the uid the pull or
/// feedback asked for. Both indexes ask it of every line.
public struct LineAdmission: Sendable, Equatable {
    /// Only records of this uid; nil: any uid.
    public var uid: String?
    /// Only records whose `ts` lies in this range of µs; nil: any time.
    public var day: Range<Int64>?

    /// Every readable record.
    public static let any = LineAdmission()

    public init(uid: String? = nil, day: Range<Int64>? = nil) {
        self.uid = uid
        self.day = day
    }

    /// The records of the day file `name` (`2026-11-20.jsonl`), of `uid` when it is set; nil for
    /// a name that is not a day file's.
    public init?(file name: String, uid: String?) {
        let stem = Array(name.utf8.prefix(10))
        guard name.utf8.count == 16, name.hasSuffix(".jsonl") else { return nil }
        let midnight = stem + Array("T00:00:00.000000Z".utf8)
        guard let start = midnight.withUnsafeBufferPointer({ RecordLine.timestamp($0[...]) }) else { return nil }
        self.init(uid: uid, day: start..<(start + 86_400_000_000))
    }

    /// The record of one parsed line (nil: not a record) if it is kept; else nil, and the line
    /// counted in `count` as unreadable or foreign.
    func admit(_ record: RecordLine?, in line: UnsafeBufferPointer<UInt8>, uidBytes: [UInt8]?, count: inout IndexCount) -> RecordLine? {
        guard let record else {
            count.unreadable += 1
            return nil
        }
        // The uid first: a planted record is counted (and logged) as one, whatever its time.
        if let uidBytes, !record.holds(uid: uidBytes, in: line) {
            count.foreign += 1
            return nil
        }
        if let day, !day.contains(record.ts) {
            count.unreadable += 1
            return nil
        }
        return record
    }
}

/// The indexer's line reading, for the benchmark (`dredge-bench json`).
package enum IndexedLines {
    /// How many lines of `block` (lines end in `\n`) read as records.
    package static func count(in block: [UInt8]) -> Int {
        var records = 0
        block.withUnsafeBufferPointer { bytes in
            RecordLine.each(in: bytes) { record, _, _ in if record != nil { records += 1 } }
        }
        return records
    }
}
