import Foundation

/// The stored form of a ``LogFilter``: what a server keeps for a pull until it becomes a signed
/// command, so it must read back exactly or not at all.
///
/// Version 1 is a JSON object with sorted keys:
///
/// ```
/// {"levels":["warning","error"],"since_us":1763700000000000,"text":"timeout","types":["app"],
///  "uid":"u-1","until_us":1763786400000000,"v":1}
/// ```
///
/// `v` is required; every other key is present only when that part of the filter is set.
/// `types` are sorted by name and `levels` by severity, so equal filters store equal text.
///
/// Reading fails closed: an unknown version, an unknown key, a value of the wrong type, an
/// invalid type or level name, a duplicate, or a filter that breaks ``LogFilter/problem``
/// throws ``Unreadable``. A damaged row never reads as a wider filter (least of all as all
/// records).
public enum StoredFilter {
    public static let currentVersion = 1

    /// A stored filter that does not read back.
    public struct Unreadable: Error, CustomStringConvertible, Sendable {
        public var description: String
        init(_ description: String) { self.description = description }
    }

    /// The version-1 text of `filter`: its JSON (``LogFilter``'s `Codable` form, the admin
    /// API's) with `v` added, keys sorted.
    public static func encode(_ filter: LogFilter) throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return String(decoding: try encoder.encode(Versioned(filter: filter)), as: UTF8.self)
    }

    private struct Versioned: Encodable {
        let filter: LogFilter
        private enum Key: String, CodingKey { case v }

        func encode(to encoder: any Encoder) throws {
            try filter.encode(to: encoder)
            var c = encoder.container(keyedBy: Key.self)
            try c.encode(StoredFilter.currentVersion, forKey: .v)
        }
    }

    /// Reads a stored filter back, or throws ``Unreadable``.
    public static func decode(_ text: String) throws -> LogFilter {
        let form: Form
        do {
            form = try JSONDecoder().decode(Form.self, from: Data(text.utf8))
        } catch let error as Unreadable {
            throw error
        } catch {
            throw Unreadable("not a stored filter: \(error)")
        }
        guard form.v == currentVersion else { throw Unreadable("stored filter version \(form.v) is not one this build reads (\(currentVersion))") }
        var filter = LogFilter()
        filter.since = form.since_us.map(Timestamp.init(microseconds:))
        filter.until = form.until_us.map(Timestamp.init(microseconds:))
        filter.uid = form.uid
        filter.text = form.text
        if let names = form.types {
            var types = Set<LogType>()
            for name in names {
                guard let type = LogType(name) else { throw Unreadable("stored filter has an invalid type \(name.debugDescription)") }
                guard types.insert(type).inserted else { throw Unreadable("stored filter lists type \(name) twice") }
            }
            filter.types = types
        }
        if let names = form.levels {
            var levels = Set<LogLevel>()
            for name in names {
                // Only the canonical names: an alias (`warn`) is not something this encoder writes.
                guard let level = LogLevel.allCases.first(where: { $0.name == name }) else {
                    throw Unreadable("stored filter has an invalid level \(name.debugDescription)")
                }
                guard levels.insert(level).inserted else { throw Unreadable("stored filter lists level \(name) twice") }
            }
            filter.levels = levels
        }
        if let problem = filter.problem { throw Unreadable("stored filter is not valid: \(problem)") }
        return filter
    }

    private struct Form: Decodable {
        var v: Int
        var since_us: Int64?
        var until_us: Int64?
        var uid: String?
        var types: [String]?
        var levels: [String]?
        var text: String?

        private typealias AnyKey = NamedKey

        private static let keys: Set<String> = ["v", "since_us", "until_us", "uid", "types", "levels", "text"]

        init(from decoder: any Decoder) throws {
            let c = try decoder.container(keyedBy: AnyKey.self)
            if let unknown = c.allKeys.first(where: { !Self.keys.contains($0.stringValue) }) {
                throw Unreadable("stored filter has an unknown key \(unknown.stringValue.debugDescription)")
            }
            v = try c.decode(Int.self, forKey: AnyKey("v"))
            since_us = try c.decodeIfPresent(Int64.self, forKey: AnyKey("since_us"))
            until_us = try c.decodeIfPresent(Int64.self, forKey: AnyKey("until_us"))
            uid = try c.decodeIfPresent(String.self, forKey: AnyKey("uid"))
            types = try c.decodeIfPresent([String].self, forKey: AnyKey("types"))
            levels = try c.decodeIfPresent([String].self, forKey: AnyKey("levels"))
            text = try c.decodeIfPresent(String.self, forKey: AnyKey("text"))
        }
    }
}
