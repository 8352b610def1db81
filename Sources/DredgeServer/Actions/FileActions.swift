import DredgeAdminAPI
import DredgeWire

/// The pulled and fed-back files, for both surfaces: listed, located for a download with the
/// refusals an engineer sees (no such pull or file, nothing complete yet, changing), and each
/// download named for the audit log the same way wherever it is served. Serving the bytes
/// (ranges, ETag, `Repr-Digest`) is the HTTP adapter's part (`AdminAPI.serve`), which audits
/// through ``downloading(_:by:)`` just before it sends a byte.
extension AdminActions {
    /// A file about to be served, and how its download is recorded.
    public struct Download: Sendable {
        public let located: PullFiles.Located
        /// `pull.download`, `feedback.download` or `tail.download`.
        public let action: AuditAction
        /// The audit entry's detail: which file of which pull or feedback.
        public let detail: String
        /// What one entry stands for: a device's files of a pull (`pull ID agent A`) or of a
        /// tail, a pull's whole zip, or a feedback's files, whichever of them are downloaded.
        public let subject: String
    }

    /// A pull's files, per agent; a pull with no complete agent has none. A scoped caller sees
    /// the files of its devices only, and a pull that reached none of them is no pull.
    public func files(ofPull id: String, for caller: Caller) async throws -> [PullFiles.Located] {
        let id = try Self.checkedID(id, "pull")
        let scoped = try await reachable(pull: id, caller)
        guard let list = try await servedFiles().list(id) else { throw ActionError(.notFound, "no pull \(id)") }
        return scoped.map { scoped in list.filter { scoped.agents.contains($0.file.agentID) } } ?? list
    }

    public func files(ofFeedback id: String, for caller: Caller) async throws -> [PullFiles.Located] {
        let id = try Self.checkedID(id, "feedback")
        try await reachable(feedback: id, caller)
        guard let list = try await servedFiles().list(feedback: id) else { throw ActionError(.notFound, "no feedback \(id)") }
        return list
    }

    /// The agents of a scoped caller's scope and the whole pull (nil: unscoped), once the pull
    /// is known to have reached one of them; otherwise the pull is not found.
    private func reachable(pull id: String, _ caller: Caller) async throws -> (agents: Set<String>, pull: PullRecord)? {
        guard let agents = try await scopedAgents(caller) else { return nil }
        guard let pull = try await services.pulls.pull(id, now: .now), pull.targets.contains(where: { agents.contains($0.agentID) }) else {
            throw ActionError(.notFound, "no pull \(id)")
        }
        return (agents, pull)
    }

    /// A feedback a scoped caller may read (its device in the scope); otherwise not found.
    private func reachable(feedback id: String, _ caller: Caller) async throws {
        guard let agents = try await scopedAgents(caller) else { return }
        guard let record = try await services.feedback.feedback(id), agents.contains(record.agentID) else { throw ActionError(.notFound, "no feedback \(id)") }
    }

    /// One file an agent uploaded for a pull; only names its listing holds are served.
    public func file(ofPull id: String, agent: String, name: String, for caller: Caller) async throws -> Download {
        let id = try Self.checkedID(id, "pull"), agent = try Self.checkedID(agent, "agent")
        if let scoped = try await reachable(pull: id, caller), !scoped.agents.contains(agent) {
            throw ActionError(.notFound, "pull \(id) has no file \(WireID.echo(name).debugDescription) from agent \(agent)")
        }
        guard let located = try await servedFiles().locate(id, agent: agent, name: name) else {
            throw ActionError(.notFound, "pull \(id) has no file \(WireID.echo(name).debugDescription) from agent \(agent)")
        }
        return Download(located: located, action: .pullDownload, detail: "pull \(id) agent \(agent) file \(located.file.name)", subject: "pull \(id) agent \(agent)")
    }

