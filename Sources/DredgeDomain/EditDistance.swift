/// Levenshtein distance, by characters: how a misspelling is matched to what it meant (a
/// mistyped command or flag, a `server.json` key).
public func editDistance(_ a: String, _ b: String) -> Int {
    let x = Array(a)
    let y = Array(b)
    if x.isEmpty { return y.count }
    if y.isEmpty { return x.count }
    var row: [Int] = Array(0...y.count)
    for i in 0..<x.count {
        var diagonal = row[0]
        row[0] = i + 1
        for j in 0..<y.count {
            let above = row[j + 1]
            let substitution = diagonal + (x[i] == y[j] ? 0 : 1)
            row[j + 1] = Swift.min(above + 1, row[j] + 1, substitution)
            diagonal = above
        }
    }
    return row[y.count]
}
