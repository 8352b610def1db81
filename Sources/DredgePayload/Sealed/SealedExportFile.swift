import Crypto
import DredgeEnvelope
import DredgeWire
import Foundation

/// Manual exports: the same zip a pull uploads, written to a file at the device, either as is
/// or sealed to a recipient's RSA public key (Protocol/README.md § 19):
///
/// ```
/// "DRDGEXP1" ‖ u32be(n) ‖ UploadHeader (n bytes, kind EXPORT, wrapped_key = the AES key under
/// the recipient's key) ‖ for each chunk i: u32be(m) ‖ the chunk sealed as in § 12 (m bytes)
/// ```
///
/// The envelope is the upload's (AES-256-GCM per chunk, nonce with index and last flag, header
/// digest as associated data), so a reordered, truncated, spliced or altered file fails.
/// Writing one is `DredgeExport`'s; opening one is `DredgeReception`'s.
public enum SealedExportFile {
    public static let magic = Array("DRDGEXP1".utf8)
    /// The most header bytes a reader accepts.
    public static let maxHeaderBytes = 64 * 1024

    package static func publish(_ temporary: String, as path: String) throws {
        guard rename(temporary, path) == 0 else { throw ExportError(.io, "cannot write \(path): \(String(cString: strerror(errno)))") }
    }

    package static func u32(_ n: Int) -> [UInt8] { withUnsafeBytes(of: UInt32(n).bigEndian) { Array($0) } }
    package static func u32(_ bytes: [UInt8]) -> UInt32 { bytes.reduce(0) { $0 << 8 | UInt32($1) } }
}
