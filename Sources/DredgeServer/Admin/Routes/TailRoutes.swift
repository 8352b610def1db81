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

    /// The tail's events as JSON lines (``TailWatch``): its devices first, then what is stored
    /// from now on, until it ends (the `end` line last) or the watcher goes.
    static func stream(
        _ tail: TailRecord, _ watcher: TailHub.Watcher, tails: any TailRegistry, registry: any AgentDirectory, hub: TailHub, paths: DataDirectory,
        to writer: inout any ResponseBodyWriter
    ) async throws {
        let encoder = JSONEncoder.adminAPI
        func lines(_ events: [TailEvent]) throws -> ByteBuffer {
            var buffer = ByteBuffer()
            for event in events {
                if let line = event.line {
                    // The stored record's text spliced in as it is, the event's other members encoded.
                    var head = event
                    head.line = nil
                    var bytes = try encoder.encode(head)
                    guard bytes.last == UInt8(ascii: "}") else { throw AdminAPIError(.internalServerError, "internal", "a tail event did not encode as an object") }
                    bytes.removeLast()
                    buffer.writeBytes(bytes)
                    buffer.writeString(#","record":"#)
                    buffer.writeBytes(line)
                    buffer.writeString("}\n")
                    continue
                }
                buffer.writeBytes(try encoder.encode(event))
                buffer.writeInteger(UInt8(ascii: "\n"))
            }
            return buffer
        }
        let watch = TailWatch(tail: tail, watcher: watcher, tails: tails, registry: registry, hub: hub, paths: paths)
        let ended = try await watch.run(
            quiet: keepAlive,
            send: { events, _, _, _ in try await writer.write(try lines(events)) },
            // A line break now and then: a quiet tail is not a dead connection to a client or a proxy.
            idle: { try await writer.write(ByteBuffer(string: "\n")) })
        try await writer.write(try lines([TailEvent(kind: .end, reason: ended ?? "stopped")]))
        try await writer.finish(nil)
    }
}
