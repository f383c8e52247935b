import Blobs
import Foundation
import Histogram
import Testing

@testable import loadtest

/// The parts of `loadtest` whose mistakes a run would not show: threshold parsing and verdicts,
/// the mix file, the fixture images, the chaos windows and the history comparison. The whole
/// tool runs for real in `scripts/chaos-check.sh` (the end of `make test`).
@Suite("loadtest parts", .timeLimit(.minutes(5)))
struct LoadTestPartsTests {
    static func histogram(_ microseconds: [UInt64]) -> Histogram<UInt64> {
        var histogram = Recorder.newHistogram()
        for value in microseconds { _ = histogram.record(value) }
        return histogram
    }

    @Test func durationsTakeUnitsAsK6AndVegetaDo() throws {
        for (text, seconds) in [("30s", 30.0), ("2m", 120), ("1h30m", 5400), ("500ms", 0.5), ("1.5m", 90), ("30", 30), ("1m30s", 90), ("2H", 7200)] {
            #expect(DurationArgument(argument: text)?.seconds == seconds, "\(text)")
        }
        for bad in ["", "s", "30x", "-5", "5 m", "m5", "1..5s", "inf", "30sec"] {
            #expect(DurationArgument(argument: bad) == nil, "\(bad)")
        }
        // The command line takes them on every option of time, and still refuses a zero-length run.
        let command = try LoadTest.parse(["--duration", "30s", "--drain", "1m", "--settle", "2m", "--chaos-interval", "5s"])
        #expect(command.duration == 30 && command.drain == 60 && command.settle == 120 && command.chaosInterval == 5)
        #expect(throws: (any Error).self) { try LoadTest.parse(["--duration", "0s"]) }
        #expect(throws: (any Error).self) { try LoadTest.parse(["--duration", "30 seconds"]) }
    }

    @Test func thresholdsParseAsK6WritesThemAndRefuseNonsense() throws {
        let route = try Threshold("POST /api/v1/jobs p99<50ms")
        #expect(route.route == "POST /api/v1/jobs" && route.metric == "p99" && route.op == "<" && route.value == 50 && route.unit == "ms")
        let errors = try Threshold("errors<0.1%")
        #expect(errors.route == nil && errors.metric == "errors" && errors.unit == "%")
        #expect(try Threshold("GET /api/v1/users/me rate>=10").unit == "/s")
        #expect(try Threshold("p99.9 <= 2s").metric == "p99.9")
        for bad in ["p99<", "latency<5ms", "errors<5ms", "rate>5ms", "p50<5%", "POST /x p99 50ms"] {
            #expect(throws: UsageError.self, "\(bad)") { try Threshold(bad) }
        }
    }

    @Test func thresholdsJudgeTheFiguresOfTheirRoute() throws {
        // 100 requests: 98 at 10 ms, 2 at 900 ms; 1 error in 100.
        let latencies = Array(repeating: UInt64(10_000), count: 98) + [900_000, 900_000]
        let histograms = ["POST /api/v1/jobs": Self.histogram(latencies), "GET /api/v1/users/me": Self.histogram([1000])]
        let requests = ["POST /api/v1/jobs": 100, "GET /api/v1/users/me": 1]
        let errors = ["POST /api/v1/jobs": 1]
        func judge(_ text: String) throws -> Threshold.Result {
            try Threshold(text).evaluate(histograms: histograms, requests: requests, errors: errors, seconds: 10)
        }
        #expect(try judge("POST /api/v1/jobs p50<20ms").passed)
        #expect(try !judge("POST /api/v1/jobs p99<50ms").passed)
        #expect(try judge("POST /api/v1/jobs p99<1s").passed)
        #expect(try judge("GET /api/v1/users/me max<2ms").passed)
        #expect(try !judge("errors<0.5%").passed)  // 1 of 101
        #expect(try judge("errors<=1").passed)
        #expect(try judge("POST /api/v1/jobs rate>=10").passed)
        // A route with no requests passes no latency threshold.
        #expect(try !judge("DELETE /api/v1/history/{id} p99<1s").passed)
    }

    @Test func aMixFileReplacesWhatItNamesAndIsChecked() throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("mix-\(UUID()).json")
        defer { try? FileManager.default.removeItem(at: file) }
        try Data(#"{"effects": {"grayscale": 1}, "thinkTime": [0, 0.1]}"#.utf8).write(to: file)
        let mix = try Mix.load(file.path)
        #expect(mix.effects == ["grayscale": 1])
        #expect(mix.thinkTime == [0, 0.1])
        #expect(mix.profiles.map(\.name) == Mix().profiles.map(\.name))
        for bad in [#"{"thinkTime": [2, 1]}"#, #"{"images": ["huge"]}"#, #"{"flows": {"sse": 2}}"#, #"{"profiles": []}"#] {
            try Data(bad.utf8).write(to: file)
            #expect(throws: (any Error).self, "\(bad)") { try Mix.load(file.path) }
        }
    }

    @Test func theFixtureImagesAreRealPNGsOfTheirSizes() throws {
        for (name, bytes) in FixtureImages.make() {
            let size = try #require(ImageSize.read(bytes, contentType: "image/png"), "\(name)")
            #expect(size.width == FixtureImages.sizes[name]!.width && size.height == FixtureImages.sizes[name]!.height)
        }
        // The zlib stream's checksum and the chunks' CRCs are those of the standard.
        #expect(FixtureImages.crc32(Array("IEND".utf8)) == 0xAE42_6082)
        #expect(FixtureImages.zlibStored([]).suffix(4) == [0, 0, 0, 1])
    }

