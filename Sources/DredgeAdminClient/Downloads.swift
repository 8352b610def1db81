import AsyncHTTPClient
import Crypto
import DredgeAdminAPI
import DredgeDomain
import Foundation
import NIOCore

extension AdminClient {
    /// A pull's downloadable files (`GET /v1/pulls/{id}/files`).
    public func pullFiles(_ id: String) async throws -> [PullFile] {
        try await call("GET", "/v1/pulls/\(try Self.pathComponent(id))/files")
    }

    /// A feedback's downloadable files (`GET /v1/feedback/{id}/files`): its per-day files,
    /// manifest and zip, once it is complete.
    public func feedbackFiles(_ id: String) async throws -> [PullFile] {
        try await call("GET", "/v1/feedback/\(try Self.pathComponent(id))/files")
    }

    /// A capture's downloadable files (`GET /v1/captures/{id}/files`): its per-day files,
    /// manifest and zip, once it is complete.
    public func captureFiles(_ id: String) async throws -> [PullFile] {
        try await call("GET", "/v1/captures/\(try Self.pathComponent(id))/files")
    }

    /// A live tail's downloadable files (`GET /v1/tails/{id}/files`): each device's
    /// `records.jsonl` and `contexts.jsonl`, as far as the server holds them.
    public func tailFiles(_ id: String) async throws -> [PullFile] {
        try await call("GET", "/v1/tails/\(try Self.pathComponent(id))/files")
    }

    /// What ``download(pull:file:to:)`` did.
    public enum DownloadOutcome: Equatable, Sendable {
        /// Already there with the listed SHA-256: nothing sent.
        case present
        /// Downloaded whole.
        case downloaded
        /// An earlier, interrupted download went on from this byte.
        case resumed(from: Int64)
    }

    /// Streams one file of a pull to `path`, through `path.part`: an interrupted download goes
    /// on where it stopped (`Range`), and the file takes its name only once its SHA-256 is the
    /// listed one. A file already at `path` with that SHA-256 is left alone.
    @discardableResult
    public func download(pull id: String, file: PullFile, to path: String) async throws -> DownloadOutcome {
        try await download(
            url("/v1/pulls/\(try Self.pathComponent(id))/files/\(try Self.pathComponent(file.agentID))/\(try Self.pathComponent(file.name))"), file: file, to: path,
            restarted: false)
    }

    /// Streams one file of a feedback to `path`, as ``download(pull:file:to:)`` does.
    @discardableResult
    public func download(feedback id: String, file: PullFile, to path: String) async throws -> DownloadOutcome {
        try await download(url("/v1/feedback/\(try Self.pathComponent(id))/files/\(try Self.pathComponent(file.name))"), file: file, to: path, restarted: false)
    }

    /// Streams one file of a capture to `path`, as ``download(pull:file:to:)`` does.
    @discardableResult
    public func download(capture id: String, file: PullFile, to path: String) async throws -> DownloadOutcome {
        try await download(url("/v1/captures/\(try Self.pathComponent(id))/files/\(try Self.pathComponent(file.name))"), file: file, to: path, restarted: false)
    }

    /// Streams one file of a live tail to `path`, as ``download(pull:file:to:)`` does, asking
    /// for exactly the bytes listed: a running tail's file grows at its end, and what was listed
    /// stays as it was. A file left at `path` by an earlier fetch of the same tail is the start
    /// of this one, so the download goes on from its end (checked against the SHA-256 all the
    /// same).
    @discardableResult
    public func download(tail id: String, file: PullFile, to path: String) async throws -> DownloadOutcome {
        try await download(
            url("/v1/tails/\(try Self.pathComponent(id))/files/\(try Self.pathComponent(file.agentID))/\(try Self.pathComponent(file.name))"), file: file, to: path,
            restarted: false, growing: true)
    }

    /// Streams the whole pull as one zip (`GET /v1/pulls/{id}/zip`: every complete agent's
    /// files as `AGENT/NAME`) to `path`, through `path.part`; it takes its name only once its
    /// SHA-256 is the one the server sent (`ETag`). An interrupted download goes on where it
    /// stopped: the ETag is kept beside the part (`path.part.etag`) and sent as `If-Range`, so a
    /// zip made again meanwhile (another agent landed) comes whole instead of being appended to.
    /// Returns the file as the server described it, and how it came.
    public func downloadWholeZip(pull id: String, to path: String) async throws -> (file: PullFile, outcome: DownloadOutcome) {
        try await downloadWholeZip(pull: id, to: path, restarted: false)
    }

