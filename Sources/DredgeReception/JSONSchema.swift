import DredgeDomain
import DredgePayload
import DredgeJSON
import Foundation

/// What validation asks of a JSON value (``DredgeDomain/JSONValue``, read with integers exact).
extension JSONValue {
    var typeName: String {
        switch self {
        case .null: "null"
        case .bool: "boolean"
        case .integer: "integer"
        case .number: "number"
        case .string: "string"
        case .array: "array"
        case .object: "object"
        }
    }

    /// JSON Schema's "integer": a number with no fractional part.
    var isInteger: Bool {
        switch self {
        case .integer: true
        case .number(let d): d.isFinite && d.rounded() == d
        default: false
        }
    }

    var numeric: Double? {
        switch self {
        case .integer(let i): Double(i)
        case .number(let d): d
        default: nil
        }
    }

    /// A string equal for two values exactly when ``sameAs(_:)`` holds (uniqueness in one pass).
    var canonicalKey: String {
        if let n = numeric { return "n\(n)" }
        switch self {
        case .null: return "z"
        case .bool(let b): return b ? "t" : "f"
        case .string(let s): return "s" + s.debugDescription
        case .array(let a): return "[" + a.map(\.canonicalKey).joined(separator: ",") + "]"
        case .object(let o): return "{" + o.sorted { $0.key < $1.key }.map { $0.key.debugDescription + ":" + $0.value.canonicalKey }.joined(separator: ",") + "}"
        case .integer, .number: return ""  // numeric above
        }
    }

    /// Equality as JSON Schema's `const`, `enum` and `uniqueItems` mean it: 1 equals 1.0.
    func sameAs(_ other: JSONValue) -> Bool {
        if let a = numeric, let b = other.numeric { return a == b }
        switch (self, other) {
        case (.array(let a), .array(let b)): return a.count == b.count && zip(a, b).allSatisfy { $0.sameAs($1) }
        case (.object(let a), .object(let b)):
            return a.count == b.count && a.allSatisfy { key, value in b[key].map { value.sameAs($0) } ?? false }
        default: return self == other
        }
    }
}

/// The part of JSON Schema (draft 2020-12) the protocol's schemas use, and nothing more:
/// `type`, `const`, `enum`, `properties`, `required`, `additionalProperties`, `propertyNames`,
/// `maxProperties`, `items`, `minItems`, `maxItems`, `uniqueItems`, `pattern`, `minLength`,
/// `maxLength`, `minimum`, `maximum`, `$ref` (to `#/$defs/…`), `allOf`, `not`, `if`/`then`/`else`;
/// the annotations (`$schema`, `$id`, `title`, `description`, `$comment`) are ignored.
///
/// A schema that uses any other keyword is refused when it is compiled, so nothing a schema
/// says is silently skipped. Lengths count Unicode scalars, as JSON Schema does; patterns are
/// searched (not anchored), as JSON Schema does, with ICU's regular expressions.
struct JSONSchema: Sendable {
    struct Violation: Error, CustomStringConvertible, Equatable {
        /// JSON Pointer to the value that breaks the rule ("" for the whole document).
        var pointer: String
        var message: String
        var description: String { "\(pointer.isEmpty ? "/" : pointer): \(message)" }
    }

    struct SchemaError: Error, CustomStringConvertible {
        var description: String
    }

    private indirect enum Node: Sendable {
        case always(Bool)
        case rules([Rule])
    }

    private enum Rule: Sendable {
        case type([String])
        case const(JSONValue)
        case oneOfValues([JSONValue])
        case properties([String: Node])
        case required([String])
        case additionalProperties(Node, known: Set<String>)
        case propertyNames(Node)
        case maxProperties(Int)
        case items(Node)
        case minItems(Int)
        case maxItems(Int)
        case uniqueItems
        case pattern(String, NSRegularExpression)
        case minLength(Int)
        case maxLength(Int)
        case minimum(Double)
        case maximum(Double)
        case ref(String)
        case allOf([Node])
        case not(Node)
        case conditional(if: Node, then: Node?, else: Node?)
    }

    private static let annotations: Set<String> = ["$schema", "$id", "title", "description", "$comment", "$defs"]

    private let root: Node
    private let definitions: [String: Node]

