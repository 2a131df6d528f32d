//! The model requests of an agent-CLI run, as its trace shows them.

use super::model_mesh::{ANTHROPIC_KEY, OPENAI_KEY, TOKEN_PREFIX};
use forkyard_tests::{
    otlp::{SpanRecord, TraceSink},
    scripted_model::{CACHED_TOKENS, INPUT_TOKENS, OUTPUT_TOKENS},
};
use std::{collections::HashMap, time::Duration};

/// Every model request the CLIs made through the gateway is a span in the run's trace
/// named and described by OpenTelemetry's GenAI conventions (`chat {model}`, the provider,
/// the model, the tokens the scripted server reported), under its fork's agent activity,
/// with its charge to the ledger under it; and no span anywhere carries a key or a fork's
/// token.
pub async fn assert_model_requests_traced(sink: &TraceSink, run_id: &str, calls: usize) {
    let spans = exported_spans(sink, calls).await;
    let by_id: HashMap<&str, &SpanRecord> = spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
    let ancestors = |s: &SpanRecord| {
        let mut chain = Vec::new();
        let mut cur = s;
        while let Some(p) = by_id.get(cur.parent_span_id.as_str()) {
            chain.push(*p);
            cur = p;
        }
        chain
    };
    let requests: Vec<&SpanRecord> = spans
        .iter()
        .filter(|s| is_chat(s) && s.attr_str("run_id").as_deref() == Some(run_id))
        .collect();
    assert_eq!(requests.len(), calls, "a chat span per model call");
    for r in &requests {
        assert_eq!(r.service, "agent-runner");
        assert_genai_attributes(r);
        assert_eq!(
            r.attr_str("http.response.status_code").as_deref(),
            Some("200")
        );
        let chain = ancestors(r);
        let agent = chain
            .iter()
            .find(|a| a.name == "RunActivity:agent.run")
            .unwrap_or_else(|| panic!("llm.request not under an agent activity: {r:?}"));
        assert_eq!(agent.attr_str("forkyard.fork"), r.attr_str("fork"));
        assert_eq!(agent.attr_str("forkyard.run_id").as_deref(), Some(run_id));
        assert!(
            chain
                .iter()
                .any(|a| a.name == "forkyard.gateway.v1.Gateway/LaunchRun"),
            "the request is in the run's trace: {:?}",
            chain.iter().map(|a| &a.name).collect::<Vec<_>>()
        );
        let charged = spans.iter().any(|s| {
            s.service == "budget-ledger"
                && s.name == "forkyard.budget.v1.BudgetLedger/Charge"
                && ancestors(s).iter().any(|a| a.span_id == r.span_id)
        });
        assert!(
            charged,
            "the request's charge reached the ledger under it: {r:?}"
        );
    }
    assert_no_secret_in_spans(&spans);
}

/// The spans received once there are as many requests and charges as `calls` (spans are
/// exported in batches), or whatever came in 30 s.
async fn exported_spans(sink: &TraceSink, calls: usize) -> Vec<SpanRecord> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let spans = sink.spans();
        let requests = spans.iter().filter(|s| is_chat(s)).count();
        let charges = spans
            .iter()
            .filter(|s| {
                s.name == "forkyard.budget.v1.BudgetLedger/Charge" && s.service == "budget-ledger"
            })
            .count();
        if (requests >= calls && charges >= calls) || std::time::Instant::now() > deadline {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn is_chat(s: &SpanRecord) -> bool {
    s.attr_str("gen_ai.operation.name").as_deref() == Some("chat")
}

/// The conventions' attributes, with the counts the scripted server reports for every
/// call: the whole prompt as input tokens, its cached part also on its own.
fn assert_genai_attributes(r: &SpanRecord) {
    let attr = |k: &str| r.attr_str(k).unwrap_or_else(|| panic!("no {k} on {r:?}"));
    let model = attr("gen_ai.request.model");
    assert_eq!(r.name, format!("chat {model}"));
    assert_eq!(attr("gen_ai.response.model"), model, "{r:?}");
    assert!(
        ["anthropic", "openai"].contains(&attr("gen_ai.provider.name").as_str()),
        "{r:?}"
    );
    assert_eq!(
        attr("gen_ai.usage.input_tokens"),
        INPUT_TOKENS.to_string(),
        "{r:?}"
    );
    assert_eq!(
        attr("gen_ai.usage.output_tokens"),
        OUTPUT_TOKENS.to_string(),
        "{r:?}"
    );
    assert_eq!(
        attr("gen_ai.usage.cache_read.input_tokens"),
        CACHED_TOKENS.to_string(),
        "{r:?}"
    );
}

fn assert_no_secret_in_spans(spans: &[SpanRecord]) {
    for s in spans {
        for v in s.attributes.values() {
            let v = v.to_string();
            assert!(
                !v.contains(ANTHROPIC_KEY) && !v.contains(OPENAI_KEY) && !v.contains(TOKEN_PREFIX),
                "a secret in span {} ({}): {v}",
                s.name,
                s.service
            );
        }
    }
}
