import DredgeAdminAPI
import Foundation
import Hummingbird

/// `/v1/sso`: `dredge login --sso` (``SingleSignOn/startDevice()``), the only `/v1` routes
/// without a token, since they are how a person without one gets one. Each start and poll is
/// a request to the identity provider: both are throttled per address (429 `too_many`). A
/// person whose groups give no role is refused (403 `forbidden`) and recorded as
/// `auth.failed`, as a refused token is.
enum SignOnRoutes {
    static func collection(_ actions: AdminActions, _ sso: SingleSignOn?) -> RouteCollection<AdminRequestContext> {
        let routes = RouteCollection(context: AdminRequestContext.self)
        @Sendable func enabled() throws -> SingleSignOn {
            guard let sso, sso.settings.cliClientID != nil else {
                throw AdminAPIError(.notFound, "sso_off", "this server signs no one in through an identity provider from the command line (sso.cliClientID is not set)")
            }
            return sso
        }
        @Sendable func admitted(_ sso: SingleSignOn, _ kind: DeviceSignInThrottle.Kind, _ context: AdminRequestContext) throws {
            let source = context.remoteAddress ?? "?"
            let host = source.split(separator: ":").dropLast().joined(separator: ":")
            guard sso.deviceThrottle.admit(kind, host: host.isEmpty ? source : host, now: actions.now()) else {
                throw AdminAPIError(.tooManyRequests, "too_many", "too many single sign-ons from this address: wait a minute")
            }
        }
        routes.post("device") { _, context in
            let sso = try enabled()
            try admitted(sso, .start, context)
            return try AdminAPI.json(try await answered(actions) { try await sso.startDevice() })
        }
        routes.post("device/token") { request, context in
            let sso = try enabled()
            let poll = try await AdminAPI.decode(DeviceSignInPoll.self, from: request)
            guard !poll.deviceCode.isEmpty, poll.deviceCode.utf8.count <= DeviceSignInPoll.maximumLength else {
                throw AdminAPIError(.badRequest, "bad_request", "deviceCode is 1 to \(DeviceSignInPoll.maximumLength) bytes")
            }
            try admitted(sso, .poll, context)
            let interval = poll.interval ?? 5
            let source = context.remoteAddress ?? "?"
            let person: SignedInPerson
            do {
                switch try await answered(actions, { try await sso.pollDevice(deviceCode: poll.deviceCode, interval: min(60, max(1, interval))) }) {
                case .pending(let interval): return try AdminAPI.json(DeviceSignInAnswer(status: .pending, interval: interval))
                case .signedIn(let signedIn): person = signedIn
                }
            } catch let error as AdminAPIError where error.code == "access_denied" {
                await actions.refusedToken("a single sign-on denied at the identity provider", for: "dredge login --sso", from: source)
                throw error
            }
            guard let caller = sso.caller(for: person, until: actions.now().addingTimeInterval(sso.settings.cliTokenSeconds)) else {
                await actions.refusedToken(
                    "\(person.name) (\(person.shown); groups \(person.groups.prefix(20).joined(separator: ", ").prefix(300))), whose groups and claims give no role or no scope",
                    for: "dredge login --sso", from: source)
                throw AdminAPIError(
                    .forbidden, "forbidden", "\(person.shown) signed in at the identity provider, but none of their groups gives a role in Dredge (or their scope claim is missing)")
            }
            let created = try await actions.signedOnToken(for: caller, shown: person.shown, from: source)
            let info = CallerInfo(name: caller.name, role: caller.role, scope: caller.scope, expiresAt: created.info.expiresAt)
            return try AdminAPI.json(DeviceSignInAnswer(status: .signedIn, token: created.token, caller: info, shown: person.shown))
        }
        return routes
    }

    /// The provider's failures as the API answers them: a refusal says what ended the sign-in,
    /// an unreachable or misbehaving provider is a 502 (and logged).
    static func answered<T>(_ actions: AdminActions, _ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch let refusal as SingleSignOn.DeviceRefusal {
            switch refusal {
            case .off: throw AdminAPIError(.notFound, "sso_off", "this server signs no one in through an identity provider from the command line")
            case .denied: throw AdminAPIError(.forbidden, "access_denied", "the sign-in was denied at the identity provider")
            case .expired: throw AdminAPIError(.gone, "expired", "the code lapsed before anyone entered it: start again")
            case .unknown: throw AdminAPIError(.badRequest, "unknown_code", "the identity provider knows no sign-in with that device code: start again")
            }
        } catch let error as SingleSignOnError {
            // The provider's addresses and words stay in the server's log: the caller has no token.
            actions.logger.warning("single sign-on for the command line failed", metadata: ["error": "\(error)"])
            throw AdminAPIError(.badGateway, "provider_failed", "the identity provider could not be asked, or answered what cannot be used: the server's log says why")
        }
    }
}
