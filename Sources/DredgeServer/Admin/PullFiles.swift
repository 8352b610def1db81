import DredgeAdminAPI
import DredgeEnvelope
import DredgeWire
import Crypto
import Foundation
import Synchronization
import ZIPFoundation

/// A pull's (or a feedback's) files as the download routes serve them: only what the pull's
/// record lists for a complete target (its per-day files and manifest) and the agent's zip
/// beside them, each checked to lie inside the data directory; no path is ever built from a
/// request's text. A feedback's and a capture's are the same: its files and its zip, once it
/// is complete.
/// SHA-256s are computed off the event loops and kept while the file's size and modification
/// time stay the same.
public struct PullFiles: Sendable {
    let paths: DataDirectory
    let pulls: any PullQueue
    let feedback: any FeedbackInbox
    /// The captures (#54); nil: a server without triggers.
    let captures: (any TriggerRegistry)?
    private let digests = DigestCache()
    private let prefixes = PrefixHashes()

    public init(paths: DataDirectory, pulls: any PullQueue, feedback: any FeedbackInbox, captures: (any TriggerRegistry)? = nil) {
        self.captures = captures
        self.paths = paths
        self.pulls = pulls
        self.feedback = feedback
    }

    /// A file to serve: where it is on disk and what the listing says of it.
    public struct Located: Sendable {
        public var path: String
        public var file: PullFile
    }

    /// The pull's files in agent then name order; nil when there is no such pull.
    public func list(_ pullID: String) async throws -> [Located]? {
        guard let candidates = try await candidates(pullID) else { return nil }
        var located: [Located] = []
        for candidate in candidates {
            if let file = try await describe(candidate) { located.append(file) }
        }
        return located
    }

    /// One file of the listing, by agent and name; nil when the pull or the file is not there.
    /// Only that file's SHA-256 is computed.
    public func locate(_ pullID: String, agent agentID: String, name: String) async throws -> Located? {
        guard let candidate = try await candidates(pullID)?.first(where: { $0.agentID == agentID && $0.name == name }) else { return nil }
        return try await describe(candidate)
    }

    /// A feedback's files in name order (its per-day files, manifest and zip); nil when there
    /// is no such feedback, empty until it is complete and once it is removed.
    public func list(feedback id: String) async throws -> [Located]? {
        guard let candidates = try await candidates(feedback: id) else { return nil }
        var located: [Located] = []
        for candidate in candidates {
            if let file = try await describe(candidate) { located.append(file) }
        }
        return located
    }

    /// One file of a feedback's listing, by name; nil when the feedback or the file is not there.
    public func locate(feedback id: String, name: String) async throws -> Located? {
        guard let candidate = try await candidates(feedback: id)?.first(where: { $0.name == name }) else { return nil }
        return try await describe(candidate)
    }

    /// A capture's files in name order (its per-day files, manifest and zip); nil when there
    /// is no such capture, empty until it is complete and once it is removed.
    public func list(capture id: String) async throws -> [Located]? {
        guard let candidates = try await candidates(capture: id) else { return nil }
        var located: [Located] = []
        for candidate in candidates {
            if let file = try await describe(candidate) { located.append(file) }
        }
        return located
    }

    /// One file of a capture's listing, by name; nil when the capture or the file is not there.
    public func locate(capture id: String, name: String) async throws -> Located? {
        guard let candidate = try await candidates(capture: id)?.first(where: { $0.name == name }) else { return nil }
        return try await describe(candidate)
    }

