// A child process for the crash tests: logs N records through the public API, calls flush(),
// reports "flushed N" on stdout, then keeps logging until it is killed.
import DredgeDomain
import DredgeLogging
import DredgeStore
import Foundation

let arguments = CommandLine.arguments

/// This process's resident memory, bytes.
func residentBytes() -> Int {
    let statm = (try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8)) ?? "0 0"
    return (Int(statm.split(separator: " ")[1]) ?? 0) * Int(sysconf(Int32(_SC_PAGESIZE)))
}

// `stream STORE`: reads every record of STORE one at a time and prints
// "RECORDS BYTES GROWTH", GROWTH the most resident memory grew meanwhile: measured in a
// process of its own, so no other test's allocations count.
if arguments.count == 3, arguments[1] == "stream" {
    do {
        var configuration = StoreConfiguration()
        configuration.readOnly = true
        let store = try LogStore(path: arguments[2], configuration: configuration)
        var count = 0, bytes = 0
        let before = residentBytes()
        var peak = before
        try store.forEachRecord(matching: .all) { record in
            count += 1
            bytes += record.message.utf8.count
            if count % 10_000 == 0 { peak = max(peak, residentBytes()) }
        }
        print("\(count) \(bytes) \(peak - before)")
        exit(0)
    } catch {
        FileHandle.standardError.write("crash-child: \(error)\n".data(using: .utf8)!)
        exit(1)
    }
}

// `rewind-loop STORE`: logs debug records "loop I" into a 64 KiB rewind buffer as fast as it
// can, saying "ready" after the first thousand, until it is killed (mid-append, most likely).
if arguments.count == 3, arguments[1] == "rewind-loop" {
    do {
        let center = try LogCenter(path: arguments[2], context: .current(app: "crash-child"), rewind: RewindConfiguration(bytes: 64 * 1024))
        let log = center.logger(minimumLevel: .info)
        var i = 0
        while true {
            log.debug("loop \(i)", metadata: ["pad": String(repeating: "p", count: i % 97)])
            i += 1
            if i == 1_000 { FileHandle.standardOutput.write(Data("ready\n".utf8)) }
        }
    } catch {
        FileHandle.standardError.write("crash-child: \(error)\n".data(using: .utf8)!)
        exit(1)
    }
}

// `rewind STORE N END`: a run that keeps a rewind buffer (#54): logs N info records ("stored
// I", stored) and N debug ones ("rewound I", below its level: into the buffer), flushes, says
// "ready", then ends as END says: `kill` waits to be killed, `segv` writes through a null
// pointer (a real SIGSEGV), `clean` closes its center and exits.
if arguments.count == 5, arguments[1] == "rewind", let count = Int(arguments[3]) {
    do {
        let center = try LogCenter(path: arguments[2], context: .current(app: "crash-child", appVersion: "3.1"), rewind: RewindConfiguration(bytes: 1 << 20))
        center.setUser("crash-user")
        let log = center.logger(type: .business, minimumLevel: .info)
        for i in 0..<count {
            log.info("stored \(i)")
            log.debug("rewound \(i)", metadata: ["i": i])
        }
        try center.flush()
        FileHandle.standardOutput.write(Data("ready\n".utf8))
        switch arguments[4] {
        case "segv":
            UnsafeMutablePointer<Int>(bitPattern: 16)!.pointee = 1
        case "clean":
            try center.close()
            exit(0)
        default:
            while true { sleep(1) }
        }
    } catch {
        FileHandle.standardError.write("crash-child: \(error)\n".data(using: .utf8)!)
        exit(1)
    }
}

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
