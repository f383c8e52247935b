import Blobs
import Foundation
@testable import GatewayApp
import Messages
import Testing
import TestSupport

/// The History routes' bodies, written by hand in one pass: the same JSON the app's models read.
@Suite("History JSON", .timeLimit(.minutes(5)))
struct HistoryJSONTests {
    static func links() async throws -> (DownloadLinks, URL) {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("history-json-\(UUID().uuidString)")
        let blobs = try await FolderBlobStore.open(root: root, signer: URLSigner(secret: "history-json-test"), publicBaseURL: "http://gateway.test")
        return (DownloadLinks(blobs: blobs, publicBaseURL: "http://gateway.test", lifetime: 900), root)
    }

    static func item(_ status: JobStatus, prompt: String? = "make it pop", parameters: [String: Double] = ["strength": 0.75, "fidelity": 1]) -> HistoryItem {
        HistoryItem(
            jobId: "job-\(status.rawValue)", userId: "device:u", effectId: "default", effectTitle: "NanoBanana", prompt: prompt, status: status,
            progress: 0.25, createdAt: Date(timeIntervalSince1970: 1_795_000_123.987), updatedAt: Date(), finishedAt: nil,
            resultKey: "results/\(status.rawValue).jpg", thumbnailKey: "thumbnails/\(status.rawValue).jpg", originalImageKey: "uploads/u/a.jpg",
            parameters: parameters, cost: status == .failed ? 0 : 4, lastError: "The model declined this edit", version: 3
        )
    }

