import DredgeDomain
import DredgeJSON

/// One record as a trigger sees it (README § 21, Matching): borrowed views of what the store
/// holds, so matching a record against many triggers copies nothing.
public struct MatchableRecord {
    public var level: LogLevel
    public var type: String
    public var uid: String
    public var message: String
    /// The record's metadata in its serialized form (§ 13); nil when it has none.
    public var metadata: String?
    /// Of the record's context.
    public var app: String
    public var appVersion: String

    public init(level: LogLevel, type: String, uid: String, message: String, metadata: String?, app: String, appVersion: String) {
        self.level = level
        self.type = type
        self.uid = uid
        self.message = message
        self.metadata = metadata
        self.app = app
        self.appVersion = appVersion
    }
}

extension TriggerRule {
    /// Whether `record` fires this trigger (README § 21, Matching). Expiry is the caller's:
    /// it knows the clock.
    public func fires(on record: MatchableRecord) -> Bool {
        guard let match, inScope(uid: record.uid, app: record.app, appVersion: record.appVersion) else { return false }
        if let levels = match.levels, !levels.contains(record.level) { return false }
        if let types = match.types, !types.contains(where: { $0.rawValue == record.type }) { return false }
        if let text = match.text {
            let inMessage = TextRule.contains(record.message, text)
            guard inMessage || record.metadata.map({ TextRule.contains($0, text) }) == true else { return false }
        }
        if let key = match.metadataKey {
            guard let metadata = record.metadata, MetadataMember.holds(metadata, key: key, value: match.metadataValue) else { return false }
        }
        return true
    }

    /// Whether a run's unclean end fires this trigger: a crash trigger, the run's user (its
    /// last record's) and app in scope.
    public func fires(onCrashOf uid: String, app: String, appVersion: String) -> Bool {
        crash && inScope(uid: uid, app: app, appVersion: appVersion)
    }

    func inScope(uid recordUID: String, app recordApp: String, appVersion: String) -> Bool {
        if let uid, uid != recordUID { return false }
        if let app, app != recordApp { return false }
        // A context that names no version is within no bound.
        if (minAppVersion != nil || maxAppVersion != nil) && appVersion.isEmpty { return false }
        if let minAppVersion, AppVersionOrder.compare(appVersion, minAppVersion) < 0 { return false }
        if let maxAppVersion, AppVersionOrder.compare(appVersion, maxAppVersion) > 0 { return false }
        return true
    }
}

/// The § 10 text rule: `needle` occurs in `haystack`, the ASCII letters compared without
/// regard to case and every other byte exactly (in UTF-8 no byte of a multi-byte character is
/// ASCII, so this is the rule code point by code point). The empty text occurs everywhere.
public enum TextRule {
    public static func contains(_ haystack: String, _ needle: String) -> Bool {
        var haystack = haystack
        var needle = needle
        return haystack.withUTF8 { h in needle.withUTF8 { n in contains(h, n) } }
    }

    public static func contains(_ h: UnsafeBufferPointer<UInt8>, _ n: UnsafeBufferPointer<UInt8>) -> Bool {
        if n.isEmpty { return true }
        guard n.count <= h.count else { return false }
        let first = fold(n[0])
        var i = 0
        let last = h.count - n.count
        while i <= last {
            if fold(h[i]) == first {
                var j = 1
                while j < n.count && fold(h[i + j]) == fold(n[j]) { j += 1 }
                if j == n.count { return true }
            }
            i += 1
        }
        return false
    }

    @inline(__always) static func fold(_ c: UInt8) -> UInt8 { c >= 65 && c <= 90 ? c | 0x20 : c }
}

