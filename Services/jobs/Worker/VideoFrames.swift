import Dispatch
import Foundation

/// A video's first frame as a JPEG thumbnail, by ffmpeg (from Debian; `scripts/install-deps.sh`
/// installs it), run as a process on the worker's blocking pool with a time limit.
enum VideoFrames {
    /// The ffmpeg binary (`FFMPEG`, default the one on `PATH`).
    static let ffmpeg = ProcessInfo.processInfo.environment["FFMPEG"] ?? "ffmpeg"

    /// Writes the first frame of `video` to `output`, centre-cropped to `size` x `size` as every
    /// thumbnail is.
    static func thumbnail(of video: URL, to output: URL, size: Int, timeout: TimeInterval = 30) async throws {
        do {
            try await BlockingPool.shared.run {
                let process = Process()
                process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
                process.arguments = [
                    ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error", "-y", "-i", video.path, "-frames:v", "1",
                    "-vf", "scale=\(size):\(size):force_original_aspect_ratio=increase,crop=\(size):\(size)", "-q:v", "4", output.path,
                ]
                let errors = Pipe()
                process.standardOutput = FileHandle.nullDevice
                process.standardError = errors
                let exited = DispatchSemaphore(value: 0)
                process.terminationHandler = { _ in exited.signal() }
                try process.run()
                if exited.wait(timeout: .now() + timeout) == .timedOut {
                    process.terminate()
                    process.waitUntilExit()
                    throw EffectError("ffmpeg took over \(Int(timeout)) s for the video's first frame", retryable: false)
                }
                let message = String(decoding: errors.fileHandleForReading.readDataToEndOfFile().prefix(300), as: UTF8.self)
                guard process.terminationStatus == 0, FileManager.default.fileExists(atPath: output.path) else {
                    throw EffectError("the video's first frame could not be read: \(message.trimmingCharacters(in: .whitespacesAndNewlines))", retryable: false)
                }
            }
        } catch let overloaded as BlockingPool.Overloaded {
            throw EffectError("\(overloaded)", retryable: true)
        }
    }
}
