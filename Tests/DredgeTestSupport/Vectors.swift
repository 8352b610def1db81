import Foundation

/// The protocol's test vectors in `Protocol/vectors/`. Tests compare what the code produces with
/// the committed files byte for byte; with `DREDGE_WRITE_VECTORS=1` they write them instead (for
/// a deliberate protocol change, reviewed as such).
public enum Vectors {
    public static let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    public static let directory = repositoryRoot.appendingPathComponent("Protocol/vectors")
    public static var writing: Bool { ProcessInfo.processInfo.environment["DREDGE_WRITE_VECTORS"] == "1" }

    public static func render(_ object: Any) throws -> String {
        let data = try JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes])
        return String(decoding: data, as: UTF8.self) + "\n"
    }

    /// The committed vector file, parsed; nil if there is none yet.
    public static func load(_ name: String) -> [String: Any]? {
        guard let data = FileManager.default.contents(atPath: directory.appendingPathComponent(name).path) else { return nil }
        return try? JSONSerialization.jsonObject(with: data) as? [String: Any]
    }

    /// Writes (in write mode) or compares. Returns the committed text and the produced text.
    public static func check(_ name: String, _ object: Any) throws -> (committed: String?, produced: String) {
        let produced = try render(object)
        let path = directory.appendingPathComponent(name).path
        if writing {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            try Data(produced.utf8).write(to: URL(fileURLWithPath: path))
            return (produced, produced)
        }
        return (FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) }, produced)
    }
}
