//! Files in an E2B sandbox's workspace, through envd's `GET/POST /files`.

use super::{E2bBackend, WORKSPACE};
use crate::{
    error::{ProvisionerError, Result},
    limits::OUTPUT_CAP,
};
use forkyard_proto::sandbox::v1::{
    ReadFileRequest, ReadFileResponse, WriteFileRequest, WriteFileResponse,
};
use reqwest::{Method, StatusCode};
use std::collections::HashMap;

impl E2bBackend {
    pub(super) async fn read_file_at(&self, req: ReadFileRequest) -> Result<ReadFileResponse> {
        let sid = Self::e2b_id(&req.sandbox_id)?;
        let path = self.path(&req.path)?;
        let mut content = self.read_bytes(sid, &path).await?;
        let size = content.len() as u64;
        let max = match req.max_bytes {
            0 => OUTPUT_CAP as u64,
            n => n,
        };
        let truncated = size > max;
        content.truncate(usize::try_from(max).unwrap_or(usize::MAX));
        Ok(ReadFileResponse {
            content,
            truncated,
            size,
        })
    }

    pub(super) async fn write_file_at(&self, req: WriteFileRequest) -> Result<WriteFileResponse> {
        let sid = Self::e2b_id(&req.sandbox_id)?;
        let path = self.path(&req.path)?;
        self.write_bytes(sid, &path, &req.content).await?;
        if req.mode != 0 {
            let argv = vec!["chmod".into(), format!("{:o}", req.mode & 0o7777), path];
            let r = self
                .run(
                    sid,
                    &argv,
                    &HashMap::new(),
                    WORKSPACE,
                    self.config.request_timeout,
                    None,
                )
                .await?;
            if r.exit_code != 0 {
                return Err(ProvisionerError::FailedPrecondition(format!(
                    "chmod in the sandbox: {}",
                    r.stderr.trim()
                )));
            }
        }
        Ok(WriteFileResponse {
            bytes_written: req.content.len() as u64,
        })
    }

    pub(super) async fn read_bytes(&self, sid: &str, path: &str) -> Result<Vec<u8>> {
        let resp = self
            .envd(sid, Method::GET, "/files")
            .query(&[("path", path), ("username", "user")])
            .timeout(self.config.request_timeout)
            .send()
            .await
            .map_err(|e| self.transport_error("read file", &e))?;
        let status = resp.status();
        if status == StatusCode::NOT_FOUND {
            return Err(ProvisionerError::invalid(
                "path",
                format!("{path}: no such file"),
            ));
        }
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(self.status_error("read file", "", status, &text));
        }
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| self.transport_error("read file", &e))?;
        Ok(bytes.to_vec())
    }

    pub(super) async fn write_bytes(&self, sid: &str, path: &str, content: &[u8]) -> Result<()> {
        let form = Multipart::for_path(path);
        let mut body = Vec::with_capacity(content.len() + 256);
        body.extend_from_slice(form.head.as_bytes());
        body.extend_from_slice(content);
        body.extend_from_slice(form.tail.as_bytes());
        let len = body.len() as u64;
        let timeout = self.config.request_timeout;
        self.post_file(sid, path, &form, (body.into(), len), timeout, "write file")
            .await
    }

    /// Host file `from` (`size` bytes) written to `path` in the sandbox, streamed: a
    /// repository's bundle is not held in memory once per sandbox.
    pub(super) async fn upload(
        &self,
        sid: &str,
        path: &str,
        from: &std::path::Path,
        size: u64,
    ) -> Result<()> {
        use futures::StreamExt as _;
        let file = tokio::fs::File::open(from)
            .await
            .map_err(|e| ProvisionerError::internal("open the repository's bundle", e))?;
        let form = Multipart::for_path(path);
        let len = form.head.len() as u64 + size + form.tail.len() as u64;
        let chunks = futures::stream::unfold(file, |mut f| async move {
            use tokio::io::AsyncReadExt as _;
            let mut buf = vec![0u8; 256 << 10];
            match f.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(bytes::Bytes::from(buf)), f))
                }
                Err(e) => Some((Err(e), f)),
            }
        });
        let (head, tail) = (form.head.clone(), form.tail.clone());
        let body =
            futures::stream::once(async move { Ok::<_, std::io::Error>(bytes::Bytes::from(head)) })
                .chain(chunks)
                .chain(futures::stream::once(async move {
                    Ok(bytes::Bytes::from(tail))
                }));
        let body = (reqwest::Body::wrap_stream(body), len);
        let timeout = self.config.clone_timeout;
        self.post_file(sid, path, &form, body, timeout, "upload the repository")
            .await
    }

    /// envd's `POST /files` of one file, framed by `form`; `what` names it in errors.
    async fn post_file(
        &self,
        sid: &str,
        path: &str,
        form: &Multipart,
        (body, len): (reqwest::Body, u64),
        timeout: std::time::Duration,
        what: &str,
    ) -> Result<()> {
        let resp = self
            .envd(sid, Method::POST, "/files")
            .query(&[("path", path), ("username", "user")])
            .header(
                "Content-Type",
                format!("multipart/form-data; boundary={}", form.boundary),
            )
            .header("Content-Length", len)
            .timeout(timeout)
            .body(body)
            .send()
            .await
            .map_err(|e| self.transport_error(what, &e))?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(self.status_error(what, "", status, &text));
        }
        Ok(())
    }

    pub(super) fn path(&self, p: &str) -> Result<String> {
        if p.is_empty() || p.starts_with('/') || p.split('/').any(|c| c == "..") {
            return Err(ProvisionerError::invalid(
                "path",
                "must be relative to the workspace, without \"..\"",
            ));
        }
        Ok(format!("{WORKSPACE}/{p}"))
    }
}

/// The multipart framing envd's `POST /files` takes around one file's bytes.
struct Multipart {
    boundary: String,
    head: String,
    tail: String,
}

impl Multipart {
    fn for_path(path: &str) -> Self {
        let boundary = format!("forkyard{}", uuid::Uuid::new_v4().simple());
        let name = path.rsplit('/').next().unwrap_or("file").replace('"', "");
        Self {
            head: format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            ),
            tail: format!("\r\n--{boundary}--\r\n"),
            boundary,
        }
    }
}
