import DredgeTestSupport
import Foundation
import Testing

/// #52: who links what. An agent host needs none of the server's upload reception (ISA-L,
/// ZIPFoundation) nor the admin API's HTTP client. (The server links the client since #55: its
/// console's single sign-on talks to the identity provider with it.)
/// Checked on the built executables: `ldd` for shared libraries, `nm` for Swift modules linked
/// statically.
@Suite struct LinkedDependencyTests {
    func output(_ tool: String, _ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = [tool] + arguments
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = FileHandle.nullDevice
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        #expect(process.terminationStatus == 0, "\(tool) \(arguments)")
        return String(decoding: data, as: UTF8.self)
    }

    func links(_ executable: String) throws -> (libraries: String, symbols: String) {
        let path = builtProduct(executable)
        return (try output("ldd", [path]), try output("nm", [path]))
    }

    @Test func theAgentLinksNeitherUploadReceptionNorTheHTTPClient() throws {
        let agent = try links("dredge-agent")
        #expect(!agent.libraries.contains("libisal"))
        #expect(!agent.symbols.contains("ZIPFoundation"))
        #expect(!agent.symbols.contains("AsyncHTTPClient"))
        #expect(!agent.symbols.contains("DredgeReception"))
        // The check can fail: the server links all of these but the client.
        let server = try links("dredge-server")
        #expect(server.libraries.contains("libisal") && server.symbols.contains("ZIPFoundation") && server.symbols.contains("DredgeReception"))
        #expect(try links("dredge").symbols.contains("AsyncHTTPClient"))
    }
}
