import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation
import Logging
import Synchronization

/// What enrolling a key comes to: the agent's id and the server's keys, or why not.
enum EnrollmentOutcome {
    case enrolled(WireEnrollResponse)
    case refused(String)
    /// The server's own fault (its database): the agent may try again later.
    case unavailable(String)
    /// Too many refused enrollments from this address lately: not even looked at.
    case throttled(String)
}

/// Refused enrollments per source address (#49: 500 wrong tokens from one client were each
/// checked and each logged). An address with ``perMinute`` refusals in the current minute has
/// its further enrollments refused unseen until the minute ends, right token or not; other
/// addresses are not affected, and enrollments that succeed never count. At most
/// ``maxAddresses`` are remembered (a flood from many addresses forgets the oldest window).
final class EnrollmentThrottle: Sendable {
    typealias Clock = @Sendable () -> ContinuousClock.Instant
    static let maxAddresses = 10_000

    private struct State {
        var now: Clock
        var windows: [String: (start: ContinuousClock.Instant, refused: Int)] = [:]
        var throttled = 0
    }

    let perMinute: Int
    private let state: Mutex<State>

    init(perMinute: Int = 10, now: @escaping Clock = { ContinuousClock.now }) {
        self.perMinute = perMinute
        state = Mutex(State(now: now))
    }

    /// Replaces the clock (tests hold time still).
    func useClock(_ clock: @escaping Clock) { state.withLock { $0.now = clock } }

    /// Whether an enrollment from `address` is refused unseen; counted when it is.
    func isThrottled(_ address: String) -> Bool {
        state.withLock { s in
            guard let window = s.windows[address] else { return false }
            if s.now() - window.start >= .seconds(60) {
                s.windows[address] = nil
                return false
            }
            guard window.refused >= perMinute else { return false }
            s.throttled += 1
            return true
        }
    }

    /// An enrollment from `address` was refused.
    func refused(_ address: String) {
        state.withLock { s in
            let now = s.now()
            if let window = s.windows[address], now - window.start < .seconds(60) {
                s.windows[address] = (window.start, window.refused + 1)
                return
            }
            if s.windows.count >= Self.maxAddresses, let oldest = s.windows.min(by: { $0.value.start < $1.value.start })?.key {
                s.windows[oldest] = nil
            }
            s.windows[address] = (now, 1)
        }
    }

    var throttledCount: Int { state.withLock { $0.throttled } }
}

extension ConnectionServices {
    /// Enrolls a new agent's key over the wire: the enrollment token checked, the key parsed and
    /// recorded, and the server's keys sent back. Refusals are logged with their source, rate
    /// limited (anyone who can reach the port can cause them).
    func enroll(_ request: WireEnrollRequest, remote: String?, address: String) async -> EnrollmentOutcome {
        if enrollmentThrottle.isThrottled(address) {
            refusals.log { suppressed in
                logger.notice("enrollment refused: too many refused from this address", metadata: ["remote": "\(remote ?? "?")", "suppressed": "\(suppressed)"])
            }
            return .throttled("too many refused enrollments from \(address); try again in a minute")
        }
        let outcome = await enrollChecked(request, remote: remote)
        if case .refused = outcome { enrollmentThrottle.refused(address) }
        return outcome
    }

    private func enrollChecked(_ request: WireEnrollRequest, remote: String?) async -> EnrollmentOutcome {
        let accepted: Bool
        do {
            accepted = try await tokens.acceptsEnrollment(request.token)
        } catch {
            logger.error("cannot read the enrollment tokens; refusing enrollment", metadata: ["remote": "\(remote ?? "?")", "error": "\(error)"])
            return .unavailable("the server cannot check enrollment tokens now; try later")
        }
        guard accepted else {
            refusals.log { suppressed in
                logger.notice("enrollment refused: bad token", metadata: ["remote": "\(remote ?? "?")", "suppressed": "\(suppressed)"])
            }
            return .refused("enrollment token not accepted")
        }
        let key: RSAPublicKey
        do {
            key = try RSAPublicKey(spki: request.publicKey)
        } catch {
            refusals.log { suppressed in
                logger.notice("enrollment refused: bad key", metadata: ["remote": "\(remote ?? "?")", "suppressed": "\(suppressed)"])
            }
            return .refused("public key not accepted: \(error)")
        }
        let id: String
        do {
            id = try await registry.enroll(publicKey: key, host: request.host, now: Date())
        } catch let error as AlreadyEnrolled {
            refusals.log { suppressed in
                logger.notice("enrollment refused: key already enrolled", metadata: ["agent.id": "\(error.agentID)", "remote": "\(remote ?? "?")", "suppressed": "\(suppressed)"])
            }
            return .refused("\(error)")
        } catch {
            logger.error("cannot record an enrollment", metadata: ["remote": "\(remote ?? "?")", "error": "\(error)"])
            return .unavailable("the server cannot enroll agents now; try later")
        }
        logger.info("agent enrolled", metadata: ["agent.id": "\(id)", "host": "\(request.host.bounded.hostname)"])
        return .enrolled(.with {
            $0.agentID = id
            $0.serverSigningKey = Data(deployment.signingKey.verifyingKey.rawRepresentation)
            $0.serverEncryptionKey = Data(deployment.encryptionKey.publicKey.spki)
        })
    }
}