    static func object(_ bytes: [UInt8]) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any])
    }

    @Test func eachStatusShowsWhatTheAppExpectsAndNothingElse() async throws {
        let (links, root) = try await Self.links()
        defer { try? FileManager.default.removeItem(at: root) }
        for status in JobStatus.allCases {
            var writer = HistoryJSON(links: links)
            writer.item(Self.item(status))
            let item = try Self.object(writer.bytes)
            let expected: Set<String> = {
                var keys: Set = ["createdAt", "credits", "effectId", "effectTitle", "id", "originalImageKey", "parameters", "prompt", "status"]
                switch status {
                case .completed: keys.formUnion(["resultUrl", "thumbnailUrl"])
                case .failed: keys.insert("error")
                case .queued, .processing: keys.insert("progress")
                case .cancelled: break
                }
                return keys
            }()
            #expect(Set(item.keys) == expected, "\(status)")
            #expect(item["status"] as? String == HistoryStatus(status).rawValue)
            #expect(item["createdAt"] as? String == "2026-11-18T11:08:43Z")
            #expect(item["credits"] as? Int == (status == .failed ? 0 : 4))
            #expect(item["parameters"] as? [String: Double] == ["strength": 0.75, "fidelity": 1])
            if status == .completed {
                let url = try #require(item["resultUrl"] as? String)
                #expect(url.hasPrefix("http://gateway.test/files/results/completed.jpg?exp="))
            }
            if status == .processing { #expect(item["progress"] as? Double == 0.25) }
        }
    }

    @Test func theKeysAreSortedAndDatesAreWhatJSONEncoderWrites() async throws {
        let (links, root) = try await Self.links()
        defer { try? FileManager.default.removeItem(at: root) }
        // The order JSONEncoder's sorted keys gave, byte for byte where no URL or number is involved
        var writer = HistoryJSON(links: links)
        writer.item(Self.item(.cancelled, parameters: [:]))
        #expect(String(decoding: writer.bytes, as: UTF8.self) == #"{"createdAt":"2026-11-18T11:08:43Z","credits":4,"effectId":"default","effectTitle":"NanoBanana","id":"job-cancelled","originalImageKey":"uploads/u/a.jpg","parameters":{},"prompt":"make it pop","status":"cancelled"}"#)
        // Dates: the same text as `.iso8601` for any instant, fractions and all
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        var generator = SplitMix64(state: 25)
        for _ in 0..<2000 {
            let date = Date(timeIntervalSince1970: Double(generator.next() % 4_000_000_000_000) / 1000)
            var writer = HistoryJSON(links: links)
            var item = Self.item(.cancelled)
            item.createdAt = date
            writer.item(item)
            let written = try #require(try Self.object(writer.bytes)["createdAt"] as? String)
            let expected = String(decoding: try encoder.encode([date]), as: UTF8.self).dropFirst(2).dropLast(2)
            #expect(written == String(expected), "\(date.timeIntervalSince1970)")
        }
    }

    @Test func everyItemIsByteForByteWhatJSONEncoderWroteFromTheOldView() async throws {
        let (links, root) = try await Self.links()
        defer { try? FileManager.default.removeItem(at: root) }
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let now = Date()
        for status in JobStatus.allCases {
            for prompt in [nil, "a \"quoted\" prompt / é"] {
                for parameters in [[:], ["strength": 0.75, "fidelity": 1, "upscale": 2.5]] {
                    let item = Self.item(status, prompt: prompt, parameters: parameters)
                    var writer = HistoryJSON(links: links, now: now)
                    writer.item(item)
                    let old = try encoder.encode(OldItemView(item, links: links, now: now))
                    #expect(String(decoding: writer.bytes, as: UTF8.self) == String(decoding: old, as: UTF8.self))
                }
            }
        }
    }

    /// The item view the routes encoded with `JSONEncoder` before they wrote items directly.
    struct OldItemView: Encodable {
        var id: String
        var thumbnailUrl: String?
        var effectTitle: String
        var effectId: String
        var status: HistoryStatus
        var createdAt: Date
        var resultUrl: String?
        var originalImageKey: String
        var parameters: [String: Double]
        var prompt: String?
        var error: String?
        var progress: Double?
        var credits: Int

        init(_ item: HistoryItem, links: DownloadLinks, now: Date) {
            let completed = item.status == .completed
            id = item.jobId
            thumbnailUrl = completed ? links.url(item.thumbnailKey, now: now) : nil
            effectTitle = item.effectTitle
            effectId = item.effectId
            status = HistoryStatus(item.status)
            createdAt = item.createdAt
            resultUrl = completed ? links.url(item.resultKey, now: now) : nil
            originalImageKey = item.originalImageKey
            parameters = item.parameters
            prompt = item.prompt
            error = item.status == .failed ? item.lastError : nil
            progress = status == .processing ? item.progress : nil
            credits = item.cost
        }
    }

    @Test func anyTextSurvivesTheRoundTrip() async throws {
        let (links, root) = try await Self.links()
        defer { try? FileManager.default.removeItem(at: root) }
        var texts = ["\"quoted\" and \\back\\slashed", "line\nbreak\ttab\r\u{8}\u{C}", "slash / é 漢字 🎨 \u{2028}", String(UnicodeScalar(0)), ""]
        texts.append(String((0..<0x20).map { Character(UnicodeScalar($0)) }))
        var generator = SplitMix64(state: 7)
        for _ in 0..<500 {
            texts.append(String((0..<20).map { _ in Character(UnicodeScalar(UInt8(generator.next() % 128))) }))
        }
        for text in texts {
            var writer = HistoryJSON(links: links)
            writer.item(Self.item(.cancelled, prompt: text, parameters: [text: 1e-7, "big": 12_345_678.5]))
            let item = try Self.object(writer.bytes)
            #expect(item["prompt"] as? String == text)
            #expect((item["parameters"] as? [String: Double])?[text] == 1e-7)
            #expect((item["parameters"] as? [String: Double])?["big"] == 12_345_678.5)
        }
    }

    /// A page's heads travel as one text with each head's end. Text that is not UTF-8 (a damaged
    /// database's) is mended head by head, and the ends still cut the text into the mended heads.
    @Test func headsWithInvalidUTF8AreMendedAndTheirEndsStillCutThem() {
        let raw: [[UInt8]] = [Array(#"{"id":"a""#.utf8), [0x7B, 0xFF, 0xC3], Array(#"{"id":"é""#.utf8), [0xE2, 0x82], []]
        var heads = RenderedHistoryPage.Heads(capacity: raw.count)
        for bytes in raw { heads.write { out in bytes.withUnsafeBufferPointer { out.json(utf8: $0) } } }
        let (text, ends) = heads.finish()
        let page = RenderedHistoryPage(
            headText: text, headEnds: ends, statuses: Array(repeating: .completed, count: raw.count), resultKeys: Array(repeating: "", count: raw.count),
            thumbnailKeys: Array(repeating: "", count: raw.count), totalCount: raw.count, hasMore: false, nextCursor: nil, sections: nil
        )
        #expect(page.isWellFormed)
        let utf8 = Array(text.utf8)
        for (index, bytes) in raw.enumerated() {
            #expect(Array(utf8[page.headRange(index)]) == Array(String(decoding: bytes, as: UTF8.self).utf8), "head \(index)")
        }
        // Valid text is taken as it is.
        var valid = RenderedHistoryPage.Heads(capacity: 2)
        valid.write { $0.string("é") }
        valid.write { $0.raw("{}") }
        #expect(valid.finish().text == "\"é\"{}" && valid.finish().ends == [4, 6])
    }

    /// `JSONBytes.string` looks at eight bytes at a time: every byte it must escape, at every
    /// place in a word and in the tail, among ASCII and multi-byte text, is escaped as a byte by
    /// byte writer does it, and the text reads back.
    @Test func escapesAreFoundWhereverTheyFallInALongText() throws {
        func reference(_ text: String) -> [UInt8] {
            var out: [UInt8] = [UInt8(ascii: "\"")]
            for byte in text.utf8 {
                switch byte {
                case UInt8(ascii: "\""): out += Array(#"\""#.utf8)
                case UInt8(ascii: "\\"): out += Array(#"\\"#.utf8)
                case 0x0A: out += Array(#"\n"#.utf8)
                case 0x0D: out += Array(#"\r"#.utf8)
                case 0x09: out += Array(#"\t"#.utf8)
                case 0x08: out += Array(#"\b"#.utf8)
                case 0x0C: out += Array(#"\f"#.utf8)
                case 0..<0x20: out += Array(String(format: "\\u%04x", byte).utf8)
                default: out.append(byte)
                }
            }
            return out + [UInt8(ascii: "\"")]
        }
        let specials: [Character] = ["\"", "\\", "\n", "\u{0}", "\u{1F}", "\t"]
        let fillers = ["a", "é", "漢", "🎨", "~", " ", "!", "#", "[", "]", "\u{7F}"]
        var texts: [String] = []
        for length in 0..<40 {
            for filler in fillers {
                let plain = String(repeating: filler, count: length)
                texts.append(plain)
                for special in specials {
                    for position in stride(from: 0, through: length, by: max(1, length / 7)) {
                        var characters = Array(plain)
                        characters.insert(special, at: min(position, characters.count))
                        texts.append(String(characters))
                    }
                }
            }
        }
        for text in texts {
            var out = JSONBytes()
            out.string(text)
            #expect(out.bytes == reference(text), "\(text.debugDescription)")
            let back = try JSONSerialization.jsonObject(with: Data(out.bytes), options: .fragmentsAllowed) as? String
            #expect(back == text)
        }
    }

    @Test func aPageGroupedByMonthSignsEachKeyOnceAndDecodesAsThePage() async throws {
        let (links, root) = try await Self.links()
        defer { try? FileManager.default.removeItem(at: root) }
        let items = [Self.item(.completed), Self.item(.failed)]
        let page = HistoryPage(items: items, totalCount: 7, hasMore: true, nextCursor: "c/ursor",
                               sections: [HistorySection(month: "2026-11", title: "November 2026", items: items)])
        var writer = HistoryJSON(links: links)
        try writer.page(RenderedHistoryPage(page))
        let body = try Self.object(writer.bytes)
        #expect(body["totalCount"] as? Int == 7)
        #expect(body["hasMore"] as? Bool == true)
        #expect(body["nextCursor"] as? String == "c/ursor")
        let listed = try #require(body["items"] as? [[String: Any]])
        let sections = try #require(body["sections"] as? [[String: Any]])
        let grouped = try #require(sections.first?["items"] as? [[String: Any]])
        #expect(sections.first?["title"] as? String == "November 2026")
        #expect(listed.count == 2 && grouped.count == 2)
        #expect(listed[0]["resultUrl"] as? String == grouped[0]["resultUrl"] as? String)
        #expect(listed[0]["resultUrl"] as? String != listed[0]["thumbnailUrl"] as? String)
        // And each item of the page, written by history up to its URLs and finished here, is the
        // item the single-item route writes
        for (index, item) in items.enumerated() {
            var single = HistoryJSON(links: links)
            single.item(item)
            #expect(NSDictionary(dictionary: try Self.object(single.bytes)) == NSDictionary(dictionary: listed[index]))
        }
        // And a page whose lists do not line up is refused, not read past its end
        var broken = RenderedHistoryPage(page)
        broken.statuses.removeLast()
        var refused = HistoryJSON(links: links)
        #expect(throws: BusError.self) { try refused.page(broken) }
        // Nor one whose heads end past their text, or go back
        var overrun = RenderedHistoryPage(page)
        overrun.headEnds[overrun.count - 1] = overrun.headText.utf8.count + 1
        #expect(throws: BusError.self) { try refused.page(overrun) }
        var backwards = RenderedHistoryPage(page)
        backwards.headEnds[0] = backwards.headEnds[1] + 1
        #expect(throws: BusError.self) { try refused.page(backwards) }
    }

    /// `exp` and `sig` of a `/files` URL.
    private static func grant(_ url: String) throws -> (expires: Int, signature: String) {
        let items = try #require(URLComponents(string: url)?.queryItems)
        let expires = try #require(items.first { $0.name == "exp" }?.value.flatMap(Int.init))
        return (expires, try #require(items.first { $0.name == "sig" }?.value))
    }

    @Test func aBlobHasOneURLAllMinuteValidAtLeastTheLifetimeAndAtMostAMinuteMore() async throws {
        let (links, root) = try await Self.links()
        defer { try? FileManager.default.removeItem(at: root) }
        let signer = URLSigner(secret: "history-json-test")
        let start = Date(timeIntervalSince1970: 1_795_000_020)  // a minute's start
        var byWindow: [Int: String] = [:]
        for offset in stride(from: 0.0, to: 300, by: 7.25) {
            let now = start.addingTimeInterval(offset)
            let url = try #require(links.url("results/job-1.jpg", now: now))
            let (expires, signature) = try Self.grant(url)
            let left = Double(expires) - now.timeIntervalSince1970
            #expect(left >= 900 && left <= 960, "\(url) at \(now) is valid \(left) s")
            #expect(signer.verify(signature: signature, method: "GET", key: "results/job-1.jpg", owner: "", contentType: "", expires: expires, now: now))
            // The same URL within a minute, whoever asks; another the next minute.
            let window = Int(offset) / 60
            if let earlier = byWindow[window] { #expect(url == earlier) }
            byWindow[window] = url
        }
        #expect(Set(byWindow.values).count == byWindow.count)
        #expect(byWindow.count == 5)
        // Another blob's URL is its own.
        #expect(links.url("results/job-2.jpg", now: start) != links.url("results/job-1.jpg", now: start))
    }

    @Test func signedURLsAreRememberedForTheirWindowAndBounded() {
        let signed = SignedURLs(capacity: 3)
        signed.remember("u1", of: "a", in: 10)
        signed.remember("u2", of: "b", in: 10)
        #expect(signed.url(of: "a", in: 10) == "u1" && signed.url(of: "b", in: 10) == "u2")
        // Not in another window, and a late request of the window before does not bring it back.
        #expect(signed.url(of: "a", in: 11) == nil)
        signed.remember("u1'", of: "a", in: 11)
        #expect(signed.url(of: "a", in: 11) == "u1'" && signed.url(of: "b", in: 11) == nil && signed.count == 1)
        signed.remember("old", of: "c", in: 10)
        #expect(signed.url(of: "c", in: 10) == nil && signed.url(of: "c", in: 11) == nil && signed.count == 1)
        // Never more than its capacity.
        for index in 0..<10 {
            signed.remember("u\(index)", of: "k\(index)", in: 11)
            #expect(signed.count <= 3)
        }
        #expect(signed.url(of: "k9", in: 11) == "u9")
    }
}
