import DredgeDomain
import DredgeJSON
import DredgeWire

/// A tail batch's plaintext read as Protocol § 20 says, trusting nothing the agent sent: one
/// JSON object with `contexts` (each a JSON object, named by a context number) and `records`
/// (each a record of § 13, read by ``RecordLine``: a `ts`, a level, a type), at most
/// MAX_TAIL_BATCH_RECORDS; every record of the tail's user, naming a context the batch holds.
/// What comes out are each record's and context's bytes as the agent wrote them, to keep and
/// to index as a pull's lines are.
struct TailBatchReader {
    struct Batch: Equatable {
        /// Each record's JSON object, as sent.
        var records: [[UInt8]]
        /// Each context's JSON object, as sent, by number.
        var contexts: [Int64: [UInt8]]
        /// Each record's time (µs), in record order.
        var times: [Int64]
    }

    struct Refusal: Error, CustomStringConvertible, Equatable {
        let description: String
    }

    static func read(_ plaintext: [UInt8], uid: String) throws(Refusal) -> Batch {
        let result: Result<Batch, Refusal> = plaintext.withUnsafeBufferPointer { bytes in
            var json = JSONScanner(bytes)
            json.space()
            var batch = Batch(records: [], contexts: [:], times: [])
            var named: [Int64] = []
            var seen = (records: false, contexts: false)
            var problem: String?
            let limit = RecordLine.maxDepth + 2
            let whole = json.members { json, key in
                let name = bytes[key.range]
                let isContexts = !key.escaped && name.elementsEqual("contexts".utf8)
                let isRecords = !key.escaped && name.elementsEqual("records".utf8)
                if isContexts && seen.contexts || isRecords && seen.records {
                    problem = "a member is given twice"
                    return false
                }
                if isContexts {
                    seen.contexts = true
                    return json.members { json, number in
                        let start = json.i
                        let text = String(decoding: bytes[number.range], as: UTF8.self)
                        guard !number.escaped, let id = Int64(text), id >= 0, String(id) == text, batch.contexts[id] == nil,
                            json.at(UInt8(ascii: "{")), json.skip(depth: 2, limit: limit)
                        else {
                            problem = problem ?? "a context is not a JSON object named once by its number (no sign, no leading zero)"
                            return false
                        }
                        batch.contexts[id] = Array(bytes[start..<json.i])
                        return true
                    }
                }
                if isRecords {
                    seen.records = true
                    guard json.at(UInt8(ascii: "[")) else { return false }
                    json.i += 1
                    json.space()
                    if json.at(UInt8(ascii: "]")) {
                        json.i += 1
                        return true
                    }
                    while true {
                        let start = json.i
                        guard json.skip(depth: 2, limit: limit) else { return false }
                        let element = UnsafeBufferPointer(rebasing: bytes[start..<json.i])
                        guard batch.records.count < WireLimits.maxTailBatchRecords else {
                            problem = "more than \(WireLimits.maxTailBatchRecords) records"
                            return false
                        }
                        guard let record = RecordLine.parse(element) else {
                            problem = "record \(batch.records.count + 1) is not a record (§ 13)"
                            return false
                        }
                        guard record.holds(uid: Array(uid.utf8), in: element) else {
                            problem = "record \(batch.records.count + 1) is not the tail's user's"
                            return false
                        }
                        guard let context = record.context else {
                            problem = "record \(batch.records.count + 1) names no context"
                            return false
                        }
                        named.append(context)
                        batch.records.append(Array(element))
                        batch.times.append(record.ts)
                        guard let next = json.more(UInt8(ascii: "]")) else { return false }
                        if !next { return true }
                    }
                }
                return json.skip(depth: 1, limit: limit)
            }
            guard whole, json.atEnd() else { return .failure(Refusal(description: problem ?? "the batch is not one JSON object")) }
            guard seen.records, seen.contexts else { return .failure(Refusal(description: "the batch lacks its records or its contexts")) }
            if let missing = named.first(where: { batch.contexts[$0] == nil }) {
                return .failure(Refusal(description: "a record names context \(missing), which the batch does not hold"))
            }
            return .success(batch)
        }
        return try result.get()
    }
}
