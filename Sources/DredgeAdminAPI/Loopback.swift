/// Address rules both ends share: which hosts are loopback (where plain HTTP is allowed), read
/// strictly, so no spelling that a resolver reads differently passes.
public enum HostAddress {
    /// The four bytes of a dotted-quad IPv4 address in its one canonical spelling: decimal,
    /// no leading zeros (`0127.0.0.1` is octal to some resolvers), nothing around it.
    public static func ipv4(_ text: String) -> [UInt8]? {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4 else { return nil }
        var bytes: [UInt8] = []
        for part in parts {
            guard (1...3).contains(part.count), part.allSatisfy({ $0.isASCII && $0.isNumber }), part == "0" || !part.hasPrefix("0"),
                let value = UInt8(part)
            else { return nil }
            bytes.append(value)
        }
        return bytes
    }

    /// Loopback: 127.0.0.0/8, `::1` (bracketed or not) and `localhost`.
    public static func isLoopback(_ host: String) -> Bool {
        let host = host.lowercased()
        if host == "localhost" || host == "::1" || host == "[::1]" { return true }
        return ipv4(host)?.first == 127
    }
}
