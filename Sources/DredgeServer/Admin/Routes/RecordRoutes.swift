import DredgeAdminAPI
import Hummingbird
import NIOCore

/// `/v1/records`: search the index, and read one record with its neighbours (both audited);
/// the types, hosts and apps the records have.
enum RecordRoutes {
    static func collection(_ actions: AdminActions) -> RouteCollection<AdminRequestContext> {
        let routes = RouteCollection(context: AdminRequestContext.self)
        routes.post("search") { request, context in
            let search = try await AdminAPI.decode(RecordSearch.self, from: request)
            let page = try await actions.search(search, by: context.signedIn)
            // Written by hand: each record's metadata goes in as the index holds it, not parsed
            // and written again.
            return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: try page.jsonBytes())))
        }
        routes.post("stats") { request, context in
            let search = try await AdminAPI.decode(RecordSearch.self, from: request)
            return try AdminAPI.json(try await actions.stats(search, by: context.signedIn))
        }
        routes.get("vocabulary") { _, context in try AdminAPI.json(try await actions.vocabulary(for: context.signedIn)) }
        routes.get(":id") { request, context in
            guard let id = Int64(try context.parameters.require("id")), id > 0 else { throw ActionError(.invalid, "a record id is a positive integer") }
            guard let found = try await actions.record(id, context: try AdminAPI.recordContext(request), by: context.signedIn) else {
                throw ActionError(.notFound, "no record \(id)")
            }
            return try AdminAPI.json(found)
        }
        return routes
    }
}
