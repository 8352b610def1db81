import Foundation
import SwiftProtobuf

/// The server's side of one upload (README § Uploads). It decides what to answer; the driver
/// verifies and stores chunks (durably, before it reports them stored) and assembles the
/// result.
public struct UploadReceiverStateMachine: Sendable {
    public enum State: Sendable, Equatable {
        case receiving
        /// Every chunk held and UploadComplete received: the driver is assembling.
        case assembling
        case finished(WireUploadResult)
    }

    public enum Action: Sendable, Equatable {
        case send(WireFrame)
        /// Verify and durably store chunk `index`, then call ``stored(_:)`` or ``rejected(_:_:)``.
        case store(index: UInt32, ciphertext: Data)
        /// Reassemble, decrypt and unpack, then call ``assembled(_:)``.
        case assemble
    }

    public let header: WireUploadHeader
    public private(set) var state: State = .receiving
    public private(set) var received: Set<UInt32>

    /// - Parameter received: chunks already held on disk (resume after a restart).
    public init(header: WireUploadHeader, received: Set<UInt32> = []) {
        self.header = header
        self.received = received
    }

    public var uploadID: String { header.uploadID }

    /// An UploadBegin for this upload arrived (first time or after a reconnect).
    public mutating func begin(_ header: WireUploadHeader) -> [Action] {
        guard header == self.header else {
            return [.send(error(.errorUploadInvalid, "upload \(uploadID) exists with a different header"))]
        }
        switch state {
        case .finished(let result): return [.send(.with { $0.uploadResult = result })]
        case .assembling: return []
        case .receiving: return [.send(.with { $0.uploadReady = .with { $0.uploadID = uploadID; $0.received = .init(ChunkBitmap.encode(received, count: header.chunkCount)) } })]
        }
    }

    public mutating func chunk(_ chunk: WireUploadChunk) -> [Action] {
        guard case .receiving = state else { return [] }
        guard chunk.index < header.chunkCount else {
            // § Uploads: the upload fails (the agent gives it up on ERROR_CHUNK_INVALID).
            let detail = "chunk \(chunk.index) of an upload of \(header.chunkCount)"
            state = .finished(.with { $0.uploadID = uploadID; $0.ok = false; $0.error = .errorChunkInvalid; $0.detail = detail })
            return [.send(error(.errorChunkInvalid, detail))]
        }
        if received.contains(chunk.index) {
            return [.send(.with { $0.chunkAck = .with { $0.uploadID = uploadID; $0.index = chunk.index } })]
        }
        return [.store(index: chunk.index, ciphertext: chunk.ciphertext)]
    }

    public mutating func stored(_ index: UInt32) -> [Action] {
        guard case .receiving = state else { return [] }
        received.insert(index)
        return [.send(.with { $0.chunkAck = .with { $0.uploadID = uploadID; $0.index = index } })]
    }

    /// The chunk failed verification (`.errorChunkAuthFailed`: the upload fails with an
    /// `UploadResult`), does not fit the upload (`.errorChunkInvalid`, a wrong size: the upload
    /// fails, answered with that `Error`), or could not be stored (`.errorInternal`: the agent
    /// may send it again later).
    public mutating func rejected(_ index: UInt32, _ code: WireErrorCode) -> [Action] {
        guard case .receiving = state else { return [] }
        switch code {
        case .errorChunkAuthFailed:
            let result = WireUploadResult.with { $0.uploadID = uploadID; $0.ok = false; $0.error = code; $0.detail = "chunk \(index) does not authenticate" }
            state = .finished(result)
            return [.send(.with { $0.uploadResult = result })]
        case .errorChunkInvalid:
            let detail = "chunk \(index) does not fit the upload's header (wrong size)"
            state = .finished(.with { $0.uploadID = uploadID; $0.ok = false; $0.error = code; $0.detail = detail })
            return [.send(error(code, detail))]
        default:
            return [.send(error(code, "chunk \(index) not stored now; send it again later"))]
        }
    }

    public mutating func complete() -> [Action] {
        switch state {
        case .finished(let result): return [.send(.with { $0.uploadResult = result })]
        case .assembling: return []
        case .receiving:
            guard received.count == Int(header.chunkCount) else {
                return [.send(error(.errorUploadIncomplete, "\(Int(header.chunkCount) - received.count) chunks missing"))]
            }
            state = .assembling
            return [.assemble]
        }
    }

    /// The driver's result. A failure of the receiver's own (`ERROR_INTERNAL`, a full disk)
    /// does not end the upload: every chunk is still held, and the agent completes it again later.
    public mutating func assembled(_ result: WireUploadResult) -> [Action] {
        guard case .assembling = state else { return [] }
        state = !result.ok && result.error == .errorInternal ? .receiving : .finished(result)
        return [.send(.with { $0.uploadResult = result })]
    }

    public func status() -> WireFrame {
        .with {
            $0.uploadStatus = .with {
                $0.uploadID = uploadID
                switch state {
                case .receiving, .assembling: $0.state = .receiving
                case .finished(let r): $0.state = r.ok ? .complete : .failed
                }
                $0.received = .init(ChunkBitmap.encode(received, count: header.chunkCount))
            }
        }
    }

    private func error(_ code: WireErrorCode, _ detail: String) -> WireFrame {
        .with { $0.error = .with { $0.code = code; $0.detail = detail; $0.fatal = false; $0.uploadID = uploadID } }
    }
}