    private func downloadWholeZip(pull id: String, to path: String, restarted: Bool) async throws -> (file: PullFile, outcome: DownloadOutcome) {
        let fm = FileManager.default
        let part = path + ".part", etagFile = part + ".etag"
        do {
            try fm.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        } catch {
            throw AdminClientError.localFile((path as NSString).deletingLastPathComponent, error.localizedDescription)
        }
        // What an interrupted download left: its bytes and the ETag they are a prefix of.
        let have = Int64((try? fm.attributesOfItem(atPath: part)[.size] as? NSNumber)?.int64Value ?? 0)
        let heldETag = (try? String(contentsOfFile: etagFile, encoding: .utf8)).flatMap { Self.sha256(etag: $0) }
        let resuming = have > 0 && heldETag != nil
        let headers = resuming ? ["Range": "bytes=\(have)-", "If-Range": "\"\(heldETag ?? "")\""] : [:]
        let response = try await start("GET", url("/v1/pulls/\(try Self.pathComponent(id))/zip"), headers: headers, body: nil)
        let status = Int(response.status.code)
        let append: Bool
        switch status {
        case 200: append = false
        case 206 where resuming:
            guard response.headers.first(name: "Content-Range")?.hasPrefix("bytes \(have)-") == true else {
                throw AdminClientError.server(206, "a partial answer that does not start at byte \(have)")
            }
            append = true
        case 416 where resuming && !restarted:
            _ = try await response.body.collect(upTo: 1 << 16)
            // Nothing after the part: it may be the whole zip, cut short only before its rename.
            if try Self.sha256(ofFile: part) == heldETag {
                guard rename(part, path) == 0 else { throw AdminClientError.localFile(path, String(cString: strerror(errno))) }
                Self.removeSidecar(etagFile)
                return (PullFile(agentID: "", name: id + ".zip", kind: .zip, size: have, sha256: heldETag ?? ""), .resumed(from: have))
            }
            // Longer than the zip it was a prefix of: start again, once.
            for stale in [part, etagFile] where fm.fileExists(atPath: stale) {
                do { try fm.removeItem(atPath: stale) } catch { throw AdminClientError.localFile(stale, error.localizedDescription) }
            }
            return try await downloadWholeZip(pull: id, to: path, restarted: true)
        default:
            let body = try await response.body.collect(upTo: 1 << 16)
            try Self.check(status, Data(body.readableBytesView))
            throw AdminClientError.server(status, "unexpected answer to a download")
        }
        guard let expected = response.headers.first(name: "ETag").flatMap(Self.sha256(etag:)) else {
            throw AdminClientError.server(status, "the server sent the pull's zip without its SHA-256")
        }
        if append && expected != heldETag {
            throw AdminClientError.server(206, "a partial answer for another version of the zip")
        }
        if !append {
            do { try Data(expected.utf8).write(to: URL(fileURLWithPath: etagFile)) } catch { throw AdminClientError.localFile(etagFile, error.localizedDescription) }
        }
        let written = try await write(response, to: part, appending: append)
        let sha = try Self.sha256(ofFile: part)
        guard sha == expected else {
            for stale in [part, etagFile] where fm.fileExists(atPath: stale) {
                do { try fm.removeItem(atPath: stale) } catch { throw AdminClientError.localFile(stale, error.localizedDescription) }
            }
            throw AdminClientError.corrupt("the pull's zip arrived with SHA-256 \(sha), not the server's \(expected): removed; run the download again")
        }
        guard rename(part, path) == 0 else { throw AdminClientError.localFile(path, String(cString: strerror(errno))) }
        Self.removeSidecar(etagFile)
        return (PullFile(agentID: "", name: id + ".zip", kind: .zip, size: (append ? have : 0) + written, sha256: sha), append ? .resumed(from: have) : .downloaded)
    }

    /// Removes a finished download's kept ETag. A failure is no error: the zip is in place and
    /// checked, and a sidecar without its part is never used (nothing to resume) and is
    /// overwritten by the next download.
    static func removeSidecar(_ path: String) {
        _ = unlink(path)
    }

    /// The SHA-256 a strong ETag (`"HEX"`) carries, lowercase; nil when it carries none.
    static func sha256(etag: String) -> String? {
        let hex = etag.trimmingCharacters(in: CharacterSet(charactersIn: "\" \n"))
        guard hex.count == 64, hex.allSatisfy(\.isHexDigit) else { return nil }
        return hex.lowercased()
    }

    /// Streams a response's body into `part` (after what it holds, or from its start) and
    /// syncs it; returns the bytes written.
    @discardableResult
    private func write(_ response: HTTPClientResponse, to part: String, appending: Bool) async throws -> Int64 {
        if !appending || !FileManager.default.fileExists(atPath: part) {
            guard FileManager.default.createFile(atPath: part, contents: nil) else { throw AdminClientError.localFile(part, "cannot create it") }
        }
        let handle: FileHandle
        do { handle = try FileHandle(forWritingTo: URL(fileURLWithPath: part)) } catch { throw AdminClientError.localFile(part, error.localizedDescription) }
        defer { try? handle.close() }  // synced below; a failing close loses nothing written
        do {
            if appending { try handle.seekToEnd() } else { try handle.truncate(atOffset: 0) }
        } catch {
            throw AdminClientError.localFile(part, error.localizedDescription)
        }
        var written: Int64 = 0
        var body = response.body.makeAsyncIterator()
        while true {
            let buffer: ByteBuffer?
            do { buffer = try await body.next() } catch { throw describe(error) }
            guard let buffer else { break }
            written += Int64(buffer.readableBytes)
            do { try handle.write(contentsOf: Data(buffer.readableBytesView)) } catch { throw AdminClientError.localFile(part, error.localizedDescription) }
        }
        do { try handle.synchronize() } catch { throw AdminClientError.localFile(part, error.localizedDescription) }
        return written
    }

