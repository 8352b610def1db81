#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Why a connection could not be made, in words a person acts on ("nothing listens on
/// HOST:PORT"), for every client of Dredge's servers (the agent's connector, the admin API's
/// client), from the socket's error number. Nil for an error it has no better words for.
public struct ConnectFailure: CustomStringConvertible, Sendable, Equatable {
    public let description: String

    public init?(errno code: Int32, address: String) {
        switch code {
        case ECONNREFUSED: description = "nothing listens on \(address) (connection refused): is the server running, and is this its port?"
        case ETIMEDOUT: description = "\(address) did not answer (timed out): is the address right, and does a firewall let it through?"
        case EHOSTUNREACH, ENETUNREACH: description = "\(address) cannot be reached from here (no route)"
        default: return nil
        }
    }
}
