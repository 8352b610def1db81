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
        /// Per address: when its minute began, and the enrollments counted in it (refused, and
        /// those still being checked, so that attempts at once cannot all pass the count).
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

    /// An enrollment from `address` begins: false when it is refused unseen (counted as
    /// throttled), else it is counted as refused until ``succeeded(_:)`` takes it back, so
    /// attempts made at once are counted before any is checked.
    func begin(_ address: String) -> Bool {
        state.withLock { s in
            let now = s.now()
            if let window = s.windows[address], now - window.start < .seconds(60) {
                guard window.refused < perMinute else {
                    s.throttled += 1
                    return false
                }
                s.windows[address] = (window.start, window.refused + 1)
                return true
            }
            if s.windows[address] == nil, s.windows.count >= Self.maxAddresses,
                let oldest = s.windows.min(by: { $0.value.start < $1.value.start })?.key
            {
                s.windows[oldest] = nil
            }
            s.windows[address] = (now, 1)
            return true
        }
    }

    /// The enrollment begun from `address` succeeded: it does not count.
    func succeeded(_ address: String) {
        state.withLock { s in
            if let window = s.windows[address], window.refused > 0 { s.windows[address] = (window.start, window.refused - 1) }
        }
    }

    /// Whether the next enrollment from `address` would be refused unseen (nothing counted).
    func isThrottled(_ address: String) -> Bool {
        state.withLock { s in
            guard let window = s.windows[address], s.now() - window.start < .seconds(60) else { return false }
            return window.refused >= perMinute
        }
    }

    /// Addresses whose minute is remembered.
    var addresses: Int { state.withLock { $0.windows.count } }

    var throttledCount: Int { state.withLock { $0.throttled } }
}

extension ConnectionServices {
    /// Enrolls a new agent's key over the wire: the enrollment token checked, the key parsed and
    /// recorded, and the server's keys sent back. Refusals are logged with their source, rate
    /// limited (anyone who can reach the port can cause them).
    func enroll(_ request: WireEnrollRequest, remote: String?, address: String) async -> EnrollmentOutcome {
        guard enrollmentThrottle.begin(address) else {
            metrics.refused(.enrollmentThrottled)
            refusals.log { suppressed in
                logger.notice("enrollment refused: too many refused from this address", metadata: ["remote": "\(remote ?? "?")", "suppressed": "\(suppressed)"])
            }
            return .throttled("too many refused enrollments from \(address); try again in a minute")
        }
        let outcome = await enrollChecked(request, remote: remote)
        switch outcome {
        case .refused: metrics.refused(.enrollment)  // counted by the throttle at the start
        case .enrolled, .unavailable, .throttled: enrollmentThrottle.succeeded(address)
        }
        return outcome
    }

    /// The key is read first (one that does not parse takes nothing); then a use of the token
    /// is taken (two enrollments cannot both take a token's last), and given back if recording
    /// the agent then fails.
    private func enrollChecked(_ request: WireEnrollRequest, remote: String?) async -> EnrollmentOutcome {
        let key: RSAPublicKey
        do {
            key = try RSAPublicKey(spki: request.publicKey)
        } catch {
            refusals.log { suppressed in
                logger.notice("enrollment refused: bad key", metadata: ["remote": "\(remote ?? "?")", "suppressed": "\(suppressed)"])
            }
            return .refused("public key not accepted: \(error)")
        }
        let use: EnrollmentTokenUse
        do {
            use = try await tokens.useEnrollment(request.token, now: Date())
        } catch {
            logger.error("cannot read the enrollment tokens; refusing enrollment", metadata: ["remote": "\(remote ?? "?")", "error": "\(error)"])
            return .unavailable("the server cannot check enrollment tokens now; try later")
        }
        switch use {
        case .accepted: break
        case .unknown:
            refusals.log { suppressed in
                logger.notice("enrollment refused: bad token", metadata: ["remote": "\(remote ?? "?")", "suppressed": "\(suppressed)"])
            }
            return .refused("enrollment token not accepted")
        case .expired(let name), .usedUp(let name):
            let why = if case .expired = use { "expired" } else { "used up" }
            refusals.log { suppressed in
                logger.notice("enrollment refused: token \(why)", metadata: ["token": "\(name)", "remote": "\(remote ?? "?")", "suppressed": "\(suppressed)"])
            }
            return .refused("enrollment token \(why); ask for a new one")
        }
        let outcome = await enroll(request, key: key, remote: remote)
        if case .enrolled = outcome { return outcome }
        do {
            try await tokens.returnEnrollmentUse(request.token)
        } catch {
            // The database failed while recording the agent too, most likely: the use stays taken.
            logger.error("could not give back an enrollment token's use", metadata: ["error": "\(error)"])
        }
        return outcome
    }

    /// The enrollment after its key was read and its token accepted: the agent recorded.
    private func enroll(_ request: WireEnrollRequest, key: RSAPublicKey, remote: String?) async -> EnrollmentOutcome {
        let id: String
        // A rotation made by the command or another node counts at once: the agent pins the
        // newest keys.
        do { try deployment.keys.reloadIfChanged() } catch { logger.error("cannot read the key ring again; enrolling with the keys read before", metadata: ["error": "\(error)"]) }
        let keys = deployment.keys.current
        do {
            id = try await registry.enroll(publicKey: key, host: request.host, keyGeneration: keys.number, now: Date())
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
            $0.serverSigningKey = Data(keys.signingKey.verifyingKey.rawRepresentation)
            $0.serverEncryptionKey = Data(keys.encryptionKey.publicKey.spki)
            $0.keyGeneration = UInt32(keys.number)
        })
    }
}
