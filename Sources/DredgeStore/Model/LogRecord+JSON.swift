extension LogRecord {
    /// Appends the record as one JSON object, the line format of exports and
    /// `dredge-agent query --format jsonl`:
    /// `{"ts":"2026-11-21T09:30:00.000042Z","level":"info","type":"network","uid":"42","message":"…","metadata":{…},"context":1}`.
    /// `metadata` is copied verbatim from the store (already canonical JSON).
    public func writeJSON(into w: inout JSONWriter) {
        w.writeRaw(#"{"ts":"#)
        w.writeString(timestamp.rfc3339)
        w.writeRaw(#","level":"#)
        w.writeString(level.name)
        w.writeRaw(#","type":"#)
        w.writeString(type.rawValue)
        w.writeRaw(#","uid":"#)
        w.writeString(uid)
        w.writeRaw(#","message":"#)
        w.writeString(message)
        w.writeRaw(#","metadata":"#)
        w.writeRaw(metadataJSON)
        w.writeRaw(#","context":"#)
        w.writeRaw(String(context.rawValue))
        w.writeRaw("}")
    }

    public var jsonLine: String {
        var w = JSONWriter()
        writeJSON(into: &w)
        return w.string
    }
}
