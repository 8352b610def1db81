import DredgeDomain

extension Timestamp {
    /// Appends the RFC 3339 form to `w` without making a string (an export writes one per record).
    @inlinable
    public func writeRFC3339(into w: inout JSONWriter) {
        withRFC3339Bytes { w.writeRawBytes($0) }
    }
}
