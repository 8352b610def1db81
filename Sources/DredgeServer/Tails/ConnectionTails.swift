import DredgeAdminAPI
import DredgeDomain
import DredgeWire
import Foundation
import Synchronization

/// One agent connection's side of the agent's live tails (#53, Protocol § 20): which tails
/// were sent on it, and for each the agent accepted on it, its ``TailStream`` and what its
/// files hold. A batch is checked by the stream, written by ``TailFiles``, recorded as held by
/// the ``TailRegistry``, and only then acknowledged; anything that breaks the rules ends the
/// agent's part of the tail, recorded with why, and the agent is told (`TailStop`).
///
/// Frames come one at a time (the session's steps); the state is under a lock all the same, as
/// the delivery pass marks tails sent from its own task.
final class ConnectionTails: Sendable {
    let agentID: String
    let services: ConnectionServices
    let registry: any TailRegistry
    private let state = Mutex(State())

    private struct State {
        /// Tails whose command was sent on this connection.
        var sent: Set<String> = []
        /// The tails accepted on this connection.
        var streams: [String: Entry] = [:]
    }

    private struct Entry: Sendable {
        var stream: TailStream
        /// Bytes of the records file held.
        var bytes: Int64
        var contexts: TailFiles.KnownContexts?
    }

    init(agentID: String, services: ConnectionServices, registry: any TailRegistry) {
        self.agentID = agentID
        self.services = services
        self.registry = registry
    }

    func wasSent(_ tailID: String) -> Bool { state.withLock { $0.sent.contains(tailID) } }
    func markSent(_ tailID: String) { state.withLock { _ = $0.sent.insert(tailID) } }

    /// Whether `frame` is a tail's (a rejection or an error report only for a tail sent here).
    func handles(_ frame: WireFrame) -> Bool {
        switch frame.body {
        case .tailAccepted?, .tailBatch?: true
        case .commandRejected(let m)?: wasSent(m.commandID)
        case .error(let e)?: e.code == .errorInternal && wasSent(e.uploadID)
        default: false
        }
    }

    /// What the server answers `frame` with (``handles(_:)`` said it is a tail's).
    func handle(_ frame: WireFrame) async -> [WireFrame] {
        switch frame.body {
        case .tailAccepted(let m)?:
            guard WireID.isValid(m.tailID) else { return [TailStream.stopFrame(WireID.echo(m.tailID), "no such tail")] }
            return await services.tailParts.withLock(m.tailID + "/" + agentID) { await accepted(m) }
        case .tailBatch(let b)?:
            guard WireID.isValid(b.tailID) else { return [TailStream.stopFrame(WireID.echo(b.tailID), "no such tail")] }
            return await services.tailParts.withLock(b.tailID + "/" + agentID) { await batch(b) }
        case .commandRejected(let m)?:
            forget(m.commandID)
            await end(m.commandID, .rejected, "\(m.reason): \(ConnectionUploads.bounded(m.detail))")
            services.logger.notice("tail rejected by agent", metadata: ["tail.id": "\(m.commandID)", "agent.id": "\(agentID)", "reason": "\(m.reason)"])
            return []
        case .error(let e)? where e.code == .errorInternal:
            forget(e.uploadID)
            await end(e.uploadID, .ended, "the agent could not go on: \(ConnectionUploads.bounded(e.detail))")
            return []
        default:
            return []
        }
    }

    private func forget(_ tailID: String) {
        state.withLock { $0.streams[tailID] = nil }
    }

    /// The tail's stream on this connection, going on from what the registry holds.
    private func resume(_ tailID: String, from hold: TailHold) async throws -> TailStream {
        let key = try await services.work.control.runIfActive { [issuer = services.issuer] in try issuer.key(hold.wrappedKey) }
        let stream = try TailStream(
            tailID: tailID, agentID: agentID, uid: hold.uid, key: key, expiresAt: hold.expiresAt, held: (hold.seq, hold.cursor), started: true)
        state.withLock { $0.streams[tailID] = Entry(stream: stream, bytes: hold.bytes, contexts: nil) }
        return stream
    }

