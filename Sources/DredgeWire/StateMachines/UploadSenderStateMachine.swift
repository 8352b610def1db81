import SwiftProtobuf

/// The agent's side of one upload (README § Uploads): begin, then chunks with at most `window`
/// unacknowledged, then complete. It survives the connection: after a reconnect, ``resume()``
/// begins again with the same header and the server's bitmap decides what is left, so a chunk
/// the server holds is never sent twice.
///
/// The server's bitmap (`UploadReady`, `UploadStatus`) is the truth: it replaces what the
/// sender believed acknowledged. A server that answers `ERROR_UPLOAD_INCOMPLETE` has lost
/// chunks it once acknowledged; beginning again learns which, and only those are sent. After
/// ``maxIncompleteWithoutProgress`` such answers in a row with no chunk acknowledged between
/// them, the upload fails instead of looping.
public struct UploadSenderStateMachine: Sendable {
    public enum State: Sendable, Equatable {
        /// UploadBegin sent; waiting for UploadReady (or a result if the server already has it).
        case beginning
        case sending
        /// UploadComplete sent.
        case completing
        /// Not connected; ``resume()`` when the connection is back.
        case suspended
        case finished(WireUploadResult)
    }

    public enum Action: Sendable, Equatable {
        case send(WireFrame)
        /// Seal chunk `index` and send it in an UploadChunk frame.
        case sendChunk(UInt32)
        /// The upload ended (ok or not): report it and drop the local files.
        case finished(WireUploadResult)
        /// The server cannot take the upload now (`ERROR_INTERNAL`, `ERROR_LIMIT_EXCEEDED`): keep
        /// every file and call ``resume()`` after a backoff (or on the next connection).
        case retryLater(WireUploadResult)
    }

    /// `ERROR_UPLOAD_INCOMPLETE` answers in a row, with no chunk acknowledged between them,
    /// after which the upload is given up (Protocol/README.md § Uploads).
    public static let maxIncompleteWithoutProgress = 3

    /// Codes that mean "not now" rather than "never" (Protocol/README.md § Errors).
    public static let retryable: Set<WireErrorCode> = [.errorInternal, .errorLimitExceeded, .errorShuttingDown]

    public let header: WireUploadHeader
    public let window: Int
    public private(set) var state: State = .suspended
    /// Chunks the server has acknowledged (or reported holding).
    public private(set) var acknowledged: Set<UInt32> = []
    /// Chunks sent on this connection and not yet acknowledged.
    public private(set) var inFlight: Set<UInt32> = []
    /// Every chunk ever handed to the driver to send, with how many times: for tests and stats.
    public private(set) var sendCount: [UInt32: Int] = [:]
    /// `ERROR_UPLOAD_INCOMPLETE` answers since a chunk was last acknowledged.
    private var incompleteInARow = 0

    public init(header: WireUploadHeader, window: Int = WireLimits.defaultWindow) {
        self.header = header
        self.window = max(1, min(window, WireLimits.maxWindow))
    }

    public var uploadID: String { header.uploadID }

    /// Begins (or, after a reconnect, begins again).
    public mutating func resume() -> [Action] {
        switch state {
        case .finished: return []
        default:
            state = .beginning
            inFlight = []
            return [.send(.with { $0.uploadBegin = .with { $0.header = header } })]
        }
    }

    /// The connection is gone: chunks in flight are forgotten (they may or may not have arrived).
    public mutating func connectionLost() {
        if case .finished = state { return }
        state = .suspended
        inFlight = []
    }

    public mutating func receive(_ frame: WireFrame) -> [Action] {
        switch (state, frame.body) {
        case (.beginning, .uploadReady(let ready)?) where ready.uploadID == uploadID:
            // The server's bitmap replaces what we believed: it may have lost chunks it acked.
            acknowledged = ChunkBitmap.decode(ready.received, count: header.chunkCount)
            state = .sending
            return fill()
        case (.sending, .chunkAck(let ack)?) where ack.uploadID == uploadID:
            guard ack.index < header.chunkCount else { return [] }
            inFlight.remove(ack.index)
            if acknowledged.insert(ack.index).inserted { incompleteInARow = 0 }
            return fill()
        case (.beginning, .uploadStatus(let status)?) where status.uploadID == uploadID,
            (.sending, .uploadStatus(let status)?) where status.uploadID == uploadID:
            // What the server holds, less what is in flight (those are acked or lost later).
            acknowledged = ChunkBitmap.decode(status.received, count: header.chunkCount).subtracting(inFlight)
            return []
        case (_, .uploadResult(let result)?) where result.uploadID == uploadID:
            if case .finished = state { return [] }
            if !result.ok && Self.retryable.contains(result.error) {
                state = .suspended
                inFlight = []
                return [.retryLater(result)]
            }
            state = .finished(result)
            inFlight = []
            return [.finished(result)]
        case (_, .error(let error)?) where error.uploadID == uploadID:
            let result = WireUploadResult.with { $0.uploadID = uploadID; $0.ok = false; $0.error = error.code; $0.detail = error.detail }
            if case .finished = state { return [] }
            if error.code == .errorUploadIncomplete, case .completing = state {
                // The server lacks chunks we thought acknowledged: begin again to learn which,
                // unless it keeps saying so while acknowledging nothing.
                incompleteInARow += 1
                if incompleteInARow < Self.maxIncompleteWithoutProgress { return resume() }
                state = .finished(result)
                inFlight = []
                return [.finished(result)]
            }
            if Self.retryable.contains(error.code) {
                state = .suspended
                inFlight = []
                return [.retryLater(result)]
            }
            state = .finished(result)
            return [.finished(result)]
        default:
            return []
        }
    }

    private mutating func fill() -> [Action] {
        var actions: [Action] = []
        var next: UInt32 = 0
        while inFlight.count < window && next < header.chunkCount {
            if !acknowledged.contains(next) && !inFlight.contains(next) {
                inFlight.insert(next)
                sendCount[next, default: 0] += 1
                actions.append(.sendChunk(next))
            }
            next += 1
        }
        if acknowledged.count == Int(header.chunkCount) {
            state = .completing
            actions.append(.send(.with { $0.uploadComplete = .with { $0.uploadID = uploadID } }))
        }
        return actions
    }
}

/// The chunk bitmap of `UploadReady` and `UploadStatus`: bit i is byte i/8, bit i%8, LSB first.
public enum ChunkBitmap {
    public static func encode(_ indexes: Set<UInt32>, count: UInt32) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: Int((count + 7) / 8))
        for i in indexes where i < count { bytes[Int(i / 8)] |= 1 << (i % 8) }
        return bytes
    }

    public static func decode(_ bytes: some Collection<UInt8>, count: UInt32) -> Set<UInt32> {
        var result = Set<UInt32>()
        for (byteIndex, byte) in bytes.enumerated() where byte != 0 {
            for bit in 0..<8 where byte & (1 << bit) != 0 {
                let i = UInt32(byteIndex * 8 + bit)
                if i < count { result.insert(i) }
            }
        }
        return result
    }
}