    @Test func chaosWindowsRunFromAKillToTenSecondsAfterItsRestart() {
        let windows = Chaos.windows(of: [
            Chaos.Event(at: 5, kind: "kill", process: "jobs", pid: 1),
            Chaos.Event(at: 6.1, kind: "restart", process: "jobs", pid: 2, downtime: 1.1),
            Chaos.Event(at: 20, kind: "kill", process: "gateway", pid: 3),
        ], runEnd: 30)
        #expect(windows == [5...16.1, 20...40])
    }

    @Test func historyMustListEachJobOnceAndNoDeletedOne() {
        var user = Ledger.User(credentials: GatewayClient.guest(), profile: "guest", plan: "free")
        user.accepted = ["a": Date(), "b": Date(), "c": Date()]
        user.deleted = ["c"]
        #expect(InvariantChecker.compare(user, listing: ["a", "b"], known: []).isEmpty)
        #expect(InvariantChecker.compare(user, listing: ["a", "b", "x"], known: ["x"]).isEmpty)
        #expect(InvariantChecker.compare(user, listing: ["a", "a", "b"], known: []).count == 1)
        #expect(InvariantChecker.compare(user, listing: ["a"], known: []).count == 1)
        #expect(InvariantChecker.compare(user, listing: ["a", "b", "c"], known: []).count == 1)
        #expect(InvariantChecker.compare(user, listing: ["a", "b", "y"], known: []).count == 1)
        #expect(InvariantChecker.compare(user, listing: nil, known: []).count == 1)
    }

    /// A delete that got no answer may have happened (its gateway killed after history committed
    /// it): its job may be listed once or not at all, but not twice.
    @Test func aJobWhoseDeleteGotNoAnswerMayBeListedOnceOrNotAtAll() {
        var user = Ledger.User(credentials: GatewayClient.guest(), profile: "guest", plan: "free")
        user.accepted = ["a": Date(), "b": Date()]
        user.mayBeDeleted = ["b"]
        #expect(user.gone("b") && !user.gone("a"))
        #expect(InvariantChecker.compare(user, listing: ["a", "b"], known: []).isEmpty)
        #expect(InvariantChecker.compare(user, listing: ["a"], known: []).isEmpty)
        #expect(InvariantChecker.compare(user, listing: ["a", "b", "b"], known: []).count == 1)
        #expect(InvariantChecker.compare(user, listing: ["b"], known: []).count == 1)
    }

    @Test func percentilesOfASecondAreNearestRank() {
        #expect(Recorder.percentile([], 99) == 0)
        #expect(Recorder.percentile([1000, 2000, 3000, 4000], 50) == 2)
        #expect(Recorder.percentile(Array(1...100).map { UInt64($0) * 1000 }, 99) == 99)
    }

    /// A fault from 10 s to 20 s of a 40 s run: 10 requests a second, half failing during it,
    /// two slow seconds after the heal, then the earlier rate again.
    @Test func faultFiguresSplitTheRunAtTheFaultAndTheHealAndFindTheRecovery() {
        var seconds: [Recorder.SecondOfRoute] = []
        for second in 0..<40 {
            let during = (10..<20).contains(second)
            let slow = (20..<22).contains(second)
            seconds.append(.init(second: second, count: slow ? 4 : 10, errors: during ? 5 : 0, p50Ms: 1, p99Ms: 2))
        }
        let figures = Fault.figures(name: "partition svc1", timeline: ["GET /x": seconds], faultAt: 10, healAt: 20, loadSeconds: 40)
        #expect(figures.requestsBefore == 100 && figures.requestsDuring == 100 && figures.requestsAfter == 20 * 10 - 12)
        #expect(figures.successBefore == 1 && figures.successDuring == 0.5 && figures.successAfter == 1)
        #expect(figures.recoverySeconds == 2)
        // A rate that never comes back is said so, not reported as a recovery.
        let never = seconds.map { second in Recorder.SecondOfRoute(second: second.second, count: second.second >= 10 ? 4 : 10, errors: 0, p50Ms: 1, p99Ms: 2) }
        #expect(Fault.figures(name: "crash", timeline: ["GET /x": never], faultAt: 10, healAt: 20, loadSeconds: 40).recoverySeconds == nil)
    }

    /// The fault's commands run in a shell, their status read back; a failing one fails the run.
    @Test func faultCommandsRunAndAFailingOneIsAnEventOfItsOwn() async throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("fault-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let recorder = Recorder(start: .now)
        let fault = Fault(name: "cut", command: "touch \(folder.path)/cut", healCommand: "exit 3", at: 0.1, length: 0.1, recovery: 5, recorder: recorder)
        await fault.run()
        #expect(FileManager.default.fileExists(atPath: folder.appendingPathComponent("cut").path))
        #expect(fault.events.map(\.kind) == ["fault", "heal-failed"] && !fault.succeeded)
        let window = try #require(fault.window(runEnd: 10))
        #expect(window.lowerBound == fault.events[0].at && window.upperBound == fault.events[1].at + 5)
        #expect(throws: (any Error).self) { try LoadTest.parse(["--fault-command", "true"]) }
        #expect(throws: (any Error).self) { try LoadTest.parse(["--duration", "20s", "--fault-command", "true", "--heal-command", "true", "--fault-at", "10s", "--fault-for", "10s"]) }
    }
}
