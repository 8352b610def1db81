import AsyncHTTPClient
import Crypto
import Foundation
import NIOCore

extension AdminClient {
    /// A pull's downloadable files (`GET /v1/pulls/{id}/files`).
    public func pullFiles(_ id: String) async throws -> [PullFile] {
        try await call("GET", "/v1/pulls/\(try Self.pathComponent(id))/files")
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
        let fm = FileManager.default
        if fm.fileExists(atPath: path), try Self.sha256(ofFile: path) == file.sha256 { return .present }
        let part = path + ".part"
        try fm.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        var have = Int64((try? fm.attributesOfItem(atPath: part)[.size] as? NSNumber)?.int64Value ?? 0)
        if have > file.size { have = 0 }
        let url = url("/v1/pulls/\(try Self.pathComponent(id))/files/\(try Self.pathComponent(file.agentID))/\(try Self.pathComponent(file.name))")
        var outcome = DownloadOutcome.downloaded
        if have < file.size || file.size == 0 {
            let response = try await start("GET", url, headers: have > 0 ? ["Range": "bytes=\(have)-"] : [:], body: nil)
            let status = Int(response.status.code)
            let append: Bool
            switch status {
            case 206:
                append = true
                outcome = .resumed(from: have)
            case 200:
                append = false
            case 416:
                // The part is not a prefix of this file any more: start again.
                _ = try? await response.body.collect(upTo: 1 << 16)
                try? fm.removeItem(atPath: part)
                return try await download(pull: id, file: file, to: path)
            default:
                let body = try await response.body.collect(upTo: 1 << 16)
                try Self.check(status, Data(body.readableBytesView))
                throw AdminClientError.server(status, "unexpected answer to a download")
            }
            if !append || !fm.fileExists(atPath: part) {
                guard fm.createFile(atPath: part, contents: nil) else { throw AdminClientError.corrupt("cannot create \(part)") }
            }
            let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: part))
            do {
                if append { try handle.seekToEnd() } else { try handle.truncate(atOffset: 0) }
                for try await buffer in response.body {
                    try handle.write(contentsOf: Data(buffer.readableBytesView))
                }
                try handle.synchronize()
                try handle.close()
            } catch {
                try? handle.close()
                throw error is AdminClientError ? error : describe(error)
            }
        }
        let sha = try Self.sha256(ofFile: part)
        guard sha == file.sha256 else {
            try? fm.removeItem(atPath: part)
            throw AdminClientError.corrupt("\(file.name) of agent \(file.agentID) arrived with SHA-256 \(sha), not the listed \(file.sha256): removed; run the download again")
        }
        if fm.fileExists(atPath: path) { try fm.removeItem(atPath: path) }
        try fm.moveItem(atPath: part, toPath: path)
        return outcome
    }

    static func sha256(ofFile path: String) throws -> String {
        guard let handle = FileHandle(forReadingAtPath: path) else { throw AdminClientError.corrupt("cannot read \(path)") }
        defer { try? handle.close() }
        var hash = SHA256()
        while let block = try handle.read(upToCount: 1 << 20), !block.isEmpty { hash.update(data: block) }
        return hash.finalize().map { String(format: "%02x", $0) }.joined()
    }
}
