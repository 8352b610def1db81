// A child process for the crash tests: logs N records through the public API, calls flush(),
// reports "flushed N" on stdout, then keeps logging until it is killed.
import DredgeDomain
import DredgeLogging
import DredgeStore
import Foundation

let arguments = CommandLine.arguments
guard arguments.count == 3, let count = Int(arguments[2]) else {
    FileHandle.standardError.write("usage: store-crash-child STORE COUNT\n".data(using: .utf8)!)
    exit(2)
}
do {
    let center = try LogCenter(path: arguments[1], context: .current(app: "crash-child"))
    center.setUser("crash-user")
    let log = center.logger(type: .business)
    for i in 0..<count {
        log.info("durable \(i)", metadata: ["i": i])
    }
    try center.flush()
    FileHandle.standardOutput.write(Data("flushed \(count)\n".utf8))
    var i = 0
    while true {
        log.debug("after flush \(i)")
        i += 1
        if i % 1_000 == 0 { usleep(100) }
    }
} catch {
    FileHandle.standardError.write("crash-child: \(error)\n".data(using: .utf8)!)
    exit(1)
}
