import Crypto
import Foundation

/// SHA-256 as both ends write it, lowercase hex: the server lists a pull's files with it and a
/// download is checked against it.
public enum FileDigest {
    public struct UnreadableFile: Error, CustomStringConvertible {
        public var description: String
    }

    /// Of a file, read in 1 MiB blocks.
    public static func sha256(ofFile path: String) throws -> String {
        guard let handle = FileHandle(forReadingAtPath: path) else { throw UnreadableFile(description: "cannot open \(path)") }
        defer { try? handle.close() }  // read-only: closing cannot lose anything
        var hash = SHA256()
        while let block = try handle.read(upToCount: 1 << 20), !block.isEmpty { hash.update(data: block) }
        return hex(hash.finalize())
    }

    /// Of a file's first `length` bytes (a file still written to at its end, such as a live
    /// tail's records, whose first bytes no longer change); fails when it is shorter.
    public static func sha256(ofFile path: String, prefix length: Int64) throws -> String {
        var hash = SHA256()
        try update(&hash, withFile: path, from: 0, to: length)
        return hex(hash.finalize())
    }

    /// Feeds a file's bytes `from..<to` into `hash`, 1 MiB at a time; fails when the file ends
    /// before `to`.
    public static func update(_ hash: inout SHA256, withFile path: String, from: Int64, to: Int64) throws {
        guard let handle = FileHandle(forReadingAtPath: path) else { throw UnreadableFile(description: "cannot open \(path)") }
        defer { try? handle.close() }  // read-only: closing cannot lose anything
        if from > 0 { try handle.seek(toOffset: UInt64(from)) }
        var left = to - from
        while left > 0 {
            guard let block = try handle.read(upToCount: Int(min(left, 1 << 20))), !block.isEmpty else {
                throw UnreadableFile(description: "\(path) is shorter than \(to) bytes")
            }
            hash.update(data: block)
            left -= Int64(block.count)
        }
    }

    /// Of bytes.
    public static func sha256(_ bytes: some DataProtocol) -> String { hex(SHA256.hash(data: bytes)) }

    package static func hex(_ digest: some Sequence<UInt8>) -> String { digest.map { String(format: "%02x", $0) }.joined() }
}
