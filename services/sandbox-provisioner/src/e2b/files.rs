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
        let boundary = format!("forkyard{}", uuid::Uuid::new_v4().simple());
        let name = path.rsplit('/').next().unwrap_or("file").replace('"', "");
        let mut body = Vec::with_capacity(content.len() + 256);
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(content);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let resp = self
            .envd(sid, Method::POST, "/files")
            .query(&[("path", path), ("username", "user")])
            .header(
                "Content-Type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .timeout(self.config.request_timeout)
            .body(body)
            .send()
            .await
            .map_err(|e| self.transport_error("write file", &e))?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(self.status_error("write file", "", status, &text));
        }
        Ok(())
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
        let boundary = format!("forkyard{}", uuid::Uuid::new_v4().simple());
        let name = path.rsplit('/').next().unwrap_or("file").replace('"', "");
        let head = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        );
        let tail = format!("\r\n--{boundary}--\r\n");
        let len = head.len() as u64 + size + tail.len() as u64;
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
        let body =
            futures::stream::once(async move { Ok::<_, std::io::Error>(bytes::Bytes::from(head)) })
                .chain(chunks)
                .chain(futures::stream::once(async move {
                    Ok(bytes::Bytes::from(tail))
                }));
        let resp = self
            .envd(sid, Method::POST, "/files")
            .query(&[("path", path), ("username", "user")])
            .header(
                "Content-Type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .header("Content-Length", len)
            .timeout(self.config.clone_timeout)
            .body(reqwest::Body::wrap_stream(body))
            .send()
            .await
            .map_err(|e| self.transport_error("upload the repository", &e))?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(self.status_error("upload the repository", "", status, &text));
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
