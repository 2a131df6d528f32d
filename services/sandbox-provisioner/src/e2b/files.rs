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