    /// The whole pull as one zip: every complete agent's per-day files and manifest, as
    /// `AGENT/NAME`, deflated. Made on first ask as `pulls/<pull>/pull-<key>.zip`, where the
    /// key is a digest of the listing (names and SHA-256s), so it is made again when another
    /// agent's files land, and deleted with the pull. Nil when the pull is unknown; an empty
    /// list of files is ``WholeZipError/nothingYet``.
    public func wholeZip(_ pullID: String) async throws -> Located? {
        guard let candidates = try await candidates(pullID) else { return nil }
        // The agents' zips are not in it: never hashed for it either.
        var parts: [Located] = []
        for candidate in candidates where candidate.kind != .zip {
            if let part = try await describe(candidate) { parts.append(part) }
        }
        guard !parts.isEmpty else { throw WholeZipError.nothingYet }
        var hash = SHA256()
        for part in parts { hash.update(data: Array("\(part.file.agentID)/\(part.file.name) \(part.file.sha256)\n".utf8)) }
        let key = Hex.encode(hash.finalize().prefix(8))
        let directory = try paths.pull(pullID)
        let path = try paths.inside(directory + "/pull-" + key + ".zip")
        let entries = parts.map { (name: $0.file.agentID + "/" + $0.file.name, path: $0.path) }
        // Twice at most: a zip replaced (another agent landed) or removed between making and
        // measuring it is made again once.
        for _ in 0..<2 {
            if !FileManager.default.fileExists(atPath: path) {
                try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                    Self.zipping.async {
                        do {
                            try Self.makeZip(at: path, of: entries, replacingOthersIn: directory)
                            continuation.resume()
                        } catch {
                            continuation.resume(throwing: error)
                        }
                    }
                }
            }
            if let (size, sha) = try await digest(path) {
                return Located(path: path, file: PullFile(agentID: "", name: pullID + ".zip", kind: .zip, size: size, sha256: sha))
            }
        }
        throw WholeZipError.changing
    }

    public enum WholeZipError: Error, Equatable {
        /// No agent's upload is complete yet.
        case nothingYet
        /// The pull's files changed while the zip was made, twice: ask again.
        case changing
    }

    /// Writes the zip beside its final name, then renames it (a reader never sees half a
    /// zip), and removes earlier versions made from another listing. Blocking.
    private static func makeZip(at path: String, of entries: [(name: String, path: String)], replacingOthersIn directory: String) throws {
        let fm = FileManager.default
        // Made meanwhile by an ask queued before this one.
        if fm.fileExists(atPath: path) { return }
        let staging = path + ".partial"
        if fm.fileExists(atPath: staging) { try fm.removeItem(atPath: staging) }
        do {
            let archive = try Archive(url: URL(fileURLWithPath: staging), accessMode: .create)
            for entry in entries {
                try archive.addEntry(with: entry.name, fileURL: URL(fileURLWithPath: entry.path), compressionMethod: .deflate)
            }
        } catch {
            try? fm.removeItem(atPath: staging)  // the error thrown below is what matters; a leftover is replaced next time
            throw error
        }
        guard rename(staging, path) == 0 else {
            throw DataDirectory.PathError(description: "cannot move the pull's zip into place: \(String(cString: strerror(errno)))")
        }
        for name in try fm.contentsOfDirectory(atPath: directory) where name.hasPrefix("pull-") && name.hasSuffix(".zip") && directory + "/" + name != path {
            try fm.removeItem(atPath: directory + "/" + name)
        }
    }

    private static let zipping = DispatchQueue(label: "dredge.pull-files.zip")

    private struct Candidate {
        var agentID: String
        var path: String
        var name: String
        var kind: PullFile.Kind
    }

    /// What a pull's record says it holds: each complete target's files and its zip.
    private func candidates(_ pullID: String) async throws -> [Candidate]? {
        guard let pull = try await pulls.pull(pullID) else { return nil }
        var candidates: [Candidate] = []
        for target in pull.targets where target.status == .complete {
            let directory = try paths.pullFiles(pullID, agent: target.agentID)
            var files: [(String, PullFile.Kind)] = target.files.compactMap { Self.placed($0, in: directory) }
            files.append((try paths.pullZip(pullID, agent: target.agentID), .zip))
            for (path, kind) in files.sorted(by: { $0.0 < $1.0 }) {
                let inside = try paths.inside(path)
                candidates.append(Candidate(agentID: target.agentID, path: inside, name: (inside as NSString).lastPathComponent, kind: kind))
            }
        }
        return candidates
    }

    /// A file the record lists, by its name, in its directory in this data directory: the
    /// record keeps the path it landed at, which is elsewhere once the data directory was
    /// moved or restored from a backup onto another host.
    static func placed(_ recorded: String, in directory: String) -> (String, PullFile.Kind)? {
        let name = (recorded as NSString).lastPathComponent
        guard !["", ".", ".."].contains(name) else { return nil }
        return (directory + "/" + name, name == "manifest.json" ? .manifest : .day)
    }

    /// What a feedback's record says it holds once complete: its files and its zip.
    private func candidates(feedback id: String) async throws -> [Candidate]? {
        guard let record = try await feedback.feedback(id) else { return nil }
        guard record.status == .complete, record.removed == nil else { return [] }
        return try candidates(record.files, of: record.agentID, in: try paths.feedbackFiles(id), zip: try paths.feedbackZip(id))
    }

    /// What a capture's record says it holds once complete: its files and its zip.
    private func candidates(capture id: String) async throws -> [Candidate]? {
        guard let record = try await captures?.capture(id) else { return nil }
        guard record.status == .complete, record.removed == nil else { return [] }
        return try candidates(record.files, of: record.agentID, in: try paths.captureFiles(id), zip: try paths.captureZip(id))
    }

    /// The files a device's own upload (a feedback, a capture) lists, in `directory`, and its zip.
    private func candidates(_ listed: [String], of agentID: String, in directory: String, zip: String) throws -> [Candidate] {
        var files: [(String, PullFile.Kind)] = listed.compactMap { Self.placed($0, in: directory) }
        files.append((zip, .zip))
        return try files.sorted(by: { $0.0 < $1.0 }).map { path, kind in
            let inside = try paths.inside(path)
            return Candidate(agentID: agentID, path: inside, name: (inside as NSString).lastPathComponent, kind: kind)
        }
    }

    private func describe(_ candidate: Candidate) async throws -> Located? {
        guard let (size, sha) = try await digest(candidate.path) else { return nil }
        return Located(path: candidate.path, file: PullFile(agentID: candidate.agentID, name: candidate.name, kind: candidate.kind, size: size, sha256: sha))
    }

    /// (size, SHA-256 hex) of a regular file, nil when it is missing. Symbolic links are not
    /// followed: the server never makes them, so one is refused. Hashing runs on a queue of its
    /// own (not the event loops, not the thread pool file reads use), one file at a time, and
    /// a file asked for twice meanwhile is hashed once.
    ///
    /// With `prefix`, of the file's first `prefix` bytes only (a live tail's file, written to
    /// after them but never within them): the size is then `prefix`, and a file shorter than
    /// that is an error. Such a digest is kept while the file is the same one (its inode),
    /// however it grows, and the hash of the longest prefix asked for is kept running: a growing
    /// file's next digest reads only what was added since (``PrefixHashes``).
    func digest(_ path: String, prefix: Int64? = nil) async throws -> (Int64, String)? {
        var info = stat()
        guard lstat(path, &info) == 0 else {
            if errno == ENOENT { return nil }
            throw DataDirectory.PathError(description: "cannot read \(path): \(String(cString: strerror(errno)))")
        }
        guard (info.st_mode & S_IFMT) == S_IFREG else { throw DataDirectory.PathError(description: "\(path) is not a regular file") }
        if let prefix, prefix > Int64(info.st_size) {
            throw DataDirectory.PathError(description: "\(path) holds \(info.st_size) bytes where \(prefix) are recorded as held")
        }
        let key = prefix.map { DigestCache.Key(path: path, size: $0, modified: -1, inode: UInt64(info.st_ino)) }
            ?? DigestCache.Key(path: path, size: Int64(info.st_size), modified: Int64(info.st_mtim.tv_sec) * 1_000_000_000 + Int64(info.st_mtim.tv_nsec), inode: UInt64(info.st_ino))
        if let known = digests.get(key) { return (key.size, known) }
        let digests = digests, prefixes = prefixes
        let sha: String = try await withCheckedThrowingContinuation { continuation in
            Self.hashing.async {
                if let known = digests.get(key) { return continuation.resume(returning: known) }
                do {
                    let sha = try prefix.map { try prefixes.digest(path, inode: key.inode, length: $0) } ?? FileDigest.sha256(ofFile: path)
                    digests.set(key, sha)
                    continuation.resume(returning: sha)
                } catch {
                    continuation.resume(throwing: error)
                }
            }
        }
        return (key.size, sha)
    }

    private static let hashing = DispatchQueue(label: "dredge.pull-files.sha256")
}

