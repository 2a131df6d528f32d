//! A buffer for reading a command's pipes that starts at a page and doubles (up to its
//! bound) each time a read fills it. A command that prints a line, or nothing, holds a
//! page per pipe while it runs, not the bound: with two 64 KiB buffers per command, a
//! hundred forks collecting their patches at once held 12.5 MiB of the provisioner's
//! 17 MiB heap peak (heaptrack, `bench-fanout` at N = 1,000). A command that floods its
//! pipe is still read in gulps of the bound after a few reads.

const FIRST: usize = 4096;

pub(crate) struct ReadBuf {
    buf: Vec<u8>,
    max: usize,
}

impl ReadBuf {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            buf: vec![0; FIRST.min(max).max(1)],
            max,
        }
    }

    /// Where the next read goes.
    pub(crate) fn space(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// The `n` bytes the last read put in [`Self::space`]. A read that filled it makes
    /// the next one's room twice as large.
    pub(crate) fn took(&mut self, n: usize) -> &[u8] {
        let len = self.buf.len();
        if n == len && len < self.max {
            self.buf.resize(len.saturating_mul(2).min(self.max), 0);
        }
        &self.buf[..n]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_at_a_page_and_grows_only_when_filled_up_to_its_bound() {
        let mut b = ReadBuf::new(64 * 1024);
        assert_eq!(b.space().len(), 4096);
        b.space()[..3].copy_from_slice(b"abc");
        assert_eq!(b.took(3), b"abc");
        assert_eq!(b.space().len(), 4096, "a short read does not grow it");
        let mut room = b.space().len();
        for _ in 0..10 {
            b.space().fill(b'x');
            assert_eq!(b.took(room).len(), room, "what a full read put in is kept");
            room = b.space().len();
        }
        assert_eq!(room, 64 * 1024, "doubled up to the bound, never past it");
    }
}
