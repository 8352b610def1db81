import DredgeAdminAPI
import Hummingbird

/// `/v1/tokens`: list, create and revoke admin and enrollment tokens (changes audited).
enum TokenRoutes {
    static func collection(_ actions: AdminActions) -> RouteCollection<AdminRequestContext> {
        let routes = RouteCollection(context: AdminRequestContext.self)
        routes.get { _, _ in try AdminAPI.json(await actions.tokens()) }
        routes.post { request, context in
            let body = try await AdminAPI.decode(TokenRequest.self, from: request)
            return try AdminAPI.json(try await actions.createToken(body, by: context.signedIn), status: .created)
        }
        routes.delete(":kind/:name") { _, context in
            // Percent-decoded: a token single sign-on made is named for its person (`sso:SUBJECT~LOGIN`).
            let raw = try context.parameters.require("name")
            let name = raw.removingPercentEncoding ?? raw
            guard let kind = TokenKind(rawValue: try context.parameters.require("kind")) else { throw ActionError(.notFound, "token kinds are admin and enrollment") }
            try await actions.revokeToken(name: name, kind: kind, by: context.signedIn)
            return try AdminAPI.json(await actions.tokens())
        }
        return routes
    }
}