    private func accepted(_ m: WireTailAccepted) async -> [WireFrame] {
        let id = m.tailID
        do {
            // Accepted again on a new connection before the server sent it again (Protocol § 20,
            // *Redelivery*): taken as well, if the agent's part is open.
            guard let hold = try await registry.accepted(id, agent: agentID, startCursor: m.startCursor, at: Date()) else {
                forget(id)
                return [TailStream.stopFrame(id, "no such tail is open for this agent")]
            }
            markSent(id)
            // The registry kept the start cursor: what it holds is the acknowledgement.
            let stream = try await resume(id, from: hold)
            services.logger.info("tail accepted", metadata: ["tail.id": "\(id)", "agent.id": "\(agentID)", "held.seq": "\(hold.seq)"])
            services.tailHub.ring(id)
            return [stream.acknowledgement]
        } catch {
            services.logger.error("cannot start a tail the agent accepted; ending its part", metadata: ["tail.id": "\(id)", "agent.id": "\(agentID)", "error": "\(error)"])
            forget(id)
            await end(id, .ended, "the server could not start it: \(error)")
            return [TailStream.stopFrame(id, "the server cannot take this tail now")]
        }
    }

    private func batch(_ b: WireTailBatch) async -> [WireFrame] {
        let id = b.tailID
        guard var entry = state.withLock({ $0.streams[id] }) else {
            guard WireID.isValid(id), wasSent(id) else { return [TailStream.stopFrame(WireID.echo(id), "no such tail runs for this agent on this connection")] }
            await end(id, .ended, "a batch came before the tail was accepted")
            return [TailStream.stopFrame(id, "a batch came before the tail was accepted")]
        }
        if services.tailHub.isStopped(id) {
            forget(id)
            return [TailStream.stopFrame(id, "the tail stopped")]
        }
        switch entry.stream.receive(b, now: .now) {
        case .again(let ack):
            return [ack]
        case .end(let reason, let stop):
            forget(id)
            services.logger.notice("tail batch refused; ending the agent's part", metadata: ["tail.id": "\(id)", "agent.id": "\(agentID)", "reason": "\(reason)"])
            await end(id, .ended, reason)
            return [stop]
        case .take(let taken):
            do {
                // What the registry holds now, not what this connection last saw: another
                // connection of the agent may have held batches since (it took over while this
                // one still handled a frame). Written after exactly those bytes, or not at all.
                guard let hold = try await registry.hold(id, agent: agentID, at: Date()) else {
                    forget(id)
                    return [TailStream.stopFrame(id, "the tail is over")]
                }
                if hold.seq != entry.stream.held.seq || hold.bytes != entry.bytes { return [try await resume(id, from: hold).acknowledgement] }
                let directory = try services.paths.tailFiles(id, agent: agentID)
                let (bytes, contexts) = try await services.work.uploads.runIfActive { [held = entry.bytes, known = entry.contexts] in
                    var known = known
                    let bytes = try TailFiles.append(taken.batch, after: held, known: &known, in: directory)
                    return (bytes, known)
                }
                let isHeld = try await registry.held(
                    id, agent: agentID, seq: taken.seq, cursor: taken.cursor, records: taken.batch.records.count, dropped: taken.dropped, bytes: bytes, at: Date())
                guard isHeld else {
                    // Stopped, expired or ended meanwhile; or another connection of the agent
                    // held it first: go on from what is held.
                    guard let hold = try await registry.hold(id, agent: agentID, at: Date()) else {
                        forget(id)
                        return [TailStream.stopFrame(id, "the tail is over")]
                    }
                    return [try await resume(id, from: hold).acknowledgement]
                }
                entry.bytes = bytes
                entry.contexts = contexts
                let ack = entry.stream.stored(taken)
                state.withLock { $0.streams[id] = entry }
                services.tailHub.ring(id)
                return [ack]
            } catch {
                services.logger.error("cannot keep a tail's batch; ending the agent's part", metadata: ["tail.id": "\(id)", "agent.id": "\(agentID)", "error": "\(error)"])
                forget(id)
                await end(id, .ended, "the server could not keep batch \(taken.seq)")
                return [TailStream.stopFrame(id, "the server cannot keep this tail's records now")]
            }
        }
    }

    /// Ends the agent's part in the registry (logged when the registry cannot say so).
    private func end(_ tailID: String, _ status: TailPartStatus, _ detail: String) async {
        guard WireID.isValid(tailID) else { return }
        do {
            if try await registry.endPart(tailID, agent: agentID, status: status, detail: detail, at: Date()) {
                // Its watchers here see the device end.
                services.tailHub.ring(tailID)
                // What it held is searchable now.
                services.landed(IndexedSource(kind: .tail, id: tailID, agentID: agentID), 0)
            }
        } catch {
            services.logger.error("cannot record the end of an agent's part of a tail", metadata: ["tail.id": "\(tailID)", "agent.id": "\(agentID)", "error": "\(error)"])
        }
    }
}