    /// Compiles a schema document; throws ``SchemaError`` for anything this subset does not do.
    init(json: [UInt8]) throws {
        let document: JSONValue
        do {
            document = try JSONDecoder().decode(JSONValue.self, from: Data(json))
        } catch {
            throw SchemaError(description: "the schema is not JSON: \(error)")
        }
        var definitions: [String: Node] = [:]
        if case .object(let top) = document, case .object(let defs)? = top["$defs"] {
            for (name, schema) in defs { definitions[name] = try Self.compile(schema, at: "/$defs/\(name)") }
        }
        root = try Self.compile(document, at: "")
        self.definitions = definitions
        for name in Self.references(in: root) + definitions.values.flatMap({ Self.references(in: $0) }) where definitions[name] == nil {
            throw SchemaError(description: "$ref to an undefined #/$defs/\(name)")
        }
    }

    /// Every violation of the schema in `json`, document order not guaranteed; empty when valid.
    /// A document that is not JSON is one violation at the root.
    func violations(in json: [UInt8]) -> [Violation] {
        // The text is walked once before decoding (``JSONScanner``, the server's one JSON
        // reader): not JSON, or arrays and objects nested deeper than any protocol document
        // does, is refused unread, since decoding a deeply nested hostile text costs time that
        // grows with its depth.
        switch Self.shallowJSON(json) {
        case .notJSON: return [Violation(pointer: "", message: "not JSON")]
        case .tooDeep: return [Violation(pointer: "", message: "nests arrays and objects more than \(Self.maxNesting) deep")]
        case .fine: break
        }
        let value: JSONValue
        do {
            value = try JSONDecoder().decode(JSONValue.self, from: Data(json))
        } catch {
            return [Violation(pointer: "", message: "not JSON")]
        }
        return violations(of: value)
    }

    /// Arrays and objects nested deeper than this are refused unread.
    static let maxNesting = 16
    /// Checking stops after this many violations: enough to explain a document, and a hostile
    /// one cannot make the list (or the time to make it) grow with its size.
    static let maxViolations = 16

    enum Shallowness: Equatable { case fine, notJSON, tooDeep }

    /// Whether `json` is one JSON value whose arrays and objects nest at most ``maxNesting``
    /// deep: one walk, stopped where it goes deeper.
    static func shallowJSON(_ json: [UInt8]) -> Shallowness {
        /// Refuses a container that would be the 17th level.
        struct Nesting: JSONVisitor {
            var tooDeep = false
            mutating func beginObject(depth: Int) -> Bool { fits(depth) }
            mutating func beginArray(depth: Int) -> Bool { fits(depth) }
            mutating func fits(_ depth: Int) -> Bool {
                tooDeep = depth >= JSONSchema.maxNesting  // the root container is level 1, at depth 0
                return !tooDeep
            }
        }
        var nesting = Nesting()
        // Scalars may sit one level inside the deepest container.
        let ok = json.withUnsafeBufferPointer { JSONScanner.document($0, limit: maxNesting + 1, &nesting) }
        return ok ? .fine : nesting.tooDeep ? .tooDeep : .notJSON
    }

    func violations(of value: JSONValue) -> [Violation] {
        var found: [Violation] = []
        check(value, against: root, at: "", depth: 0, into: &found)
        return found
    }

    // MARK: Compiling

    private static func compile(_ schema: JSONValue, at path: String) throws -> Node {
        switch schema {
        case .bool(let b): return .always(b)
        case .object(let keywords): return .rules(try rules(keywords, at: path))
        default: throw SchemaError(description: "\(path): a schema is an object or a boolean")
        }
    }

