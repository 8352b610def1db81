import DredgeWire

/// Challenge–response authentication of an agent (README § Authentication).
public enum AgentAuthentication {
    public static func sign(challenge: [UInt8], agentID: String, with key: RSAPrivateKey) throws -> [UInt8] {
        try key.sign(SigningInput.auth(challenge: challenge, agentID: agentID))
    }

    /// True if `signature` is the holder of `publicKey` signing this challenge for the agent id
    /// that `publicKey` derives.
    public static func verify(signature: [UInt8], challenge: [UInt8], publicKey: RSAPublicKey) -> Bool {
        publicKey.isValidSignature(signature, for: SigningInput.auth(challenge: challenge, agentID: publicKey.agentID))
    }
}
