import Foundation
import Messages

/// Groups a page's items into calendar months in the user's time zone, titled in their language
/// ("November 2025", "novembre 2025"). Items arrive newest first and keep that order.
public enum MonthSections {
    /// The sections of `items`; `timeZone` is an IANA id (nil or unknown: UTC), `locale` a
    /// language tag that Foundation formats (nil or unknown: English).
    public static func group(_ items: [HistoryItem], timeZone: String?, locale: String?) -> [HistorySection] {
        let zone = timeZone.flatMap(TimeZone.init(identifier:)) ?? TimeZone(identifier: "UTC")!
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = zone
        let formatter = DateFormatter()
        formatter.calendar = calendar
        formatter.timeZone = zone
        formatter.locale = resolvedLocale(locale)
        formatter.setLocalizedDateFormatFromTemplate("MMMMyyyy")
        var sections: [HistorySection] = []
        for item in items {
            let parts = calendar.dateComponents([.year, .month], from: item.createdAt)
            let month = String(format: "%04d-%02d", parts.year ?? 0, parts.month ?? 0)
            if sections.last?.month == month {
                sections[sections.count - 1].items.append(item)
            } else {
                sections.append(HistorySection(month: month, title: formatter.string(from: item.createdAt), items: [item]))
            }
        }
        return sections
    }

    /// The locale of a language tag (`de`, `pt-BR`, `fr_FR`) if Foundation knows its language;
    /// English otherwise.
    public static func resolvedLocale(_ tag: String?) -> Locale {
        let english = Locale(identifier: "en_US")
        guard let tag, !tag.isEmpty, tag.utf8.count <= 35 else { return english }
        let identifier = tag.replacingOccurrences(of: "-", with: "_")
        let known = Set(Locale.availableIdentifiers)
        if known.contains(identifier) { return Locale(identifier: identifier) }
        let language = String(identifier.split(separator: "_").first ?? "")
        return known.contains(language) ? Locale(identifier: language) : english
    }
}
