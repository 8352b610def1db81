import DredgeDomain
import DredgeEnvelope
import DredgeWire
import Foundation

/// The server keys an agent pins, by generation (README § Key rotation): the current
/// generation's signing and encryption keys, and the signing keys of earlier generations,
/// still accepted on commands until they retire. A server that rotates its keys announces the
/// next generation in a heartbeat ack, signed by the current signing key; ``adopting(_:now:)``
/// checks the announcements and gives the keys the agent pins from then on.
public struct PinnedServerKeys: Sendable {
    /// The generation pinned; 1 when not known (``isGenerationKnown``).
    public let generation: Int
    /// False for a state written by an agent of an earlier release, which kept no generation:
    /// it may have enrolled after a rotation. It then says none (the server knows which it
    /// handed out) and takes the first announcement its key verifies as the next.
    public let isGenerationKnown: Bool
    public let signing: CommandVerifier
    public let encryption: RSAPublicKey
    /// Earlier generations' signing keys and when each retires (µs since the epoch).
    public let previous: [(generation: Int, signing: CommandVerifier, retiresAtUs: Int64)]

    public init(_ file: AgentState.File) throws {
        if let said = file.keyGeneration, !(1..<Int(UInt32.max)).contains(said) {
            throw AgentError("agent.json names key generation \(said), outside 1 to \(UInt32.max - 1): the file is damaged")
        }
        generation = file.keyGeneration ?? 1
        isGenerationKnown = file.keyGeneration != nil
        signing = try CommandVerifier(rawRepresentation: Hex.decode(file.serverSigningKey) ?? [])
        encryption = try RSAPublicKey(spki: Hex.decode(file.serverEncryptionKey) ?? [])
        previous = try (file.previousSigningKeys ?? []).map {
            ($0.generation, try CommandVerifier(rawRepresentation: Hex.decode($0.signingKey) ?? []), Timestamp($0.retiresAt).microseconds)
        }
    }

    private init(generation: Int, signing: CommandVerifier, encryption: RSAPublicKey, previous: [(generation: Int, signing: CommandVerifier, retiresAtUs: Int64)]) {
        self.generation = generation
        self.isGenerationKnown = true
        self.signing = signing
        self.encryption = encryption
        self.previous = previous
    }

    /// The keys a command may be signed with at `now`: the current one, then the earlier ones
    /// not retired yet.
    public func verifiers(at now: Timestamp) -> [CommandVerifier] {
        [signing] + previous.filter { now.microseconds < $0.retiresAtUs }.map(\.signing)
    }

    /// Why an announcement is not taken.
    public struct Refusal: Error, CustomStringConvertible, Sendable {
        public let description: String
    }

    /// The generation to say to the server: 0 ("not said") when it is not known.
    public var said: Int { isGenerationKnown ? generation : 0 }

    /// The keys after `announcements` (those of generations already pinned are skipped), each
    /// checked in turn: the next generation in order, signed by the signing key of the one
    /// before, keys of the §5 forms, times of the §5 range, and the one before not retired yet
    /// (an announcement signed by a retired key proves nothing). Throws on the first that
    /// fails, taking none of them. No earlier generation is accepted past the retirement the
    /// newest announcement gives the one before it. Earlier keys retired at `now` are dropped.
    public func adopting(_ announcements: [WireKeyAnnouncement], now: Timestamp) throws -> PinnedServerKeys {
        var keys = self
        var announcements = announcements[...]
        if !isGenerationKnown {
            // Of a state that kept no generation: the chain starts at the first announcement
            // its signing key verifies, whatever its number.
            guard let start = announcements.firstIndex(where: { keys.signing.isValid($0) && $0.generation >= 2 }) else {
                if announcements.isEmpty { return self }
                throw Refusal(description: "no announcement is signed by the key this agent pins")
            }
            announcements = announcements[start...]
            keys = PinnedServerKeys(generation: Int(announcements[start].generation) - 1, signing: signing, encryption: encryption, previous: previous)
        }
        for announcement in announcements where Int(announcement.generation) > keys.generation {
            let number = Int(announcement.generation)
            guard number == keys.generation + 1 else {
                throw Refusal(description: "announcement of generation \(number) while generation \(keys.generation + 1) is the next")
            }
            guard keys.signing.isValid(announcement) else {
                throw Refusal(description: "the announcement of generation \(number) is not signed by generation \(keys.generation)'s key")
            }
            guard Timestamp.acceptedRange.contains(announcement.issuedAtUs), Timestamp.acceptedRange.contains(announcement.previousRetiresAtUs) else {
                throw Refusal(description: "the announcement of generation \(number) has a time outside 1970–9999")
            }
            guard now.microseconds < announcement.previousRetiresAtUs else {
                throw Refusal(
                    description: "generation \(keys.generation) retired at \(Timestamp(microseconds: announcement.previousRetiresAtUs)): its announcement of the next is not taken")
            }
            let signing: CommandVerifier
            let encryption: RSAPublicKey
            do {
                signing = try CommandVerifier(rawRepresentation: announcement.signingKey)
                encryption = try RSAPublicKey(spki: announcement.encryptionKey)
            } catch {
                throw Refusal(description: "the announcement of generation \(number) carries a key of the wrong form: \(error)")
            }
            let retires = announcement.previousRetiresAtUs
            keys = PinnedServerKeys(
                generation: number, signing: signing, encryption: encryption,
                previous: keys.previous.map { ($0.generation, $0.signing, min($0.retiresAtUs, retires)) } + [(keys.generation, keys.signing, retires)])
        }
        return PinnedServerKeys(
            generation: keys.generation, signing: keys.signing, encryption: keys.encryption,
            previous: keys.previous.filter { now.microseconds < $0.retiresAtUs })
    }

    /// Writes these keys into the agent's file.
    public func write(into file: inout AgentState.File) {
        file.keyGeneration = generation
        file.serverSigningKey = Hex.encode(signing.rawRepresentation)
        file.serverEncryptionKey = Hex.encode(encryption.spki)
        file.previousSigningKeys =
            previous.isEmpty
            ? nil
            : previous.map {
                .init(generation: $0.generation, signingKey: Hex.encode($0.signing.rawRepresentation), retiresAt: Timestamp(microseconds: $0.retiresAtUs).date)
            }
    }
}