    private static func rules(_ k: [String: JSONValue], at path: String) throws -> [Rule] {
        func fail(_ what: String) -> SchemaError { SchemaError(description: "\(path.isEmpty ? "/" : path): \(what)") }
        func count(_ key: String) throws -> Int {
            guard case .integer(let n)? = k[key], n >= 0, n <= Int64(Int32.max) else { throw fail("\(key) is not a non-negative integer") }
            return Int(n)
        }
        var rules: [Rule] = []
        for (key, value) in k.sorted(by: { $0.key < $1.key }) {
            switch key {
            case _ where annotations.contains(key):
                continue
            case "type":
                switch value {
                case .string(let t): rules.append(.type([t]))
                case .array(let ts):
                    let names = ts.compactMap { if case .string(let t) = $0 { t } else { nil } }
                    guard names.count == ts.count else { throw fail("type lists non-strings") }
                    rules.append(.type(names))
                default: throw fail("type is neither a string nor a list")
                }
                let known: Set = ["null", "boolean", "integer", "number", "string", "array", "object"]
                if case .type(let names) = rules.last, let unknown = names.first(where: { !known.contains($0) }) { throw fail("unknown type \(unknown)") }
            case "const": rules.append(.const(value))
            case "enum":
                guard case .array(let values) = value else { throw fail("enum is not a list") }
                rules.append(.oneOfValues(values))
            case "properties":
                guard case .object(let props) = value else { throw fail("properties is not an object") }
                var nodes: [String: Node] = [:]
                for (name, schema) in props { nodes[name] = try compile(schema, at: "\(path)/properties/\(name)") }
                rules.append(.properties(nodes))
            case "required":
                guard case .array(let names) = value else { throw fail("required is not a list") }
                let strings = names.compactMap { if case .string(let s) = $0 { s } else { nil } }
                guard strings.count == names.count else { throw fail("required lists non-strings") }
                rules.append(.required(strings))
            case "additionalProperties":
                var known = Set<String>()
                if case .object(let props)? = k["properties"] { known = Set(props.keys) }
                rules.append(.additionalProperties(try compile(value, at: "\(path)/additionalProperties"), known: known))
            case "propertyNames": rules.append(.propertyNames(try compile(value, at: "\(path)/propertyNames")))
            case "maxProperties": rules.append(.maxProperties(try count(key)))
            case "items": rules.append(.items(try compile(value, at: "\(path)/items")))
            case "minItems": rules.append(.minItems(try count(key)))
            case "maxItems": rules.append(.maxItems(try count(key)))
            case "uniqueItems":
                guard case .bool(let unique) = value else { throw fail("uniqueItems is not a boolean") }
                if unique { rules.append(.uniqueItems) }
            case "pattern":
                guard case .string(let pattern) = value else { throw fail("pattern is not a string") }
                do {
                    rules.append(.pattern(pattern, try NSRegularExpression(pattern: pattern)))
                } catch {
                    throw fail("pattern \(pattern) does not compile: \(error)")
                }
            case "minLength": rules.append(.minLength(try count(key)))
            case "maxLength": rules.append(.maxLength(try count(key)))
            case "minimum", "maximum":
                guard let bound = value.numeric else { throw fail("\(key) is not a number") }
                rules.append(key == "minimum" ? .minimum(bound) : .maximum(bound))
            case "$ref":
                let prefix = "#/$defs/"
                guard case .string(let target) = value, target.hasPrefix(prefix), target.count > prefix.count else {
                    throw fail("$ref must point into #/$defs/")
                }
                rules.append(.ref(String(target.dropFirst(prefix.count))))
            case "allOf":
                guard case .array(let schemas) = value, !schemas.isEmpty else { throw fail("allOf is not a non-empty list") }
                rules.append(.allOf(try schemas.enumerated().map { try compile($1, at: "\(path)/allOf/\($0)") }))
            case "not": rules.append(.not(try compile(value, at: "\(path)/not")))
            case "if":
                rules.append(
                    .conditional(
                        if: try compile(value, at: "\(path)/if"),
                        then: try k["then"].map { try compile($0, at: "\(path)/then") },
                        else: try k["else"].map { try compile($0, at: "\(path)/else") }))
            case "then", "else":
                guard k["if"] != nil else { throw fail("\(key) without if") }
            default:
                throw fail("keyword \(key) is not supported")
            }
        }
        return rules
    }

    private static func references(in node: Node) -> [String] {
        guard case .rules(let rules) = node else { return [] }
        return rules.flatMap { rule -> [String] in
            switch rule {
            case .ref(let name): [name]
            case .properties(let nodes): nodes.values.flatMap { references(in: $0) }
            case .additionalProperties(let n, _), .propertyNames(let n), .items(let n), .not(let n): references(in: n)
            case .allOf(let nodes): nodes.flatMap { references(in: $0) }
            case .conditional(let i, let t, let e): [i, t, e].compactMap { $0 }.flatMap { references(in: $0) }
            default: []
            }
        }
    }

    // MARK: Checking

    /// Schemas that refer to themselves could recurse without end; no protocol schema does,
    /// and this bound keeps a mistaken one from exhausting the stack.
    private static let maxDepth = 64

    private func check(_ value: JSONValue, against node: Node, at pointer: String, depth: Int, into found: inout [Violation]) {
        guard found.count < Self.maxViolations else { return }
        guard depth < Self.maxDepth else {
            found.append(Violation(pointer: pointer, message: "the schema nests deeper than \(Self.maxDepth)"))
            return
        }
        switch node {
        case .always(true): return
        case .always(false):
            found.append(Violation(pointer: pointer, message: "no value is allowed here"))
        case .rules(let rules):
            for rule in rules { check(value, rule, at: pointer, depth: depth, into: &found) }
        }
    }

    private func valid(_ value: JSONValue, _ node: Node, at pointer: String, depth: Int) -> Bool {
        var found: [Violation] = []
        check(value, against: node, at: pointer, depth: depth + 1, into: &found)
        return found.isEmpty
    }