/// The metadata member test of a trigger (README § 21): a member of that name at the top level
/// of the record's metadata object whose value, when one is asked for, is a string equal to it
/// or, for any other JSON value, is written exactly as it (as the record holds it: `503`,
/// `true`, `null`, `[1,2]`), byte for byte. Any member of that name counts (a name given twice).
/// Metadata that is not one well-formed JSON object (nested at most 64 deep, nothing after
/// it) holds no member.
public enum MetadataMember {
    public static func holds(_ metadata: String, key: String, value: String?) -> Bool {
        var metadata = metadata
        var key = key
        guard var value else { return metadata.withUTF8 { m in key.withUTF8 { holds(m, key: $0, value: nil) } } }
        return metadata.withUTF8 { m in key.withUTF8 { k in value.withUTF8 { holds(m, key: k, value: $0) } } }
    }

    static func holds(_ bytes: UnsafeBufferPointer<UInt8>, key: UnsafeBufferPointer<UInt8>, value: UnsafeBufferPointer<UInt8>?) -> Bool {
        var scanner = JSONScanner(bytes)
        scanner.space()
        var found = false
        let wellFormed = scanner.members { scanner, name in
            let named = equal(name, in: bytes, to: key)
            let start = scanner.i
            let isString = scanner.at(0x22)
            guard scanner.skip(depth: 1, limit: 64) else { return false }
            guard named, !found else { return true }
            guard let value else {
                found = true
                return true
            }
            if isString, let text = JSONScanner(bytes, at: start).stringText() {
                found = equal(text, in: bytes, to: value)
            } else {
                found = !isString && Array(bytes[start..<scanner.i]) == Array(value)
            }
            return true
        }
        return wellFormed && scanner.atEnd() && found
    }

    /// Whether the JSON string `text` (its contents, escapes undone) is the bytes `other`.
    static func equal(_ text: JSONText, in bytes: UnsafeBufferPointer<UInt8>, to other: UnsafeBufferPointer<UInt8>) -> Bool {
        if text.escaped { return JSONString.unescape(bytes, text.range) == Array(other) }
        guard text.range.count == other.count else { return false }
        var i = 0
        for b in text.range {
            guard bytes[b] == other[i] else { return false }
            i += 1
        }
        return true
    }
}

extension JSONScanner {
    /// The string at ``i`` (nil when there is none).
    fileprivate func stringText() -> JSONText? {
        var copy = self
        return copy.string()
    }
}

/// The order of app versions a trigger's bounds use (README § 21, *Versions*): split at `.`,
/// compared part by part, the shorter padded with parts `0`. A part is its leading ASCII digits
/// (a number, leading zeros aside; none: below every number) and the rest (by UTF-8 bytes):
/// `1.10` is after `1.9`, `2` equals `2.0.0`, `10a` is after `10` and before `11`, and
/// `1.2.0-beta` is after `1.2.0` (not SemVer's order). A total order: parts compare as
/// (has digits, number, rest).
public enum AppVersionOrder {
    /// Negative, zero or positive as `a` is before, the same as, or after `b`.
    public static func compare(_ a: String, _ b: String) -> Int {
        let x = a.utf8.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        let y = b.utf8.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        let zero = "0".utf8[...]
        for i in 0..<max(x.count, y.count) {
            let order = part(Array(i < x.count ? x[i] : zero), Array(i < y.count ? y[i] : zero))
            if order != 0 { return order }
        }
        return 0
    }

    static func part(_ p: [UInt8], _ q: [UInt8]) -> Int {
        func split(_ s: [UInt8]) -> (digits: ArraySlice<UInt8>, rest: ArraySlice<UInt8>) {
            let count = s.prefix { $0 >= 48 && $0 <= 57 }.count
            return (s[..<count], s[count...])
        }
        let (pd, pr) = split(p)
        let (qd, qr) = split(q)
        if pd.isEmpty != qd.isEmpty { return pd.isEmpty ? -1 : 1 }
        let a = pd.drop { $0 == 48 }
        let b = qd.drop { $0 == 48 }
        if a.count != b.count { return a.count < b.count ? -1 : 1 }
        let numbers = bytes(Array(a), Array(b))
        return numbers != 0 ? numbers : bytes(Array(pr), Array(qr))
    }

    static func bytes(_ p: [UInt8], _ q: [UInt8]) -> Int {
        if p == q { return 0 }
        return p.lexicographicallyPrecedes(q) ? -1 : 1
    }
}
