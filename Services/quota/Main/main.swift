import ServiceKit

// The quota service. For now it answers `health`; its methods arrive with their issues.
try await BusServiceRunner.run(.quota)
