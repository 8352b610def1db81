import Foundation

/// A count of bytes as people write it on a command line: `65536`, `64KiB`, `1.5MB`, `2GiB`
/// (k, M, G in powers of 1,000; Ki, Mi, Gi in powers of 1,024; a trailing `B` optional).
public enum ByteCount {
    /// The bytes `text` says, or nil when it is not a count of bytes.
    public static func parse(_ text: String) -> UInt64? {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        var number = Substring(trimmed)
        var unit = ""
        while let last = number.last, last.isLetter {
            unit = String(last) + unit
            number = number.dropLast()
        }
        guard !number.isEmpty, number.allSatisfy({ $0.isASCII && ($0.isNumber || $0 == ".") }), number.filter({ $0 == "." }).count <= 1,
            let value = Double(number), value.isFinite, value >= 0
        else { return nil }
        let multipliers: [String: Double] = [
            "": 1, "B": 1, "k": 1e3, "K": 1e3, "kB": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9,
            "Ki": 1024, "KiB": 1024, "Mi": 1_048_576, "MiB": 1_048_576, "Gi": 1_073_741_824, "GiB": 1_073_741_824,
        ]
        guard let multiplier = multipliers[unit] else { return nil }
        let bytes = (value * multiplier).rounded()
        guard bytes < 1.8e19, unit != "" || !number.contains(".") else { return nil }
        return UInt64(bytes)
    }
}
