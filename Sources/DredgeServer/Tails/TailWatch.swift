import DredgeAdminAPI
import DredgeDomain
import Foundation
import NIOPosix

/// One watcher of a live tail, from its first event to its end (#53): what the API's stream
/// (JSON lines) and the console's live view (server-sent events) share. It reads what the
/// server stored (``TailFollower``) each time the watcher is rung (a batch held here, a stop)
/// or at its ``tick`` (devices connected to other nodes, the expiry), and hands each run of
/// events to the surface with the devices' parts as the registry holds them then and where the
/// watcher stands in each device's records, so a surface whose client reconnects can go on
/// from there.
struct TailWatch {
    /// How often a watcher reads on without being rung.
    static let tick: Duration = .milliseconds(250)

    let tail: TailRecord
    let watcher: TailHub.Watcher
    let tails: any TailRegistry
    let registry: any AgentDirectory
    let hub: TailHub
    let paths: DataDirectory

    /// Runs until the tail ends (stopped, expired past its grace, removed: what was stored by
    /// then is handed over first), `goOn` says no (asked at a wake at most once a second: a
    /// session ended, the server shuts down), or `send` throws (the client went). The devices come first; then
    /// records from what is held now, or with `from`, from where a reconnecting client stood
    /// (``TailFollower/resume(_:tail:)``). `idle` is called after `quiet` without events (a keep-alive). Returns why
    /// the tail ended, or nil when `goOn` ended the watch. Unsubscribes the watcher.
    func run(
        from positions: [String: Int64]? = nil, quiet: Duration, goOn: @Sendable () async throws -> Bool = { true },
        send: ([TailEvent], _ parts: [TailPart], _ hosts: [String: String], _ positions: [String: Int64]) async throws -> Void, idle: () async throws -> Void
    ) async throws -> String? {
        let watcher = self.watcher
        let ticker = Task {
            while !Task.isCancelled {
                try await Task.sleep(for: Self.tick)
                watcher.poke()
            }
        }
        defer {
            ticker.cancel()
            hub.unsubscribe(watcher)
        }
        var follower = TailFollower(tail, paths: paths)
        var hosts: [String: String] = [:]
        func name(_ parts: [TailPart]) async throws {
            // Looked up once per device not seen yet (one the registry does not know: no host).
            if parts.contains(where: { hosts[$0.agentID] == nil }) {
                for agent in try await registry.agents() { hosts[agent.agentID] = agent.hostname }
                for part in parts where hosts[part.agentID] == nil { hosts[part.agentID] = "" }
            }
            for part in parts where !follower.hasName(part.agentID) { follower.name(part.agentID, host: hosts[part.agentID] ?? "") }
        }
        try await name(tail.parts)
        if let positions {
            follower = try await NIOThreadPool.singleton.runIfActive { [follower, tail] in
                var copy = follower
                try copy.resume(positions, tail: tail)
                return copy
            }
        }
        try await send([TailEvent(kind: .devices, devices: tail.parts)], tail.parts, hosts, follower.shown)
        var lastSent = ContinuousClock.now, lastAsked = ContinuousClock.now
        var ended: String?
        var more = false
        while true {
            if !more {
                guard let woke = await watcher.next() else { break }
                if let end = woke.first(where: { $0.kind == .end }) { ended = end.reason ?? "stopped" }
            }
            if ContinuousClock.now - lastAsked >= .seconds(1) {
                guard try await goOn() else { return nil }
                lastAsked = .now
            }
            guard let now = try await tails.tail(tail.id) else {
                ended = ended ?? "the tail is gone"
                break
            }
            try await name(now.parts)
            let read = try await NIOThreadPool.singleton.runIfActive { [follower] in
                var copy = follower
                let read = try copy.events(now)
                return (copy, read.events, read.more)
            }
            follower = read.0
            more = read.2
            if !read.1.isEmpty {
                try await send(read.1, now.parts, hosts, follower.shown)
                lastSent = .now
            }
            if ended == nil, let stopped = now.stopped { ended = stopped.reason }
            if ended == nil, now.removed != nil { ended = "its records were removed" }
            // Batches are taken for a minute's grace after the expiry (Protocol § 20): shown too.
            if ended == nil, Timestamp.now.microseconds >= now.expiresAt.microseconds + TailRows.grace { ended = "expired" }
            if ended != nil && !more { break }
            if ContinuousClock.now - lastSent >= quiet {
                try await idle()
                lastSent = .now
            }
        }
        return ended ?? "stopped"
    }
}
