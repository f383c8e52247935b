import Blobs
import Foundation

/// The RADOS Gateway the test scripts started (`scripts/with-s3.sh`, which `make test` uses):
/// its settings come in `PHOTOEDIT_TEST_S3_ENV`, the `s3.env` file `scripts/s3-server.sh` wrote.
enum TestS3 {
    struct Missing: Error, CustomStringConvertible {
        var description: String { "no test S3 server: run the tests through `make test` or `scripts/with-s3.sh swift test ...`" }
    }

    /// The variables of the running test server.
    static func environment() throws -> [String: String] {
        guard let path = ProcessInfo.processInfo.environment["PHOTOEDIT_TEST_S3_ENV"],
              let text = try? String(contentsOfFile: path, encoding: .utf8) else { throw Missing() }
        var values: [String: String] = [:]
        for line in text.split(separator: "\n") {
            let assignment = line.hasPrefix("export ") ? line.dropFirst(7) : line[...]
            guard let equals = assignment.firstIndex(of: "=") else { continue }
            values[String(assignment[..<equals])] = String(assignment[assignment.index(after: equals)...])
        }
        return values
    }

    static func configuration() throws -> S3BlobStore.Configuration {
        guard case .s3(let configuration) = try BlobStoreConfiguration(environment: environment()).store else { throw Missing() }
        return configuration
    }

    static func store() async throws -> S3BlobStore {
        try await S3BlobStore.open(configuration())
    }
}
