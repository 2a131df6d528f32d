//! Connect protocol framing (JSON codec): every message of a streaming call is an
//! envelope of 1 flag byte, a 4-byte big-endian length and the JSON message. Flag bit
//! 0x02 marks the end-of-stream message (`{}` or `{"error": {...}}`); 0x01 = compressed.

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub const FLAG_COMPRESSED: u8 = 0x01;
pub const FLAG_END_STREAM: u8 = 0x02;
/// Largest message accepted from the server.
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// One enveloped message.
pub fn encode(flags: u8, msg: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + msg.len());
    b.put_u8(flags);
    b.put_u32(u32::try_from(msg.len()).expect("message under 4 GiB"));
    b.put_slice(msg);
    b.freeze()
}

#[derive(Debug, PartialEq, Eq)]
pub struct Frame {
    pub flags: u8,
    pub data: Bytes,
}

/// Incremental decoder: feed bytes as they arrive, take complete frames out.
#[derive(Default)]
pub struct Decoder {
    buf: BytesMut,
}

impl Decoder {
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, String> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_MESSAGE {
            return Err(format!("connect message of {len} bytes is too large"));
        }
        if flags & FLAG_COMPRESSED != 0 {
            return Err("compressed connect messages are not supported".into());
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        self.buf.advance(5);
        let data = self.buf.split_to(len).freeze();
        Ok(Some(Frame { flags, data }))
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_across_chunks() {
        let mut wire = encode(0, br#"{"a":1}"#).to_vec();
        wire.extend_from_slice(&encode(FLAG_END_STREAM, b"{}"));
        let mut d = Decoder::default();
        let mut frames = Vec::new();
        for byte in wire {
            d.push(&[byte]);
            while let Some(f) = d.next_frame().unwrap() {
                frames.push(f);
            }
        }
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].flags, 0);
        assert_eq!(&frames[0].data[..], br#"{"a":1}"#);
        assert_eq!(frames[1].flags, FLAG_END_STREAM);
        assert!(d.is_empty());
        assert_eq!(&encode(2, b"{}")[..5], &[2, 0, 0, 0, 2]);
    }
}