/// SHA-256s of files by (path, size, modification time); bounded.
private final class DigestCache: Sendable {
    struct Key: Hashable {
        var path: String
        var size: Int64
        /// The modification time in ns; -1 for a digest of a prefix, which no later write changes.
        var modified: Int64
        var inode: UInt64
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

/// The running SHA-256 of the longest prefix hashed of each growing file (a live tail's, by path
/// and inode): a longer prefix asked for later goes on from it, so a file listed again and
/// again as it grows is read once, not from its start each time. A shorter prefix (a download
/// of an older listing) is hashed from the start. Bounded; used on the hashing queue only.
private final class PrefixHashes: Sendable {
    struct Key: Hashable {
        var path: String
        var inode: UInt64
    }
    private let state = Mutex<[Key: (length: Int64, hash: SHA256)]>([:])

    func digest(_ path: String, inode: UInt64, length: Int64) throws -> String {
        let key = Key(path: path, inode: inode)
        let running = state.withLock { $0[key] }.flatMap { $0.length <= length ? $0 : nil }
        var hash = running?.hash ?? SHA256()
        try FileDigest.update(&hash, withFile: path, from: running?.length ?? 0, to: length)
        state.withLock { state in
            guard (state[key]?.length ?? -1) < length else { return }
            if state.count >= 1_000 { state.removeAll() }
            state[key] = (length, hash)
        }
        return FileDigest.hex(hash.finalize())
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
