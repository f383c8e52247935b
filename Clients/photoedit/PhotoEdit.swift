import ArgumentParser
import Crypto
import Foundation
import Messages
import PhotoEditKit

/// `photoedit`: the system by hand, on PhotoEditKit. Works against `make run` with no flags: the
/// gateway defaults to http://127.0.0.1:8080 and the caller to a guest whose device id is kept in
/// `~/.config/photoedit/device-id`.
///
/// Exit codes: 0 done; 64 usage; 69 the gateway cannot be reached; 70 the server failed;
/// 75 the quota is used up (try again when it resets); 77 not signed in or not allowed;
/// 1 anything else the gateway refused (not found, bad input).
@main
struct PhotoEdit: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "photoedit",
        abstract: "Edit photos through the photoedit gateway.",
        subcommands: [MeCommand.self, EffectsCommand.self, EditCommand.self, HistoryCommand.self, DeleteCommand.self, ShareCommand.self, RerunCommand.self, KeysCommand.self]
    )
}

/// Where the gateway is and who is calling.
struct Connection: ParsableArguments {
    @Option(help: "The gateway's URL (or PHOTOEDIT_GATEWAY).")
    var gateway: String = ProcessInfo.processInfo.environment["PHOTOEDIT_GATEWAY"] ?? "http://127.0.0.1:8080"

    @Option(help: "A bearer token (JWT) to call with.")
    var token: String?

    @Option(help: "Call as the guest with this device UUID.")
    var deviceId: String?

    @Option(help: "Call as this user id, with a token signed by --jwt-secret (development).")
    var user: String?

    @Option(help: "The gateway's JWT_SECRET, for --user (default: JWT_SECRET, else make run's development secret).")
    var jwtSecret: String = ProcessInfo.processInfo.environment["JWT_SECRET"] ?? "development-jwt-secret-not-for-production-use"

    func client() throws -> PhotoEditClient {
        guard let url = URL(string: gateway), url.scheme != nil else { throw ValidationError("--gateway must be a URL") }
        return PhotoEditClient(baseURL: url, identity: try identity())
    }

    func identity() throws -> PhotoEditClient.Identity {
        if let token { return .token({ token }) }
        if let deviceId {
            guard let uuid = UUID(uuidString: deviceId) else { throw ValidationError("--device-id must be a UUID") }
            return .guest(deviceId: uuid)
        }
        if let user {
            let signed = DevelopmentToken.sign(sub: user, secret: jwtSecret)
            return .token({ signed })
        }
        return .guest(deviceId: try Self.savedDeviceId())
    }

    /// This machine's guest: a device id made once and kept.
    static func savedDeviceId() throws -> UUID {
        let folder = FileManager.default.homeDirectoryForCurrentUser.appendingPathComponent(".config/photoedit")
        let file = folder.appendingPathComponent("device-id")
        if let text = try? String(contentsOf: file, encoding: .utf8), let uuid = UUID(uuidString: text.trimmingCharacters(in: .whitespacesAndNewlines)) {
            return uuid
        }
        let uuid = UUID()
        try? FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        try? uuid.uuidString.write(to: file, atomically: true, encoding: .utf8)
        return uuid
    }
}

/// An HS256 token for a user id, valid for an hour: what `make run`'s development secret allows.
enum DevelopmentToken {
    static func sign(sub: String, secret: String) -> String {
        let header = Base64URL.encode(Data(#"{"alg":"HS256","typ":"JWT"}"#.utf8))
        let claims = try! JSONSerialization.data(withJSONObject: ["sub": sub, "exp": Int(Date().timeIntervalSince1970) + 3600])
        let input = header + "." + Base64URL.encode(claims)
        let mac = HMAC<SHA256>.authenticationCode(for: Data(input.utf8), using: SymmetricKey(data: Data(secret.utf8)))
        return input + "." + Base64URL.encode(Data(mac))
    }
}

/// Runs a command's work: a failure prints one line and exits with its code.
func run(_ work: () async throws -> Void) async throws {
    do {
        try await work()
    } catch let error as PhotoEditError {
        FileHandle.standardError.write(Data("photoedit: \(error)\n".utf8))
        let code: Int32 = switch error {
        case .offline: 69
        case .server: 70
        case .quotaExceeded: 75
        case .unauthorized: 77
        case .notFound, .badRequest: 1
        }
        throw ExitCode(code)
    }
}

struct MeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "me", abstract: "Who you are and the edits you have left.")
    @OptionGroup var connection: Connection

    func run() async throws {
        let client = try connection.client()
        try await photoedit.run {
            let me = try await client.me()
            print("\(me.id)\(me.isGuest ? " (guest)" : "")  plan: \(me.plan)\(me.planEndsAt.map { " until \($0.formatted(.iso8601))" } ?? "")")
            print(me.quotaBadge ?? "PRO: no limit to show")
            let q = me.quota
            print("today: \(q.dailyUsed) used\(q.dailyLimit.map { " of \($0)" } ?? ""), resets \(q.dailyResetsAt.formatted(.iso8601))")
            print("this month: \(q.monthlyUsed) used\(q.monthlyLimit.map { " of \($0)" } ?? "")")
        }
    }
}

struct EffectsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "effects", abstract: "The effects you can apply.")
    @OptionGroup var connection: Connection

    func run() async throws {
        let client = try connection.client()
        try await photoedit.run {
            for effect in try await client.effects() {
                let parameters = effect.parameters.map { "\($0.name)=\($0.minimum)…\($0.maximum) (default \($0.defaultValue))" }
                let price = "\(effect.credits) credit\(effect.credits == 1 ? "" : "s")\(effect.kind == "video" ? ", video" : "")"
                print("\(effect.id)  \(effect.title)  (\(price))\(parameters.isEmpty ? "" : "  " + parameters.joined(separator: ", "))")
            }
        }
    }
}