    /// All of a pull's complete agents' files as one zip; for a scoped caller, only when every
    /// one of the pull's devices is in its scope (else none, as if there were no zip: it
    /// fetches them device by device).
    public func wholeZip(ofPull id: String, for caller: Caller) async throws -> Download {
        let id = try Self.checkedID(id, "pull")
        if let scoped = try await reachable(pull: id, caller), scoped.pull.targets.contains(where: { !scoped.agents.contains($0.agentID) }) {
            throw ActionError(.notFound, "pull \(id) has no whole zip within \(caller.name)'s scope: fetch its files device by device")
        }
        do {
            guard let zip = try await servedFiles().wholeZip(id) else { throw ActionError(.notFound, "no pull \(id)") }
            return Download(located: zip, action: .pullDownload, detail: "pull \(id) whole zip", subject: "pull \(id) whole zip")
        } catch PullFiles.WholeZipError.nothingYet {
            throw ActionError(.notFound, "pull \(id) has no files yet (none of its agents is complete, or it was removed)")
        } catch PullFiles.WholeZipError.changing {
            throw ActionError(.unavailable, "pull \(id)'s files are changing; ask again")
        }
    }

    public func file(ofFeedback id: String, name: String, for caller: Caller) async throws -> Download {
        let id = try Self.checkedID(id, "feedback")
        try await reachable(feedback: id, caller)
        guard let located = try await servedFiles().locate(feedback: id, name: name) else {
            throw ActionError(.notFound, "feedback \(id) has no file \(WireID.echo(name).debugDescription)")
        }
        return Download(located: located, action: .feedbackDownload, detail: "feedback \(id) file \(located.file.name)", subject: "feedback \(id)")
    }

    /// A live tail's files (#53): each device's records and the contexts they name, as far as
    /// they are held (``PullFiles/list(tail:)``). Only its requester and admins read a tail's
    /// records, as on its stream; others may see the tail, not its files (403).
    public func files(ofTail id: String, for caller: Caller) async throws -> [PullFiles.Located] {
        try await servedFiles().list(tail: readableTail(id, caller))
    }

    public func file(ofTail id: String, agent: String, name: String, for caller: Caller) async throws -> Download {
        let tail = try await readableTail(id, caller), agent = try Self.checkedID(agent, "agent")
        guard let located = try await servedFiles().locate(tail: tail, agent: agent, name: name) else {
            throw ActionError(.notFound, "tail \(tail.id) has no file \(WireID.echo(name).debugDescription) from agent \(agent)")
        }
        return Download(located: located, action: .tailDownload, detail: "tail \(tail.id) agent \(agent) file \(located.file.name)", subject: "tail \(tail.id) agent \(agent)")
    }

    /// A tail whose records the caller may read: its own, or any for an admin.
    private func readableTail(_ id: String, _ caller: Caller) async throws -> TailRecord {
        let tail = try await self.tail(id, for: caller)
        guard tail.requestedBy == caller.name || caller.role == .admin else {
            throw ActionError(.forbidden, "\(tail.requestedBy) started tail \(tail.id): they or an admin read its records", code: "forbidden")
        }
        return tail
    }

    /// Audits a download about to be served (``downloadAudit``): one entry per actor and
    /// ``Download/subject`` (a device's files of a pull, a pull's whole zip, a feedback's files)
    /// in ten minutes, naming the file that began it, so fetching them (or resuming) is one
    /// entry, not one per file.
    public func downloading(_ download: Download, by caller: Caller) async throws {
        try await downloadAudit.record(download.action, actor: caller.name, detail: download.detail, key: download.subject, in: services.audit, now: now())
    }

    /// An id from a path: a pull's, a feedback's or an agent's is 32 lowercase hex characters.
    static func checkedID(_ id: String, _ what: String) throws -> String {
        guard WireID.isValid(id) else { throw ActionError(.invalid, "\(what) id must be 32 lowercase hex characters") }
        return id
    }

    func servedFiles() throws -> PullFiles {
        guard let files = services.files else { throw ActionError(.unavailable, "this server does not serve files") }
        return files
    }
}
