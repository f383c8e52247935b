import JobsCore
import Testing

@Suite("Providers' counters from workers' metrics")
struct ProviderCountersTests {
    @Test func aCounterIsSummedByProviderOverEveryWorkersText() {
        // Lines as swift-prometheus writes them (Services/jobs/Worker/Providers/ProviderCall.swift counts them).
        let first = """
            # TYPE worker_provider_rate_limit_waits_total counter
            worker_provider_rate_limit_waits_total{model="gemini-2.5-flash-image",provider="gemini"} 3
            worker_provider_rate_limit_waits_total{provider="fal",model="fal-ai/veo3.1/image-to-video"} 1
            worker_provider_rate_limit_waits_total_other{provider="gemini"} 100
            worker_provider_refusals_total{model="gpt-image-1",provider="openai"} 2
            """
        let second = """
            worker_provider_rate_limit_waits_total{model="gemini-2.5-flash-image",provider="gemini"} 4
            worker_provider_rate_limit_waits_total{model="x",provider="gemini"} garbage
            worker_provider_rate_limit_waits_total{model="x"} 9
            worker_provider_rate_limit_waits_total 9
            """
        #expect(ProviderCounters.sum("worker_provider_rate_limit_waits_total", in: [first, second]) == ["gemini": 7, "fal": 1])
        #expect(ProviderCounters.sum("worker_provider_refusals_total", in: [first, second]) == ["openai": 2])
        #expect(ProviderCounters.sum("worker_provider_refusals_total", in: []).isEmpty)
    }
}
