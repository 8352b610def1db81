import Crypto
import DredgeEnvelope
import Foundation
import Synchronization

/// The web console's signed-in sessions, in memory: a restart signs everyone out.
///
/// A session is made from an admin token and keeps it, so every request checks the token
/// again: revoking a token ends its sessions at their next request. A session ends when it
/// is signed out, at its expiry (absolute, from sign-in), or when the server holds too many
/// (the oldest goes). Ids and CSRF tokens are 256 random bits; the map is keyed by the id's
/// SHA-256, so a lookup's timing says nothing about the ids it holds.
public final class ConsoleSessions: Sendable {
    public struct Session: Sendable, Equatable {
        /// The admin token's name: what the audit log records the console's actions under.
        public var tokenName: String
        /// The token itself, checked again on every request.
        var token: String
        /// What every form of this session carries.
        public var csrf: String
        public var expires: Date
    }

    public static let defaultLifetime: TimeInterval = 8 * 3600
    static let capacity = 10_000

    let lifetime: TimeInterval
    let now: @Sendable () -> Date
    private let sessions = Mutex<[String: Session]>([:])

    /// `now` is the clock (tests pass their own).
    public init(lifetime: TimeInterval = ConsoleSessions.defaultLifetime, now: @escaping @Sendable () -> Date = { Date() }) {
        self.lifetime = lifetime
        self.now = now
    }

    /// A new session for a token already checked; its id goes into the cookie.
    func open(tokenName: String, token: String) -> (id: String, session: Session) {
        let id = Self.randomToken(), at = now()
        let session = Session(tokenName: tokenName, token: token, csrf: Self.randomToken(), expires: at.addingTimeInterval(lifetime))
        sessions.withLock { all in
            all = all.filter { $0.value.expires > at }
            if all.count >= Self.capacity, let oldest = all.min(by: { $0.value.expires < $1.value.expires })?.key { all[oldest] = nil }
            all[Self.key(id)] = session
        }
        return (id, session)
    }

    /// The live session of a cookie's id; an expired one is forgotten.
    func session(_ id: String) -> Session? {
        let key = Self.key(id), at = now()
        return sessions.withLock { all in
            guard let session = all[key] else { return nil }
            guard session.expires > at else {
                all[key] = nil
                return nil
            }
            return session
        }
    }

    func close(_ id: String) {
        _ = sessions.withLock { $0.removeValue(forKey: Self.key(id)) }
    }

    var count: Int { sessions.withLock { $0.count } }

    static func key(_ id: String) -> String { Hex.encode(SHA256.hash(data: Array(id.utf8))) }

    /// 256 random bits, hex.
    static func randomToken() -> String {
        var generator = SystemRandomNumberGenerator()
        return Hex.encode((0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) })
    }

    /// Whether two tokens are equal, in time that does not depend on where they differ.
    static func same(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8), y = Array(b.utf8)
        guard x.count == y.count, !x.isEmpty else { return false }
        var difference: UInt8 = 0
        for i in 0..<x.count { difference |= x[i] ^ y[i] }
        return difference == 0
    }
}