    /// Whether a listed agent id and file name are safe to use as path components on this
    /// machine: a hostile server's `..` or `.bashrc` is refused.
    public static func isSafeName(_ name: String) -> Bool {
        guard let first = name.unicodeScalars.first, first != ".", name.utf8.count <= 255 else { return false }
        return name.unicodeScalars.allSatisfy { $0.isASCII && (CharacterSet.alphanumerics.contains($0) || "-_.".unicodeScalars.contains($0)) }
    }

    /// `growing`: the file grows at its end (a live tail's), and the listed bytes are asked for
    /// as a range, whatever its ETag is now; a shorter file at `path` is taken as their start.
    private func download(_ url: URL, file: PullFile, to path: String, restarted: Bool, growing: Bool = false) async throws -> DownloadOutcome {
        guard Self.isSafeName(file.agentID), Self.isSafeName(file.name) else {
            throw AdminClientError.corrupt("the server listed a file named \(file.agentID.debugDescription)/\(file.name.debugDescription): refused")
        }
        let fm = FileManager.default
        if fm.fileExists(atPath: path), try Self.sha256(ofFile: path) == file.sha256 { return .present }
        let part = path + ".part"
        do {
            try fm.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        } catch {
            throw AdminClientError.localFile((path as NSString).deletingLastPathComponent, error.localizedDescription)
        }
        var continued = false
        if growing && !restarted && !fm.fileExists(atPath: part), let earlier = (try? fm.attributesOfItem(atPath: path)[.size] as? NSNumber)?.int64Value,
            earlier > 0, earlier < file.size
        {
            // What an earlier fetch got, copied: taken as the start of this file (checked at the
            // end; if it was not, the file is downloaded whole). The earlier file stays as it is
            // until a checked one replaces it.
            do { try fm.copyItem(atPath: path, toPath: part) } catch { throw AdminClientError.localFile(part, error.localizedDescription) }
            continued = true
        }
        var have = Int64((try? fm.attributesOfItem(atPath: part)[.size] as? NSNumber)?.int64Value ?? 0)
        if have > file.size { have = 0 }
        var outcome = DownloadOutcome.downloaded
        if have < file.size || file.size == 0 {
            // If-Range: should the file have changed since it was listed, it comes whole. A
            // growing file's listed bytes do not change: they are asked for as they are.
            let headers: [String: String] =
                growing && file.size > 0 ? ["Range": "bytes=\(have)-\(file.size - 1)"]
                : have > 0 ? ["Range": "bytes=\(have)-", "If-Range": "\"\(file.sha256)\""] : [:]
            let response = try await start("GET", url, headers: headers, body: nil)
            let status = Int(response.status.code)
            let append: Bool
            switch status {
            case 206:
                // Appended only where it continues the part.
                guard response.headers.first(name: "Content-Range")?.hasPrefix("bytes \(have)-") == true else {
                    throw AdminClientError.server(206, "a partial answer that does not start at byte \(have)")
                }
                // From byte 0 (a growing file's first download) the part is written afresh.
                append = have > 0
                if have > 0 { outcome = .resumed(from: have) }
            case 200 where growing:
                // The whole file as it is now, not the listed bytes (something between dropped the range).
                throw AdminClientError.server(200, "the whole of \(file.name) where its first \(file.size) bytes were asked for: is a proxy dropping Range?")
            case 200:
                append = false
            case 416 where !restarted:
                // The part is not a prefix of this file any more: start again, once.
                _ = try await response.body.collect(upTo: 1 << 16)
                do { try fm.removeItem(atPath: part) } catch { throw AdminClientError.localFile(part, error.localizedDescription) }
                return try await download(url, file: file, to: path, restarted: true, growing: growing)
            default:
                let body = try await response.body.collect(upTo: 1 << 16)
                try Self.check(status, Data(body.readableBytesView))
                throw AdminClientError.server(status, "unexpected answer to a download")
            }
            try await write(response, to: part, appending: append)
        }
        let sha = try Self.sha256(ofFile: part)
        guard sha == file.sha256 else {
            do { try fm.removeItem(atPath: part) } catch { throw AdminClientError.localFile(part, error.localizedDescription) }
            // The file there was not the start of this one (edited by hand, say): once more, whole.
            if continued { return try await download(url, file: file, to: path, restarted: true, growing: growing) }
            throw AdminClientError.corrupt("\(file.name) of agent \(file.agentID) arrived with SHA-256 \(sha), not the listed \(file.sha256): removed; run the download again")
        }
        guard rename(part, path) == 0 else { throw AdminClientError.localFile(path, String(cString: strerror(errno))) }
        return outcome
    }

    static func sha256(ofFile path: String) throws -> String {
        do { return try FileDigest.sha256(ofFile: path) } catch { throw AdminClientError.localFile(path, "\(error)") }
    }
}
