import DredgeAdminAPI
import DredgeDomain
import Foundation
import Hummingbird

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
            return Response(
                status: .ok, headers: [.contentType: "application/x-ndjson", .cacheControl: "no-store"],
                body: ResponseBody { writer in
                    try await stream(tail, watcher, hub: actions.services.tailHub, to: &writer)
                })
        }
        return routes
    }

    /// How long a stream may be silent before an empty line is sent.
    static let keepAlive: Duration = .seconds(20)

    /// The tail's events as JSON lines: its devices first, then what arrives, until it ends
    /// (stopped, expired) or the watcher goes. A tick each second looks for the expiry.
    static func stream(_ tail: TailRecord, _ watcher: TailHub.Watcher, hub: TailHub, to writer: inout any ResponseBodyWriter) async throws {
        let ticker = Task {
            while !Task.isCancelled {
                try await Task.sleep(for: .seconds(1))
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
        try await writer.write(try lines([TailEvent(kind: .devices, devices: tail.parts)]))
        var lastWrite = ContinuousClock.now
        while let events = await watcher.next() {
            if events.isEmpty {
                if Timestamp.now >= tail.expiresAt { watcher.end("expired") }
                // A line break now and then: a quiet tail is not a dead connection to a client or a proxy.
                if ContinuousClock.now - lastWrite >= keepAlive {
                    try await writer.write(ByteBuffer(string: "\n"))
                    lastWrite = .now
                }
                continue
            }
            try await writer.write(try lines(events))
            lastWrite = .now
        }
        try await writer.finish(nil)
    }
}
