//! What the metering LLM gateway adds to a model request, at 200 concurrent streams:
//! the same requests to a local model server directly and through a gateway (as a
//! provisioner's relay delivers them: a PROXY v2 header, then HTTP/1.1), each client on
//! its own connection. Prints p50/p99 of a whole JSON request and of the time to the
//! first streamed byte, both ways, and the difference.
//!
//! `cargo bench -p forkyard-tests --bench llm_gateway [-- --streams N --rounds N]`

use forkyard_agent_runner::{
    llm::{Endpoint, Secret, http::RetryPolicy},
    llm_gateway::{
        LlmGateway,
        grants::{Allowed, GrantHandle, GrantSpec},
    },
    models::Models,
};
use forkyard_tests::scripted_model::{Script, ScriptedModel};
use std::{
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

struct Sample {
    first_byte: Duration,
    total: Duration,
}

/// One request on a fresh connection; `sandbox` adds the relay's header.
async fn request(addr: &str, sandbox: Option<&str>, token: &str, stream: bool) -> Sample {
    let body = format!(
        r#"{{"model":"claude-haiku-4-5","max_tokens":64,"stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let req = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: model\r\nx-api-key: {token}\r\nanthropic-version: 2023-06-01\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let started = Instant::now();
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    conn.set_nodelay(true).unwrap();
    let mut out = Vec::with_capacity(4096);
    if let Some(s) = sandbox {
        out.extend_from_slice(&forkyard_common::proxy_header::encode(s));
    }
    out.extend_from_slice(req.as_bytes());
    conn.write_all(&out).await.unwrap();
    let mut buf = vec![0u8; 16 * 1024];
    let mut seen = Vec::new();
    let mut first_byte = None;
    loop {
        let n = conn.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
        if first_byte.is_none()
            && let Some(i) = seen.windows(4).position(|w| w == b"\r\n\r\n")
            && seen.len() > i + 4
        {
            first_byte = Some(started.elapsed());
        }
    }
    assert!(seen.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&seen));
    let total = started.elapsed();
    Sample {
        first_byte: first_byte.unwrap_or(total),
        total,
    }
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn round(
    addr: &str,
    grants: &[GrantHandle],
    via_gateway: bool,
    stream: bool,
) -> Vec<Sample> {
    let tasks: Vec<_> = grants
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let (addr, token) = (addr.to_owned(), g.token().to_owned());
            tokio::spawn(async move {
                let sandbox = format!("sbx-bench-{i}");
                request(&addr, via_gateway.then_some(sandbox.as_str()), &token, stream).await
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let streams = arg("--streams", 200);
    let rounds = arg("--rounds", 10);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        // A model that streams its events 10 ms apart.
        let mut script = Script::edit("true");
        script.event_gap = Duration::from_millis(10);
        let model = ScriptedModel::start(script).await;
        let upstream = model.url.trim_start_matches("http://").to_owned();
        let endpoint = |base: &str| Endpoint {
            base_url: base.into(),
            key: Secret::new("sk-bench".into()),
            retry: RetryPolicy::default(),
        };
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gw_addr = l.local_addr().unwrap().to_string();
        let gw = Arc::new(LlmGateway::new(
            endpoint(&model.url),
            endpoint(&format!("{}/v1", model.url)),
            Models::default(),
            format!("http://{gw_addr}"),
        ));
        tokio::spawn(forkyard_agent_runner::llm_gateway::serve(
            gw.clone(),
            l,
            tokio_util::sync::CancellationToken::new(),
        ));
        let grants: Vec<GrantHandle> = (0..streams)
            .map(|i| {
                gw.grants.mint(GrantSpec {
                    sandbox_id: format!("sbx-bench-{i}"),
                    run_id: "run-bench".into(),
                    fork: u32::try_from(i).unwrap_or(0),
                    allowed: Allowed::Any,
                    charger: None,
                })
            })
            .collect();
        // Warm both paths (connections, the gateway's upstream pool).
        round(&upstream, &grants, false, false).await;
        round(&gw_addr, &grants, true, false).await;

        println!("llm gateway: {streams} concurrent clients, {rounds} rounds each way, interleaved");
        for stream in [false, true] {
            let (mut d_first, mut d_total, mut g_first, mut g_total) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for _ in 0..rounds {
                for s in round(&upstream, &grants, false, stream).await {
                    d_first.push(s.first_byte);
                    d_total.push(s.total);
                }
                for s in round(&gw_addr, &grants, true, stream).await {
                    g_first.push(s.first_byte);
                    g_total.push(s.total);
                }
            }
            let (what, figure, direct, via) = if stream {
                ("SSE stream", "first byte", &mut d_first, &mut g_first)
            } else {
                ("JSON request", "whole request", &mut d_total, &mut g_total)
            };
            let (dp50, dp99) = (pct(direct, 0.5), pct(direct, 0.99));
            let (gp50, gp99) = (pct(via, 0.5), pct(via, 0.99));
            println!(
                "  {what:<13} {figure:<14} direct p50 {:>7.2} ms p99 {:>7.2} ms | via gateway p50 {:>7.2} ms p99 {:>7.2} ms | added p50 {:>+6.2} ms",
                ms(dp50),
                ms(dp99),
                ms(gp50),
                ms(gp99),
                ms(gp50) - ms(dp50),
            );
        }
        let metered = grants.iter().map(|g| g.totals().requests).sum::<u32>();
        println!("  requests metered by the gateway: {metered}");
    });
}
