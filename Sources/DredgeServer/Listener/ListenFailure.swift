import NIOCore
import ServiceLifecycle

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A listener that could not start, said as the operator can act on it: which listener, which
/// address, and why (the port taken, a privileged port, an address this host does not have).
enum ListenFailure {
    static func error(_ error: any Error, listener: String, host: String, port: Int) -> DeploymentError {
        let address = "\(host):\(port)"
        let why: String
        if let io = error as? IOError {
            switch io.errnoCode {
            case EADDRINUSE: why = "the port is in use (another dredge-server, or another program: `ss -ltnp 'sport = :\(port)'` names it)"
            case EACCES: why = "permission denied (ports below 1024 need privileges)"
            case EADDRNOTAVAIL: why = "this host has no address \(host)"
            default: why = "\(io)"
            }
        } else if error is SocketAddressError {
            why = "\(host) is not an address or a host name this host can resolve"
        } else {
            why = "\(error)"
        }
        return DeploymentError("cannot listen for \(listener) on \(address): \(why)")
    }
}

/// A listener's service whose failure to bind is said as ``ListenFailure`` says it (the admin
/// API's Hummingbird application throws the socket's error as it is).
struct ListeningService<Base: Service>: Service {
    let base: Base
    let listener: String
    let host: String
    let port: Int

    func run() async throws {
        do {
            try await base.run()
        } catch let error where error is IOError || error is SocketAddressError {
            throw ListenFailure.error(error, listener: listener, host: host, port: port)
        }
    }
}
