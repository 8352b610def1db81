import DredgeWire
import Foundation

/// Every path the server writes, moves or removes under its data directory, built in one
/// place from validated ids only (``WireID``), and each checked to stay inside the directory.
///
/// Layout: `uploads/<upload>-<agent>/` (chunks of uploads in progress), `pulls/<pull>/<agent>/`
/// and `pulls/<pull>/<agent>.zip` (finished pulls), `feedback/<id>/` and `feedback/<id>.zip`
/// (finished feedback), `captures/<id>/` and `captures/<id>.zip` (finished captures, #54),
/// `tails/<tail>/<agent>/` (what a live tail held of one device).
public struct DataDirectory: Sendable {
    /// The data directory, absolute and standardized.
    public let root: String

    public init(_ root: String) {
        self.root = URL(fileURLWithPath: root).standardizedFileURL.path
    }

    public struct PathError: Error, CustomStringConvertible {
        public let description: String
    }

    public var uploads: String { root + "/uploads" }
    public var pulls: String { root + "/pulls" }
    public var feedback: String { root + "/feedback" }
    public var tails: String { root + "/tails" }
    public var captures: String { root + "/captures" }

    /// `tails/<tail>`
    public func tail(_ tailID: String) throws -> String { try inside(tails + "/" + id(tailID)) }

    /// `tails/<tail>/<agent>`: one device's part of a live tail (``TailFiles``).
    public func tailFiles(_ tailID: String, agent agentID: String) throws -> String {
        try inside(tail(tailID) + "/" + id(agentID))
    }

    /// `uploads/<upload>-<agent>`
    public func upload(_ uploadID: String, agent agentID: String) throws -> String {
        try inside(uploads + "/" + id(uploadID) + "-" + id(agentID))
    }

    /// `pulls/<pull>`
    public func pull(_ pullID: String) throws -> String { try inside(pulls + "/" + id(pullID)) }

    /// `pulls/<pull>/<agent>`
    public func pullFiles(_ pullID: String, agent agentID: String) throws -> String {
        try inside(pull(pullID) + "/" + id(agentID))
    }

    /// `pulls/<pull>/<agent>.zip`
    public func pullZip(_ pullID: String, agent agentID: String) throws -> String {
        try inside(pull(pullID) + "/" + id(agentID) + ".zip")
    }

    /// `feedback/<id>`
    public func feedbackFiles(_ feedbackID: String) throws -> String { try inside(feedback + "/" + id(feedbackID)) }

    /// `feedback/<id>.zip`
    public func feedbackZip(_ feedbackID: String) throws -> String { try inside(feedback + "/" + id(feedbackID) + ".zip") }

    /// `captures/<id>`
    public func captureFiles(_ captureID: String) throws -> String { try inside(captures + "/" + id(captureID)) }

    /// `captures/<id>.zip`
    public func captureZip(_ captureID: String) throws -> String { try inside(captures + "/" + id(captureID) + ".zip") }

    /// `path` if it lies strictly inside the data directory once `.` and `..` are resolved;
    /// otherwise an error (and nothing is touched).
    public func inside(_ path: String) throws -> String {
        let resolved = URL(fileURLWithPath: path).standardizedFileURL.path
        guard resolved.hasPrefix(root + "/"), resolved.count > root.count + 1, !resolved.contains("/../"), !resolved.hasSuffix("/..") else {
            throw PathError(description: "refusing a path outside the data directory: \(path.prefix(200).debugDescription)")
        }
        return resolved
    }

    private func id(_ value: String) throws -> String {
        guard WireID.isValid(value) else { throw PathError(description: "not an id: \(WireID.echo(value).debugDescription)") }
        return value
    }

    /// The names in `directory`; none if it does not exist (yet) or is not a directory. Any
    /// other failure throws. Blocking.
    static func entries(of directory: String) throws -> [String] {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory), isDirectory.boolValue else { return [] }
        return try FileManager.default.contentsOfDirectory(atPath: directory)
    }

    /// fsyncs a directory, so the names created, renamed or removed in it are durable.
    static func sync(_ directory: String) throws {
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw DeploymentError("cannot open \(directory): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw DeploymentError("cannot sync \(directory): \(String(cString: strerror(errno)))") }
    }

    /// The (upload, agent) ids of an `uploads/` entry's name, if it has that form.
    static func parseUploadName(_ name: String) -> (upload: String, agent: String)? {
        let parts = name.split(separator: "-", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 2, WireID.isValid(parts[0]), WireID.isValid(parts[1]) else { return nil }
        return (parts[0], parts[1])
    }
}
