/// A string of the text, as ``JSONScanner`` found it: its content (between the quotes) and
/// whether it holds escapes (then ``JSONString/unescape(_:_:)`` gives its text).
@frozen public struct JSONText: Sendable, Equatable {
    public var range: Range<Int>
    public var escaped: Bool

    @inlinable public init(range: Range<Int>, escaped: Bool) {
        self.range = range
        self.escaped = escaped
    }
}

/// What a walk of a value (``JSONScanner/value(depth:limit:_:)``) tells, in document order.
/// Every hook may refuse (return false), which ends the walk as if the text were not JSON:
/// a reader's own rules (no name given twice, integers within 64 bits, at most so many levels)
/// are hooks over the one grammar. The defaults accept.
public protocol JSONVisitor {
    /// An object opens at `depth` (the walk's first value is at the depth it was given).
    mutating func beginObject(depth: Int) -> Bool
    /// A member's name, before its value.
    mutating func name(_ name: JSONText, in bytes: UnsafeBufferPointer<UInt8>) -> Bool
    mutating func endObject() -> Bool
    mutating func beginArray(depth: Int) -> Bool
    mutating func endArray() -> Bool
    mutating func string(_ text: JSONText, in bytes: UnsafeBufferPointer<UInt8>) -> Bool
    /// A number's bytes (the grammar checked, not its size), and whether it is written as an
    /// integer (no fraction, no exponent).
    mutating func number(_ range: Range<Int>, integral: Bool, in bytes: UnsafeBufferPointer<UInt8>) -> Bool
    mutating func literal(_ value: JSONLiteral) -> Bool
}

public enum JSONLiteral: Sendable {
    case `true`, `false`, null
}

extension JSONVisitor {
    @inlinable public mutating func beginObject(depth: Int) -> Bool { true }
    @inlinable public mutating func name(_ name: JSONText, in bytes: UnsafeBufferPointer<UInt8>) -> Bool { true }
    @inlinable public mutating func endObject() -> Bool { true }
    @inlinable public mutating func beginArray(depth: Int) -> Bool { true }
    @inlinable public mutating func endArray() -> Bool { true }
    @inlinable public mutating func string(_ text: JSONText, in bytes: UnsafeBufferPointer<UInt8>) -> Bool { true }
    @inlinable public mutating func number(_ range: Range<Int>, integral: Bool, in bytes: UnsafeBufferPointer<UInt8>) -> Bool { true }
    @inlinable public mutating func literal(_ value: JSONLiteral) -> Bool { true }
}

/// Checks the grammar and nothing else.
@frozen public struct JSONGrammar: JSONVisitor {
    @inlinable public init() {}
}

/// The one JSON reader of the server (RFC 8259), over bytes in memory, copying nothing: the
/// indexer's record lines, the search page's check of a record's metadata, the parser that
/// hands metadata out, and the schema checker's pass before decoding are each a walk of this
/// scanner with their own ``JSONVisitor``.
///
/// What every walk shares:
/// - the grammar: whitespace is space, tab, CR and LF; strings have valid escapes and no raw
///   control character (UTF-8 is not checked: bytes from 0x80 pass); numbers are
///   `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`; literals are `true`, `false`, `null`;
/// - the bound: a value at depth `limit` or deeper is refused (the walk's first value is at the
///   depth it is given; a member or element is one deeper than its container), so a hostile
///   text cannot recurse deeper than the caller allows;
/// - a refusal is `false` with ``i`` wherever it stopped.
@frozen public struct JSONScanner {
    public let bytes: UnsafeBufferPointer<UInt8>
    /// The next byte to read.
    public var i: Int

    @inlinable public init(_ bytes: UnsafeBufferPointer<UInt8>, at start: Int = 0) {
        self.bytes = bytes
        i = start
    }

    /// Whether the next byte (after none skipped) is `c`.
    @inlinable public func at(_ c: UInt8) -> Bool { i < bytes.count && bytes[i] == c }

    @inlinable public mutating func space() {
        while i < bytes.count {
            let c = bytes[i]
            guard c == 0x20 || c == 0x09 || c == 0x0A || c == 0x0D else { return }
            i += 1
        }
    }

