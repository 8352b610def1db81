import DredgeAdminAPI
import Foundation

/// A live tail's files as the download routes serve them (#53): for each device whose part
/// holds records, its `contexts.jsonl` up to its last whole line and its `records.jsonl` up to
/// the bytes the registry records as held (``TailFiles``). A running tail's files grow at their
/// ends, and a batch written but not yet recorded as held may lie there; neither is served. The
/// bytes a listing names never change afterwards, so a download of them (a range of the file)
/// holds what was listed, and matches its SHA-256, while the tail goes on.
extension PullFiles {
    /// The tail's files in agent then name order; none once it was removed.
    public func list(tail: TailRecord) async throws -> [Located] {
        guard tail.removed == nil else { return [] }
        var located: [Located] = []
        for part in tail.parts.sorted(by: { $0.agentID < $1.agentID }) where part.bytes > 0 {
            for name in [TailFiles.contexts, TailFiles.records] {
                if let file = try await locate(tail: tail, part: part, name: name) { located.append(file) }
            }
        }
        return located
    }

    /// One file of the listing, by agent and name; nil when the tail has no such file.
    public func locate(tail: TailRecord, agent agentID: String, name: String) async throws -> Located? {
        guard tail.removed == nil, let part = tail.parts.first(where: { $0.agentID == agentID }), part.bytes > 0,
            [TailFiles.contexts, TailFiles.records].contains(name)
        else { return nil }
        return try await locate(tail: tail, part: part, name: name)
    }

    private func locate(tail: TailRecord, part: TailPart, name: String) async throws -> Located? {
        let path = try paths.inside(paths.tailFiles(tail.id, agent: part.agentID) + "/" + name)
        let served: Int64
        let kind: PullFile.Kind
        if name == TailFiles.records {
            served = part.bytes
            kind = .records
        } else {
            guard let whole = try TailFiles.wholeLinesLength(of: path), whole > 0 else { return nil }
            served = whole
            kind = .contexts
        }
        guard let (size, sha) = try await digest(path, prefix: served) else { return nil }
        return Located(path: path, file: PullFile(agentID: part.agentID, name: name, kind: kind, size: size, sha256: sha))
    }
}
