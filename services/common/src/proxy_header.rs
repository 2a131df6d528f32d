//! The PROXY protocol v2 header (HAProxy's, as Envoy and nginx read it) that the
//! provisioner writes ahead of every connection it relays from a sandbox to the LLM
//! gateway, naming the sandbox in a custom TLV. The identity travels beside the HTTP
//! stream, before any byte the sandbox wrote, so nothing inside the sandbox can forge it;
//! the gateway checks that a fork's token is presented by that fork's own sandbox.

use tokio::io::{AsyncRead, AsyncReadExt};

const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// Version 2, command PROXY.
const VERSION_COMMAND: u8 = 0x21;
/// Address family unspecified: the relayed connection came from a Unix socket.
const FAMILY_UNSPEC: u8 = 0x00;
/// The first of the TLV types the specification leaves to applications.
pub const TLV_SANDBOX_ID: u8 = 0xE0;
/// Far above one TLV with a sandbox id; a longer header is refused unread.
const MAX_BLOCK: usize = 1024;

/// The header announcing a connection from `sandbox_id`.
pub fn encode(sandbox_id: &str) -> Vec<u8> {
    let id = sandbox_id.as_bytes();
    let id_len = u16::try_from(id.len().min(MAX_BLOCK - 3)).unwrap_or(0);
    let mut out = Vec::with_capacity(16 + 3 + id.len());
    out.extend_from_slice(&SIGNATURE);
    out.push(VERSION_COMMAND);
    out.push(FAMILY_UNSPEC);
    out.extend_from_slice(&(id_len + 3).to_be_bytes());
    out.push(TLV_SANDBOX_ID);
    out.extend_from_slice(&id_len.to_be_bytes());
    out.extend_from_slice(&id[..usize::from(id_len)]);
    out
}

/// Read the header at the start of `conn`; the sandbox id it names.
pub async fn read_sandbox_id(conn: &mut (impl AsyncRead + Unpin)) -> Result<String, String> {
    let mut fixed = [0u8; 16];
    conn.read_exact(&mut fixed)
        .await
        .map_err(|e| format!("no proxy header: {e}"))?;
    if fixed[..12] != SIGNATURE {
        return Err("not a PROXY protocol v2 header".into());
    }
    if fixed[12] != VERSION_COMMAND {
        return Err(format!("unsupported version/command {:#04x}", fixed[12]));
    }
    let len = usize::from(u16::from_be_bytes([fixed[14], fixed[15]]));
    if len > MAX_BLOCK {
        return Err(format!("header block of {len} bytes is too long"));
    }
    let mut block = vec![0u8; len];
    conn.read_exact(&mut block)
        .await
        .map_err(|e| format!("truncated proxy header: {e}"))?;
    // Address block sizes by family (spec 2.2); TLVs follow it.
    let skip = match fixed[13] >> 4 {
        0 => 0,
        1 => 12,
        2 => 36,
        3 => 216,
        f => return Err(format!("unknown address family {f}")),
    };
    let mut tlvs = block.get(skip..).ok_or("address block cut short")?;
    while tlvs.len() >= 3 {
        let (kind, n) = (tlvs[0], usize::from(u16::from_be_bytes([tlvs[1], tlvs[2]])));
        let value = tlvs.get(3..3 + n).ok_or("TLV cut short")?;
        if kind == TLV_SANDBOX_ID {
            return String::from_utf8(value.to_vec()).map_err(|_| "sandbox id is not UTF-8".into());
        }
        tlvs = &tlvs[3 + n..];
    }
    Err("the proxy header names no sandbox".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn round_trip_and_what_follows_is_untouched() {
        let mut bytes = encode("sbx-0123");
        bytes.extend_from_slice(b"POST /v1/messages HTTP/1.1\r\n");
        let mut r = &bytes[..];
        assert_eq!(read_sandbox_id(&mut r).await.unwrap(), "sbx-0123");
        assert_eq!(r, b"POST /v1/messages HTTP/1.1\r\n");
    }

    #[tokio::test]
    async fn plain_http_and_truncated_headers_are_refused() {
        let mut r = &b"POST /v1/messages HTTP/1.1\r\nhost: x\r\n\r\n"[..];
        assert!(read_sandbox_id(&mut r).await.is_err());
        let full = encode("sbx-1");
        let mut r = &full[..full.len() - 2];
        assert!(read_sandbox_id(&mut r).await.is_err());
        let mut other_tlv = full.clone();
        other_tlv[16] = 0xE1;
        let mut r = &other_tlv[..];
        assert!(read_sandbox_id(&mut r).await.is_err());
    }
}
