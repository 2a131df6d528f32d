//! A minimal HTTP/1.1 model server for the e2e tests: `POST /v1/messages` (Anthropic) and
//! `POST /v1/chat/completions` (OpenAI-compatible) are answered by a function of the
//! request, and every request's head and body is recorded. One request per connection
//! (`connection: close`), which both drivers' HTTP client handles.
#![allow(dead_code)]

use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What was asked: the request head (request line and headers) and the JSON body.
pub type Requests = Arc<Mutex<Vec<(String, Value)>>>;

/// Serve `answer(head, body) -> (status, body)`; the base URL (no `/v1`).
pub async fn serve<F>(answer: F, requests: Requests) -> String
where
    F: Fn(&str, &Value) -> (u16, Value) + Send + Sync + 'static,
{
    let answer = Arc::new(answer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let (answer, requests) = (answer.clone(), requests.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                let (head, body_start) = loop {
                    let n = conn.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break (String::from_utf8_lossy(&buf[..i]).into_owned(), i + 4);
                    }
                };
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                while buf.len() < body_start + len {
                    let n = conn.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let body: Value = serde_json::from_slice(&buf[body_start..body_start + len])
                    .unwrap_or(Value::Null);
                let (status, reply) = answer(&head, &body);
                requests.lock().unwrap().push((head, body));
                let reason = match status {
                    200 => "OK",
                    400 => "Bad Request",
                    401 => "Unauthorized",
                    429 => "Too Many Requests",
                    _ => "Internal Server Error",
                };
                let text = reply.to_string();
                let resp = format!(
                    "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nretry-after: 0\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                    text.len()
                );
                let _ = conn.write_all(resp.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

/// An Anthropic Messages reply.
pub fn anthropic_message(stop: &str, content: Value, input: u64, output: u64) -> Value {
    json!({"id": "msg_e2e", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
        "stop_reason": stop, "content": content,
        "usage": {"input_tokens": input, "output_tokens": output,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}})
}

/// The error body the Anthropic and OpenAI APIs send with a non-200 status.
pub fn api_error(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}
