import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation
import NIOCore

/// An agent's live tails on its connection (#53): sending each open tail of a uid it holds that
/// was not sent on this connection yet (all of them on a new connection: Protocol § 20,
/// *Redelivery*), on the delivery passes that read (``DeliveryRunner``).
extension ConnectionServices {
    /// Sends `agentID` the tails due to it not sent on this connection. Each part is claimed
    /// (with its own key the first time) before its command is written; a tail whose command can
    /// never be made for this agent (its key does not unwrap, the agent's keys retired) has the
    /// agent's part ended with why. Returns false when the connection is gone.
    func deliverTails(to agentID: String, on connection: ConnectionTails, token: Int, outbound: ConnectionOutbound, keyGeneration: Int) async -> Bool {
        let registry = connection.registry
        let due: [DueTail]
        do {
            let uids = try await self.registry.uids(of: agentID)
            due = try await registry.due(for: agentID, uids: uids, now: .now).filter { !connection.wasSent($0.tail.id) }
        } catch {
            logger.error("cannot read an agent's tails; trying again on the next wake", metadata: ["agent.id": "\(agentID)", "error": "\(error)"])
            return true
        }
        guard !due.isEmpty else { return true }
        let agentKey: RSAPublicKey
        do {
            guard let key = try await self.registry.publicKey(of: agentID) else { return true }
            agentKey = key
        } catch {
            logger.error("cannot read an agent's key; its tails go on the next wake", metadata: ["agent.id": "\(agentID)", "error": "\(error)"])
            return true
        }
        for tail in due {
            guard agentConnections.isLive(agentID, token: token) else { return false }
            let id = tail.tail.id
            let command: WireTailCommand
            do {
                var offered = tail.wrappedKey ?? []
                if offered.isEmpty { offered = try await work.control.runIfActive { [issuer] in try issuer.newTailKey() } }
                guard let key = try await registry.deliver(id, agent: agentID, wrappedKey: offered, at: Date()) else { continue }
                command = try await work.control.runIfActive { [issuer] in
                    try issuer.tailCommand(
                        tail.tail, agent: agentID, agentKey: agentKey, wrappedKey: key, keyGeneration: keyGeneration,
                        urgentAgreed: outbound.agreement.capabilities.contains(WireCapability.urgent))
                }
            } catch let never as UnreadablePull {
                logger.error("tail cannot be sent to the agent; ending its part", metadata: ["tail.id": "\(id)", "agent.id": "\(agentID)", "error": "\(never)"])
                do {
                    _ = try await registry.endPart(id, agent: agentID, status: .ended, detail: "the server could not make its command: \(never)", at: Date())
                } catch {
                    logger.error("cannot record the end of an agent's part of a tail", metadata: ["tail.id": "\(id)", "agent.id": "\(agentID)", "error": "\(error)"])
                }
                continue
            } catch {
                logger.error("cannot make a tail's command now; trying again on the next wake", metadata: ["tail.id": "\(id)", "agent.id": "\(agentID)", "error": "\(error)"])
                continue
            }
            connection.markSent(id)
            do {
                guard let written = outbound.send([.with { $0.tailCommand = command }]) else { throw ChannelError.ioOnClosedChannel }
                try await written.get()
            } catch {
                // Delivered and not sent: it goes again on the agent's next connection.
                return false
            }
            logger.info("tail delivered", metadata: ["tail.id": "\(id)", "agent.id": "\(agentID)"])
        }
        return true
    }
}
