import Crypto
import DredgeAdminAPI
import DredgeWire
import Foundation
import NIOPosix
import Synchronization

/// A pull's files as the download routes serve them: only what the pull's record lists for a
/// complete target (its per-day files and manifest) and the agent's zip beside them, each
/// checked to lie inside the data directory; no path is ever built from a request's text.
/// SHA-256s are computed off the event loops and kept while the file's size and modification
/// time stay the same.
public struct PullFiles: Sendable {
    let paths: DataDirectory
    let pulls: any PullQueue
    private let digests = DigestCache()

    public init(paths: DataDirectory, pulls: any PullQueue) {
        self.paths = paths
        self.pulls = pulls
    }

    /// A file to serve: where it is on disk and what the listing says of it.
    public struct Located: Sendable {
        public var path: String
        public var file: PullFile
    }

    /// The pull's files in agent then name order; nil when there is no such pull.
    public func list(_ pullID: String) async throws -> [Located]? {
        guard let pull = try await pulls.pull(pullID) else { return nil }
        var located: [Located] = []
        for target in pull.targets where target.status == .complete {
            var candidates: [(String, PullFile.Kind)] = target.files.map { path in
                let name = (path as NSString).lastPathComponent
                return (path, name == "manifest.json" ? PullFile.Kind.manifest : PullFile.Kind.day)
            }
            candidates.append((try paths.pullZip(pullID, agent: target.agentID), .zip))
            for (path, kind) in candidates.sorted(by: { $0.0 < $1.0 }) {
                let inside = try paths.inside(path)
                guard let (size, sha) = try await digest(inside) else { continue }
                located.append(Located(path: inside, file: PullFile(agentID: target.agentID, name: (inside as NSString).lastPathComponent, kind: kind, size: size, sha256: sha)))
            }
        }
        return located
    }

    /// One file of the listing, by agent and name; nil when the pull or the file is not there.
    public func locate(_ pullID: String, agent agentID: String, name: String) async throws -> Located? {
        try await list(pullID)?.first { $0.file.agentID == agentID && $0.file.name == name }
    }

    /// (size, SHA-256 hex) of a regular file, nil when it is missing. Symbolic links are not
    /// followed: the server never makes them, so one is refused.
    private func digest(_ path: String) async throws -> (Int64, String)? {
        var info = stat()
        guard lstat(path, &info) == 0 else {
            if errno == ENOENT { return nil }
            throw DataDirectory.PathError(description: "cannot read \(path): \(String(cString: strerror(errno)))")
        }
        guard (info.st_mode & S_IFMT) == S_IFREG else { throw DataDirectory.PathError(description: "\(path) is not a regular file") }
        let key = DigestCache.Key(path: path, size: Int64(info.st_size), modified: Int64(info.st_mtim.tv_sec) * 1_000_000_000 + Int64(info.st_mtim.tv_nsec))
        if let known = digests.get(key) { return (key.size, known) }
        let sha = try await NIOThreadPool.singleton.runIfActive { try Self.sha256(of: path) }
        digests.set(key, sha)
        return (key.size, sha)
    }

    static func sha256(of path: String) throws -> String {
        guard let handle = FileHandle(forReadingAtPath: path) else {
            throw DataDirectory.PathError(description: "cannot open \(path)")
        }
        defer { try? handle.close() }
        var hash = SHA256()
        while let block = try handle.read(upToCount: 1 << 20), !block.isEmpty { hash.update(data: block) }
        return hash.finalize().map { String(format: "%02x", $0) }.joined()
    }
}

/// SHA-256s of files by (path, size, modification time); bounded.
private final class DigestCache: Sendable {
    struct Key: Hashable {
        var path: String
        var size: Int64
        var modified: Int64
    }
    private let state = Mutex<[Key: String]>([:])

    func get(_ key: Key) -> String? { state.withLock { $0[key] } }
    func set(_ key: Key, _ sha: String) {
        state.withLock { state in
            if state.count >= 10_000 { state.removeAll() }
            state[key] = sha
        }
    }
}

/// A request's `Range` (RFC 9110 § 14.2) against a file's size: one byte range is served as
/// 206, none (or one this server does not serve: several ranges, other units, malformed) as the
/// whole file, and a range that starts past the end as 416.
public enum ByteRange: Equatable, Sendable {
    case whole
    case partial(ClosedRange<Int64>)
    case unsatisfiable

    public static func parse(_ header: String?, size: Int64) -> ByteRange {
        guard let header else { return .whole }
        let text = header.trimmingCharacters(in: .whitespaces)
        guard text.lowercased().hasPrefix("bytes=") else { return .whole }
        let spec = text.dropFirst("bytes=".count).trimmingCharacters(in: .whitespaces)
        guard !spec.contains(",") else { return .whole }
        let parts = spec.split(separator: "-", maxSplits: 1, omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
        guard parts.count == 2, parts.allSatisfy({ $0.allSatisfy(\.isASCIIDigit) && $0.count <= 18 }) else { return .whole }
        switch (Int64(parts[0]), Int64(parts[1])) {
        case (nil, let suffix?):
            // The last `suffix` bytes.
            guard suffix > 0, size > 0 else { return .unsatisfiable }
            return .partial(max(0, size - suffix)...(size - 1))
        case (let first?, nil):
            guard first < size else { return .unsatisfiable }
            return .partial(first...(size - 1))
        case (let first?, let last?):
            guard first <= last else { return .whole }
            guard first < size else { return .unsatisfiable }
            return .partial(first...min(last, size - 1))
        case (nil, nil):
            return .whole
        }
    }
}

extension Character {
    fileprivate var isASCIIDigit: Bool { isASCII && isNumber }
}
