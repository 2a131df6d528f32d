//! What the metering LLM gateway adds to a model request while 200 streams flow through
//! it: probe requests to a local model server directly and through the gateway (as a
//! provisioner's relay delivers them: a PROXY v2 header, then HTTP/1.1), interleaved,
//! each on its own connection, while 199 clients stream through the gateway without a
//! pause. Prints p50/p99 of a whole JSON request and of the time to the first streamed
//! byte, both ways, and the difference.
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
    assert!(
        seen.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&seen)
    );
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
    let rounds = arg("--rounds", 200);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        // A model that streams its events 50 ms apart.
        let mut script = Script::edit("true");
        script.event_gap = Duration::from_millis(50);
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
            None,
            tokio_util::sync::CancellationToken::new(),
        ));
        let grants: Vec<GrantHandle> = (0..streams)
            .map(|i| {
                gw.grants.mint(GrantSpec {
                    snapshotter: None,
                    sandbox_id: format!("sbx-bench-{i}"),
                    run_id: "run-bench".into(),
                    fork: u32::try_from(i).unwrap_or(0),
                    allowed: Allowed::Any,
                    charger: None,
                    ledger_grace: std::time::Duration::from_secs(120),
                    remote: false,
                })
            })
            .collect();
        // The load: `streams` clients, each streaming through the gateway without a
        // pause (20 events 50 ms apart, a second a stream), started over one second.
        let stop = tokio_util::sync::CancellationToken::new();
        let streamed = Arc::new(std::sync::atomic::AtomicU64::new(0));
        for (i, g) in grants.iter().enumerate().skip(1) {
            let (addr, token, stop, streamed) =
                (gw_addr.clone(), g.token().to_owned(), stop.clone(), streamed.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(1000 * i as u64 / streams as u64)).await;
                let sandbox = format!("sbx-bench-{i}");
                while !stop.is_cancelled() {
                    request(&addr, Some(&sandbox), &token, true).await;
                    streamed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let token = grants[0].token().to_owned();
        println!(
            "llm gateway: {} streams in flight through it (a second each), {rounds} probes each way, interleaved",
            streams - 1
        );
        for stream in [false, true] {
            let (mut direct, mut via) = (Vec::new(), Vec::new());
            for _ in 0..rounds {
                let d = request(&upstream, None, &token, stream).await;
                let g = request(&gw_addr, Some("sbx-bench-0"), &token, stream).await;
                let pick = |s: &Sample| if stream { s.first_byte } else { s.total };
                direct.push(pick(&d));
                via.push(pick(&g));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let (what, figure) = if stream {
                ("SSE stream", "first byte")
            } else {
                ("JSON request", "whole request")
            };
            let (dp50, dp99) = (pct(&mut direct, 0.5), pct(&mut direct, 0.99));
            let (gp50, gp99) = (pct(&mut via, 0.5), pct(&mut via, 0.99));
            println!(
                "  {what:<13} {figure:<14} direct p50 {:>6.2} ms p99 {:>6.2} ms | via gateway p50 {:>6.2} ms p99 {:>6.2} ms | added p50 {:>+5.2} ms",
                ms(dp50),
                ms(dp99),
                ms(gp50),
                ms(gp99),
                ms(gp50) - ms(dp50),
            );
        }
        stop.cancel();
        println!(
            "  load: {} streams completed through the gateway meanwhile; requests metered: {}",
            streamed.load(std::sync::atomic::Ordering::Relaxed),
            grants.iter().map(|g| g.totals().requests).sum::<u32>()
        );
    });
}
