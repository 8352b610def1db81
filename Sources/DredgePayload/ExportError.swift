/// A failure exporting logs or receiving an upload. `code` is stable; `message` is for people
/// (and never contains record contents).
public struct ExportError: Error, Hashable, Sendable, CustomStringConvertible {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private let name: String
        private init(_ name: String) { self.name = name }
        /// Reading or writing a file failed.
        public static let io = Code("io")
        /// The disk is full.
        public static let diskFull = Code("diskFull")
        /// The zip or its manifest breaks the payload limits or format (README § Payload).
        public static let payloadInvalid = Code("payloadInvalid")
        /// A chunk or header does not fit the upload.
        public static let uploadInvalid = Code("uploadInvalid")
        /// A chunk failed authentication.
        public static let chunkAuthFailed = Code("chunkAuthFailed")
        /// The destination already holds a finished result; it was left untouched.
        public static let exists = Code("exists")
        /// The upload is missing chunks.
        public static let incomplete = Code("incomplete")
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
