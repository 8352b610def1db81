import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation
import Logging

/// What enrolling a key comes to: the agent's id and the server's keys, or why not.
enum EnrollmentOutcome {
    case enrolled(WireEnrollResponse)
    case refused(String)
    /// The server's own fault (its database): the agent may try again later.
    case unavailable(String)
}

extension ConnectionServices {
    /// Enrolls a new agent's key over the wire: the enrollment token checked, the key parsed and
    /// recorded, and the server's keys sent back. Refusals are logged with their source, rate
    /// limited (anyone who can reach the port can cause them).
    func enroll(_ request: WireEnrollRequest, remote: String?) async -> EnrollmentOutcome {
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