struct EditCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "edit", abstract: "Upload a photo and edit it.")
    @OptionGroup var connection: Connection
    @Argument(help: "The photo (JPEG, PNG, WebP or HEIC).") var photo: String
    @Option(help: "The effect (see `photoedit effects`).") var effect: String = "auto-enhance"
    @Option(name: .customLong("param"), help: "A parameter, name=value (repeatable).") var params: [String] = []
    @Option(help: "A prompt for AI effects.") var prompt: String?
    @Flag(help: "Wait for the result and save it (and its thumbnail) beside the photo.") var wait = false

    func validate() throws {
        for param in params where param.split(separator: "=").count != 2 || Double(param.split(separator: "=")[1]) == nil {
            throw ValidationError("--param takes name=number, not '\(param)'")
        }
    }

    func run() async throws {
        let client = try connection.client()
        let photoURL = URL(fileURLWithPath: photo)
        let data: Data
        do { data = try Data(contentsOf: photoURL) } catch { throw ValidationError("cannot read \(photo)") }
        let parameters = Dictionary(params.map { param -> (String, Double) in
            let parts = param.split(separator: "=")
            return (String(parts[0]), Double(parts[1])!)
        }, uniquingKeysWith: { _, last in last })
        try await photoedit.run {
            let key = try await client.upload(data, filename: photoURL.lastPathComponent)
            let ticket = try await client.createJob(imageKey: key, effect: effect, parameters: parameters, prompt: prompt)
            print("job \(ticket.jobId) \(ticket.status)")
            guard wait else { return }
            var last: JobUpdate?
            for try await update in client.updates(of: ticket.jobId) {
                Progress.draw(update)
                last = update
            }
            Progress.end()
            guard let done = last, done.status == "completed", let result = done.resultUrl else {
                FileHandle.standardError.write(Data("photoedit: the job \(last?.status ?? "ended")\(last?.error.map { ": \($0)" } ?? "")\n".utf8))
                throw ExitCode(1)
            }
            let base = photoURL.deletingPathExtension()
            let resultBytes = try await client.download(result)
            let resultFile = base.appendingPathExtension("\(effect).\(Self.fileExtension(of: resultBytes))")
            try? resultBytes.write(to: resultFile)
            print("result: \(resultFile.path)")
            if let thumbnail = done.thumbnailUrl {
                let thumbnailFile = base.appendingPathExtension("\(effect).thumb.jpg")
                try? (try await client.download(thumbnail)).write(to: thumbnailFile)
                print("thumbnail: \(thumbnailFile.path)")
            }
        }
    }

    static func fileExtension(of data: Data) -> String {
        let bytes = [UInt8](data.prefix(4))
        if bytes.starts(with: [0x89, 0x50, 0x4E, 0x47]) { return "png" }
        if bytes.starts(with: Array("RIFF".utf8)) { return "webp" }
        if data.count >= 8, Array(data.prefix(8).suffix(4)) == Array("ftyp".utf8) { return "mp4" }
        return "jpg"
    }
}

/// A progress bar on a terminal, a line per change otherwise.
enum Progress {
    static let isTerminal = isatty(STDERR_FILENO) == 1

    static func draw(_ update: JobUpdate) {
        let width = 30
        let filled = Int((update.progress * Double(width)).rounded())
        let bar = String(repeating: "█", count: filled) + String(repeating: "░", count: width - filled)
        let line = "\(bar) \(Int(update.progress * 100))% \(update.status)"
        FileHandle.standardError.write(Data((isTerminal ? "\r\(line)" : "\(line)\n").utf8))
    }

    static func end() {
        if isTerminal { FileHandle.standardError.write(Data("\n".utf8)) }
    }
}

struct HistoryCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "history", abstract: "Your past edits, newest first.")
    @OptionGroup var connection: Connection
    @Option(help: "Only edits whose prompt or effect contains this.") var search: String?
    @Option(help: "Only these statuses (completed, processing, failed, cancelled; comma-separated).") var status: String?
    @Flag(help: "Grouped by month.") var byMonth = false

    func run() async throws {
        let client = try connection.client()
        try await photoedit.run {
            var month = ""
            for try await page in client.history(statuses: status.map { $0.split(separator: ",").map(String.init) } ?? [], search: search) {
                for item in page.items {
                    let itemMonth = String(item.createdAt.formatted(.iso8601).prefix(7))
                    if byMonth, itemMonth != month {
                        month = itemMonth
                        print("\n\(month)")
                    }
                    print("\(item.id)  \(item.createdAt.formatted(.iso8601))  \(item.status)  \(item.effectTitle)\(item.prompt.map { "  \"\($0)\"" } ?? "")")
                }
            }
        }
    }
}

struct DeleteCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "delete", abstract: "Delete an edit for good.")
    @OptionGroup var connection: Connection
    @Argument var id: String

    func run() async throws {
        let client = try connection.client()
        try await photoedit.run {
            try await client.delete(id)
            print("deleted \(id)")
        }
    }
}

struct ShareCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "share", abstract: "A public link to an edit's result.")
    @OptionGroup var connection: Connection
    @Argument var id: String

    func run() async throws {
        let client = try connection.client()
        try await photoedit.run {
            let link = try await client.share(id)
            print("\(link.url)  (until \(link.expiresAt.formatted(.iso8601)))")
        }
    }
}

struct RerunCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "rerun", abstract: "Run an edit again (a new, charged job).")
    @OptionGroup var connection: Connection
    @Argument var id: String

    func run() async throws {
        let client = try connection.client()
        try await photoedit.run {
            let ticket = try await client.rerun(id)
            print("job \(ticket.jobId) \(ticket.status)")
        }
    }
}
