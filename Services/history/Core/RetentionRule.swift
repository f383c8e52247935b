import Foundation
import Messages

/// Which items retention removes: a user's items created before their current plan's retention
/// reaches back, never one whose job is still queued or processing.
public enum RetentionRule {
    /// Items created before this instant are past retention.
    public static func cutoff(now: Date, retentionDays: Int) -> Date {
        now.addingTimeInterval(-Double(max(1, retentionDays)) * 86_400)
    }

    /// The job statuses retention may delete.
    public static let sweepable: [JobStatus] = JobStatus.allCases.filter(\.isTerminal)
}