    /// Space, then the end of the bytes.
    @inlinable public mutating func atEnd() -> Bool {
        space()
        return i == bytes.count
    }

    /// A string at ``i``, checked, and ``i`` past it; nil (``i`` unmoved) when there is none.
    @inlinable public mutating func string() -> JSONText? {
        guard at(0x22), let (end, escaped) = JSONString.scan(bytes, from: i + 1) else { return nil }
        defer { i = end + 1 }
        return JSONText(range: (i + 1)..<end, escaped: escaped)
    }

    /// Space, `:`, space: between a member's name and its value.
    @inlinable public mutating func colon() -> Bool {
        space()
        guard at(0x3A) else { return false }
        i += 1
        space()
        return true
    }

    /// After a member or an element: space, then `,` (true, more follow) or `close` (false,
    /// consumed); nil for anything else.
    @inlinable public mutating func more(_ close: UInt8) -> Bool? {
        space()
        guard i < bytes.count else { return nil }
        if bytes[i] == 0x2C {
            i += 1
            space()
            return true
        }
        guard bytes[i] == close else { return nil }
        i += 1
        return false
    }

    /// The object at ``i``: `body` is given each member's name with ``i`` at its value, and
    /// must consume the value (``skip(depth:limit:)``, say) or refuse. False when the object is
    /// not well formed or `body` refused.
    @inlinable public mutating func members(_ body: (inout JSONScanner, JSONText) -> Bool) -> Bool {
        guard at(0x7B) else { return false }
        i += 1
        space()
        if at(0x7D) {
            i += 1
            return true
        }
        while true {
            guard let name = string(), colon(), body(&self, name) else { return false }
            guard let next = more(0x7D) else { return false }
            if !next { return true }
        }
    }

    /// The value at ``i`` checked and skipped.
    @inlinable public mutating func skip(depth: Int, limit: Int) -> Bool {
        var grammar = JSONGrammar()
        return value(depth: depth, limit: limit, &grammar)
    }

    /// The value at ``i``, walked: checked, told to `visitor`, and ``i`` past it.
    @inlinable public mutating func value<V: JSONVisitor>(depth: Int, limit: Int, _ visitor: inout V) -> Bool {
        guard depth < limit, i < bytes.count else { return false }
        switch bytes[i] {
        case 0x22:
            guard let text = string() else { return false }
            return visitor.string(text, in: bytes)
        case 0x7B:
            guard visitor.beginObject(depth: depth) else { return false }
            i += 1
            space()
            if at(0x7D) {
                i += 1
                return visitor.endObject()
            }
            while true {
                guard let name = string(), visitor.name(name, in: bytes), colon(), value(depth: depth + 1, limit: limit, &visitor) else { return false }
                guard let next = more(0x7D) else { return false }
                if !next { return visitor.endObject() }
            }
        case 0x5B:
            guard visitor.beginArray(depth: depth) else { return false }
            i += 1
            space()
            if at(0x5D) {
                i += 1
                return visitor.endArray()
            }
            while true {
                guard value(depth: depth + 1, limit: limit, &visitor) else { return false }
                guard let next = more(0x5D) else { return false }
                if !next { return visitor.endArray() }
            }
        case 0x74: return literal("true") && visitor.literal(.true)
        case 0x66: return literal("false") && visitor.literal(.false)
        case 0x6E: return literal("null") && visitor.literal(.null)
        default:
            let start = i
            guard let (end, integral) = JSONToken.number(bytes, from: i) else { return false }
            i = end
            return visitor.number(start..<end, integral: integral, in: bytes)
        }
    }

    @inlinable mutating func literal(_ word: StaticString) -> Bool {
        guard let end = JSONToken.literal(bytes, at: i, word) else { return false }
        i = end
        return true
    }

    /// The whole of `bytes` is one value (space around it allowed), walked from depth 0.
    @inlinable public static func document<V: JSONVisitor>(_ bytes: UnsafeBufferPointer<UInt8>, limit: Int, _ visitor: inout V) -> Bool {
        var scanner = JSONScanner(bytes)
        scanner.space()
        return scanner.value(depth: 0, limit: limit, &visitor) && scanner.atEnd()
    }
}