    private static func number(_ x: Double) -> String {
        x.rounded() == x && abs(x) < 1e15 ? String(Int64(x)) : "\(x)"
    }

    private static func escape(_ key: String) -> String {
        key.replacingOccurrences(of: "~", with: "~0").replacingOccurrences(of: "/", with: "~1")
    }

    private func check(_ value: JSONValue, _ rule: Rule, at pointer: String, depth: Int, into found: inout [Violation]) {
        func violation(_ message: String) {
            if found.count < Self.maxViolations { found.append(Violation(pointer: pointer, message: message)) }
        }
        switch rule {
        case .type(let names):
            let matches = names.contains { name in
                switch name {
                case "integer": value.isInteger
                case "number": value.numeric != nil
                default: value.typeName == name
                }
            }
            if !matches { violation("is \(value.typeName), not \(names.joined(separator: " or "))") }
        case .const(let expected):
            if !value.sameAs(expected) { violation("is not the one allowed value") }
        case .oneOfValues(let allowed):
            if !allowed.contains(where: { value.sameAs($0) }) { violation("is not one of the allowed values") }
        case .properties(let nodes):
            guard case .object(let object) = value else { return }
            for (name, node) in nodes.sorted(by: { $0.key < $1.key }) {
                if let member = object[name] { check(member, against: node, at: pointer + "/" + Self.escape(name), depth: depth + 1, into: &found) }
            }
        case .required(let names):
            guard case .object(let object) = value else { return }
            for name in names where object[name] == nil { violation("lacks the required \(name)") }
        case .additionalProperties(let node, let known):
            guard case .object(let object) = value else { return }
            for (name, member) in object.sorted(by: { $0.key < $1.key }) where !known.contains(name) && found.count < Self.maxViolations {
                check(member, against: node, at: pointer + "/" + Self.escape(name), depth: depth + 1, into: &found)
            }
        case .propertyNames(let node):
            guard case .object(let object) = value else { return }
            for name in object.keys.sorted() where !valid(.string(name), node, at: pointer, depth: depth) {
                violation("has a member named \(name.debugDescription), which is not allowed")
            }
        case .maxProperties(let n):
            if case .object(let object) = value, object.count > n { violation("has more than \(n) members") }
        case .items(let node):
            guard case .array(let items) = value else { return }
            for (i, item) in items.enumerated() where found.count < Self.maxViolations {
                check(item, against: node, at: pointer + "/\(i)", depth: depth + 1, into: &found)
            }
        case .minItems(let n):
            if case .array(let items) = value, items.count < n { violation("has fewer than \(n) items") }
        case .maxItems(let n):
            if case .array(let items) = value, items.count > n { violation("has more than \(n) items") }
        case .uniqueItems:
            guard case .array(let items) = value else { return }
            var seen = Set<String>()
            for item in items where !seen.insert(item.canonicalKey).inserted {
                violation("repeats an item")
                return
            }
        case .pattern(let source, let regex):
            guard case .string(let s) = value else { return }
            if regex.firstMatch(in: s, range: NSRange(s.startIndex..., in: s)) == nil { violation("does not match \(source)") }
        case .minLength(let n):
            if case .string(let s) = value, s.unicodeScalars.count < n { violation("is shorter than \(n) characters") }
        case .maxLength(let n):
            if case .string(let s) = value, s.unicodeScalars.count > n { violation("is longer than \(n) characters") }
        case .minimum(let bound):
            if let x = value.numeric, x < bound { violation("is less than \(Self.number(bound))") }
        case .maximum(let bound):
            if let x = value.numeric, x > bound { violation("is more than \(Self.number(bound))") }
        case .ref(let name):
            // Checked at compile time: every reference names a definition.
            if let node = definitions[name] { check(value, against: node, at: pointer, depth: depth + 1, into: &found) }
        case .allOf(let nodes):
            for node in nodes { check(value, against: node, at: pointer, depth: depth + 1, into: &found) }
        case .not(let node):
            guard valid(value, node, at: pointer, depth: depth) else { return }
            if case .rules(let inner) = node, inner.count == 1, case .required(let names) = inner[0] {
                violation("must not have \(names.joined(separator: ", "))")
            } else {
                violation("matches a form that is not allowed here")
            }
        case .conditional(let condition, let then, let otherwise):
            if let next = valid(value, condition, at: pointer, depth: depth) ? then : otherwise {
                check(value, against: next, at: pointer, depth: depth + 1, into: &found)
            }
        }
    }
}
