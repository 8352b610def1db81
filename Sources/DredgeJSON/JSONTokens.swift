/// JSON literals and numbers (RFC 8259) read straight from bytes, for ``JSONScanner``.
public enum JSONToken {
    /// The index just past `word` (`true`, `false`, `null`) if the bytes at `start` spell it.
    @inlinable public static func literal(_ bytes: UnsafeBufferPointer<UInt8>, at start: Int, _ word: StaticString) -> Int? {
        let n = word.utf8CodeUnitCount
        guard start + n <= bytes.count else { return nil }
        for k in 0..<n where bytes[start + k] != word.utf8Start[k] { return nil }
        return start + n
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?` from `start`: the index just past
    /// it and whether it is an integer (no fraction, no exponent); nil when it is not a number.
    @inlinable public static func number(_ bytes: UnsafeBufferPointer<UInt8>, from start: Int) -> (end: Int, integral: Bool)? {
        var i = start
        var integral = true
        func digit() -> Bool { i < bytes.count && bytes[i] >= 48 && bytes[i] <= 57 }
        if i < bytes.count, bytes[i] == UInt8(ascii: "-") { i += 1 }
        guard digit() else { return nil }
        if bytes[i] == 48 { i += 1 } else { while digit() { i += 1 } }
        if i < bytes.count, bytes[i] == UInt8(ascii: ".") {
            integral = false
            i += 1
            guard digit() else { return nil }
            while digit() { i += 1 }
        }
        if i < bytes.count, bytes[i] == UInt8(ascii: "e") || bytes[i] == UInt8(ascii: "E") {
            integral = false
            i += 1
            if i < bytes.count, bytes[i] == UInt8(ascii: "+") || bytes[i] == UInt8(ascii: "-") { i += 1 }
            guard digit() else { return nil }
            while digit() { i += 1 }
        }
        return (i, integral)
    }
}

/// JSON strings (RFC 8259) read straight from bytes, for ``JSONScanner`` and for whoever
/// needs a string's text.
public enum JSONString {
    /// Checks the string whose content starts at `start` (just after its opening quote): its
    /// escapes are valid and it has no raw control character. Returns the index of its closing
    /// quote and whether it holds escapes; nil when it is not a valid string.
    @inlinable public static func scan(_ bytes: UnsafeBufferPointer<UInt8>, from start: Int) -> (end: Int, escaped: Bool)? {
        var i = start
        var escaped = false
        while i < bytes.count {
            let c = bytes[i]
            if c == UInt8(ascii: "\"") { return (i, escaped) }
            if c < 0x20 { return nil }
            guard c == UInt8(ascii: "\\") else {
                i += 1
                continue
            }
            escaped = true
            guard i + 1 < bytes.count else { return nil }
            switch bytes[i + 1] {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"), UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                i += 2
            case UInt8(ascii: "u"):
                guard i + 6 <= bytes.count, (2..<6).allSatisfy({ hexDigit(bytes[i + $0]) != nil }) else { return nil }
                i += 6
            default: return nil
            }
        }
        return nil
    }

    /// The text of a string's content that ``scan(_:from:)`` accepted, escapes resolved: a
    /// surrogate pair is one character, a lone surrogate U+FFFD (as a UTF-8 decoder writes it).
    @inlinable public static func unescape(_ bytes: UnsafeBufferPointer<UInt8>, _ range: Range<Int>) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(range.count)
        var i = range.lowerBound
        while i < range.upperBound {
            let c = bytes[i]
            guard c == UInt8(ascii: "\\"), i + 1 < range.upperBound else {
                out.append(c)
                i += 1
                continue
            }
            let e = bytes[i + 1]
            i += 2
            switch e {
            case UInt8(ascii: "n"): out.append(0x0A)
            case UInt8(ascii: "t"): out.append(0x09)
            case UInt8(ascii: "r"): out.append(0x0D)
            case UInt8(ascii: "b"): out.append(0x08)
            case UInt8(ascii: "f"): out.append(0x0C)
            case UInt8(ascii: "u"):
                guard let high = hex4(bytes, i, end: range.upperBound) else { return out }
                var scalar = high
                i += 4
                if (0xD800..<0xDC00).contains(scalar), i + 1 < range.upperBound, bytes[i] == UInt8(ascii: "\\"), bytes[i + 1] == UInt8(ascii: "u"),
                    let low = hex4(bytes, i + 2, end: range.upperBound), (0xDC00..<0xE000).contains(low)
                {
                    scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    i += 6
                }
                out.append(contentsOf: String(Character(Unicode.Scalar(scalar) ?? "\u{FFFD}")).utf8)
            default: out.append(e)  // \" \\ \/
            }
        }
        return out
    }

    @usableFromInline @inline(__always) static func hexDigit(_ c: UInt8) -> UInt32? {
        switch c {
        case 48...57: UInt32(c - 48)
        case 65...70: UInt32(c - 55)
        case 97...102: UInt32(c - 87)
        default: nil
        }
    }

    @usableFromInline static func hex4(_ bytes: UnsafeBufferPointer<UInt8>, _ at: Int, end: Int) -> UInt32? {
        guard at + 4 <= end else { return nil }
        var value: UInt32 = 0
        for k in 0..<4 {
            guard let digit = hexDigit(bytes[at + k]) else { return nil }
            value = value << 4 | digit
        }
        return value
    }
}
