/// A failure of the encryption envelope. `code` is stable; `message` is for people.
public struct EnvelopeError: Error, Hashable, Sendable, CustomStringConvertible {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private let name: String
        private init(_ name: String) { self.name = name }
        /// A key could not be read or is too small.
        public static let invalidKey = Code("invalidKey")
        /// A wrapped key does not unwrap under this private key, or is not 32 bytes.
        public static let keyUnwrapFailed = Code("keyUnwrapFailed")
        /// A command carries no signature.
        public static let unsigned = Code("unsigned")
        /// A signature does not verify.
        public static let badSignature = Code("badSignature")
        /// A chunk does not decrypt: tampered, reordered, from another upload, or a wrong key.
        public static let chunkAuthFailed = Code("chunkAuthFailed")
        /// A header or chunk breaks the envelope's rules (prefix length, sizes, index).
        public static let invalidUpload = Code("invalidUpload")
        public var description: String { name }
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(code): \(message)" }
}
