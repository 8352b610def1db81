import DredgeAgentCore
import DredgePayload
import DredgeWire
import Foundation

/// Sends `upload` over `link` as the agent library's sender drives it, until the server's
/// result (nil if the connection ended first). `onFrame` sees every frame that arrives first
/// (for timing).
func sendUpload(_ upload: SealedUpload, over link: AgentLink, onFrame: (WireFrame) -> Void = { _ in }) async throws -> WireUploadResult? {
    var sender = UploadSenderStateMachine(header: upload.header)
    var result: WireUploadResult?
    func perform(_ actions: [UploadSenderStateMachine.Action]) async throws {
        for action in actions {
            switch action {
            case .send(let frame): try await link.send(frame)
            case .sendChunk(let index):
                let sealed = Data(try upload.chunk(index))
                try await link.send(.with { $0.uploadChunk = .with { $0.uploadID = upload.header.uploadID; $0.index = index; $0.ciphertext = sealed } })
            case .finished(let r), .retryLater(let r): result = r
            }
        }
    }
    try await perform(sender.resume())
    while result == nil, let frame = try await link.next() {
        onFrame(frame)
        try await perform(sender.receive(frame))
    }
    return result
}
