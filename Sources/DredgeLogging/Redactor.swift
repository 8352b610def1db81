import Crypto

/// Applies ``LogPrivacy`` to values before they are enqueued, keyed by the store's install key.
public struct Redactor: Sendable {
    public static let privateMask = "<private>"

    private let key: [UInt8]

    public init(installKey: [UInt8]) { self.key = installKey }

    /// `value` as it will be stored under `privacy`.
    public func apply(_ privacy: LogPrivacy, to value: String) -> String {
        switch privacy {
        case .public: return value
        case .private: return Self.privateMask
        case .hashed: return hash(value)
        }
    }

    /// `<hash:` + the first 8 bytes of HMAC-SHA256(installKey, UTF-8 of value) in lowercase hex + `>`.
    public func hash(_ value: String) -> String {
        let mac = HMAC<SHA256>.authenticationCode(for: Array(value.utf8), using: SymmetricKey(data: key))
        let hex = Array("0123456789abcdef".utf8)
        var out: [UInt8] = Array("<hash:".utf8)
        for byte in mac.prefix(8) {
            out.append(hex[Int(byte >> 4)])
            out.append(hex[Int(byte & 0xF)])
        }
        out.append(UInt8(ascii: ">"))
        return String(decoding: out, as: UTF8.self)
    }
}
