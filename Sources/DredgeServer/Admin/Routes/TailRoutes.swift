import DredgeAdminAPI
import DredgeDomain
import Foundation
import Hummingbird
import NIOPosix

/// `/v1/tails`: start, list, read and stop live tails, and watch one (#53).
enum TailRoutes {
    static func collection(_ actions: AdminActions) -> RouteCollection<AdminRequestContext> {
        let routes = RouteCollection(context: AdminRequestContext.self)
        routes.get { request, context in
            try AdminAPI.json(try await actions.tails(limit: request.uri.queryParameters.get("limit", as: Int.self) ?? 100, for: context.signedIn))
        }
        routes.post { request, context in
            let body = try await AdminAPI.decode(TailRequest.self, from: request)
            return try AdminAPI.json(try await actions.createTail(body, by: context.signedIn, via: "api"), status: .created)
        }
        routes.get(":id") { _, context in
            try AdminAPI.json(try await actions.tail(context.parameters.require("id"), for: context.signedIn))
        }
        routes.delete(":id") { request, context in
            try AdminAPI.json(
                try await actions.stopTail(context.parameters.require("id"), by: context.signedIn, reason: request.uri.queryParameters.get("reason") ?? ""))
        }
        // What it held goes, the record stays (as a pull's results).
        routes.delete(":id/records") { request, context in
            try AdminAPI.json(
                try await actions.remove(.tail, try context.parameters.require("id"), by: context.signedIn, reason: request.uri.queryParameters.get("reason") ?? ""))
        }
        routes.get(":id/stream") { _, context in
            let (tail, watcher) = try await actions.watchTail(context.parameters.require("id"), by: context.signedIn)
            guard let paths = actions.services.files?.paths, let tails = actions.services.tails else {
                actions.services.tailHub.unsubscribe(watcher)
                throw AdminAPIError(.serviceUnavailable, "unavailable", "this server does not serve tails' records")
            }
            return Response(
                status: .ok, headers: [.contentType: "application/x-ndjson", .cacheControl: "no-store"],
                body: ResponseBody { writer in
                    try await stream(tail, watcher, tails: tails, registry: actions.services.registry, hub: actions.services.tailHub, paths: paths, to: &writer)
                })
        }
        return routes
    }

    /// How long a stream may be silent before an empty line is sent.
    static let keepAlive: Duration = .seconds(20)
    /// How often a watcher reads on without being rung (the devices of other nodes, the expiry).
    static let tick: Duration = .milliseconds(250)

    /// The tail's events as JSON lines: its devices first, then what is stored from now on
    /// (``TailFollower``), until it ends (stopped, expired: what was stored by then is sent
    /// first) or the watcher goes.
    static func stream(
        _ tail: TailRecord, _ watcher: TailHub.Watcher, tails: any TailRegistry, registry: any AgentDirectory, hub: TailHub, paths: DataDirectory,
        to writer: inout any ResponseBodyWriter
    ) async throws {
        let ticker = Task {
            while !Task.isCancelled {
                try await Task.sleep(for: tick)
                watcher.poke()
            }
        }
        defer {
            ticker.cancel()
            hub.unsubscribe(watcher)
        }
        let encoder = JSONEncoder.adminAPI
        func lines(_ events: [TailEvent]) throws -> ByteBuffer {
            var buffer = ByteBuffer()
            for event in events {
                buffer.writeBytes(try encoder.encode(event))
                buffer.writeInteger(UInt8(ascii: "\n"))
            }
            return buffer
        }
        var follower = TailFollower(tail, paths: paths)
        var hosts: [String: String] = [:]
        try await writer.write(try lines([TailEvent(kind: .devices, devices: tail.parts)]))
        var lastWrite = ContinuousClock.now
        var ended: String?
        var more = false
        while true {
            if !more {
                guard let woke = await watcher.next() else { break }
                if let end = woke.first(where: { $0.kind == .end }) { ended = end.reason ?? "stopped" }
            }
            guard let now = try await tails.tail(tail.id) else {
                ended = ended ?? "the tail is gone"
                break
            }
            for part in now.parts where !follower.hasName(part.agentID) {
                if hosts.isEmpty { for agent in try await registry.agents() { hosts[agent.agentID] = agent.hostname } }
                follower.name(part.agentID, host: hosts[part.agentID] ?? "")
            }
            let read = try await NIOThreadPool.singleton.runIfActive { [follower] in
                var copy = follower
                let read = try copy.events(now)
                return (copy, read.events, read.more)
            }
            follower = read.0
            more = read.2
            if !read.1.isEmpty {
                try await writer.write(try lines(read.1))
                lastWrite = .now
            }
            if ended == nil, let stopped = now.stopped { ended = stopped.reason }
            if ended == nil, now.removed != nil { ended = "its records were removed" }
            // Batches are taken for a minute's grace after the expiry (Protocol § 20): shown too.
            if ended == nil, Timestamp.now.microseconds >= now.expiresAt.microseconds + TailRows.grace { ended = "expired" }
            if ended != nil && !more { break }
            if ContinuousClock.now - lastWrite >= keepAlive {
                // A line break now and then: a quiet tail is not a dead connection to a client or a proxy.
                try await writer.write(ByteBuffer(string: "\n"))
                lastWrite = .now
            }
        }
        try await writer.write(try lines([TailEvent(kind: .end, reason: ended ?? "stopped")]))
        try await writer.finish(nil)
    }
}
