//! The byte source the JPEG decoder reads an image from.
//!
//! `zune-core`'s `ZCursor` (with its `std` feature, which the workspace
//! enables) reads through `std::io::Read`: every 4-byte refill of the
//! Huffman bit buffer is a `memcpy` call of a length the compiler cannot
//! see, and every single byte a 1-byte `memcpy`. `perf` put those calls at
//! 3.6% of the image loader's CPU. [`Input`] behaves as `ZCursor` does over
//! a slice (same positions after every call, same bytes, the same
//! `NotEnoughBytes` errors), with reads the compiler folds to plain loads
//! once the decoder's fixed-size reads are inlined.

use zune_core::bytestream::{ZByteIoError, ZByteReaderTrait, ZSeekFrom};

/// An encoded image's bytes and the decoder's position in them.
pub(crate) struct Input<'a> {
    bytes: &'a [u8],
    /// May point past the end after a seek, as `ZCursor`'s may; every read
    /// clamps it.
    position: usize,
}

impl<'a> Input<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Input { bytes, position: 0 }
    }

    /// The bytes from the position on (none past the end).
    #[inline(always)]
    fn rest(&self) -> &'a [u8] {
        self.bytes.get(self.position..).unwrap_or(&[])
    }
}

impl ZByteReaderTrait for Input<'_> {
    /// The next byte, or 0 at the end (where the position stays).
    #[inline(always)]
    fn read_byte_no_error(&mut self) -> u8 {
        match self.rest().first() {
            Some(&b) => {
                self.position += 1;
                b
            }
            None => 0,
        }
    }

    /// `buf.len()` bytes, or an error that leaves the position where it was
    /// (the bytes there are copied to `buf`, as `ZCursor` does).
    #[inline(always)]
    fn read_exact_bytes(&mut self, buf: &mut [u8]) -> Result<(), ZByteIoError> {
        let rest = self.rest();
        match rest.get(..buf.len()) {
            Some(src) => {
                buf.copy_from_slice(src);
                self.position += buf.len();
                Ok(())
            }
            None => {
                buf[..rest.len()].copy_from_slice(rest);
                Err(ZByteIoError::NotEnoughBytes(rest.len(), buf.len()))
            }
        }
    }

    #[inline(always)]
    fn read_bytes(&mut self, buf: &mut [u8]) -> Result<usize, ZByteIoError> {
        let n = self.peek_bytes(buf)?;
        self.position += n;
        Ok(n)
    }

    #[inline(always)]
    fn peek_bytes(&mut self, buf: &mut [u8]) -> Result<usize, ZByteIoError> {
        let rest = self.rest();
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        Ok(n)
    }

    #[inline(always)]
    fn peek_exact_bytes(&mut self, buf: &mut [u8]) -> Result<(), ZByteIoError> {
        let position = self.position;
        self.read_exact_bytes(buf)?;
        self.position = position;
        Ok(())
    }

    fn z_seek(&mut self, from: ZSeekFrom) -> Result<u64, ZByteIoError> {
        let (base, offset) = match from {
            ZSeekFrom::Start(n) => {
                self.position = usize::try_from(n).map_err(ZByteIoError::from)?;
                return Ok(n);
            }
            ZSeekFrom::End(n) => (self.bytes.len(), n),
            ZSeekFrom::Current(n) => (self.position, n),
        };
        let offset = isize::try_from(offset).map_err(ZByteIoError::from)?;
        match base.checked_add_signed(offset) {
            Some(n) => {
                self.position = n;
                Ok(n as u64)
            }
            None => Err(ZByteIoError::SeekError("Negative seek")),
        }
    }

    #[inline(always)]
    fn is_eof(&mut self) -> Result<bool, ZByteIoError> {
        Ok(self.position >= self.bytes.len())
    }

    #[inline(always)]
    fn z_position(&mut self) -> Result<u64, ZByteIoError> {
        Ok(self.position as u64)
    }

    fn read_remaining(&mut self, sink: &mut Vec<u8>) -> Result<usize, ZByteIoError> {
        let rest = self.rest();
        sink.extend_from_slice(rest);
        self.position += rest.len();
        Ok(rest.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zune_core::bytestream::ZCursor;

    /// Seek `reader` to `start`, make call number `call` with a buffer of
    /// `len` bytes; the outcome, the buffer (or the bytes read to the end)
    /// and the position after it. Errors keep their counts; only a seek
    /// error's wording differs between readers (`ZCursor` wraps an
    /// io::Error), so seeks report their success only.
    fn call(reader: &mut dyn ZByteReaderTrait, start: u64, call: usize, len: usize) -> [String; 3] {
        reader.z_seek(ZSeekFrom::Start(start)).unwrap();
        let mut buf = vec![0xAA; len];
        let back = -(len as i64);
        let outcome = match call {
            0 => format!("{:?}", reader.read_exact_bytes(&mut buf)),
            1 => format!("{:?}", reader.read_bytes(&mut buf)),
            2 => format!("{:?}", reader.peek_bytes(&mut buf)),
            3 => format!("{:?}", reader.peek_exact_bytes(&mut buf)),
            4 => reader.read_byte_no_error().to_string(),
            5 => format!("{:?}", reader.is_eof()),
            6 => {
                buf.clear();
                format!("{:?}", reader.read_remaining(&mut buf).ok())
            }
            7 => format!("{:?}", reader.z_seek(ZSeekFrom::Current(back)).ok()),
            _ => format!("{:?}", reader.z_seek(ZSeekFrom::End(back)).ok()),
        };
        [
            outcome,
            format!("{buf:?}"),
            format!("{:?}", reader.z_position()),
        ]
    }

    /// Every call, from every position (past the end included), leaves both
    /// sources at the same position with the same bytes and outcome.
    #[test]
    fn reads_as_zcursor_does() {
        let bytes: Vec<u8> = (0..23u8).map(|i| i.wrapping_mul(37)).collect();
        for start in [0u64, 1, 5, 19, 20, 22, 23, 30] {
            for n in 0..9 {
                for len in [0usize, 1, 3, 4, 8, 40] {
                    assert_eq!(
                        call(&mut Input::new(&bytes), start, n, len),
                        call(&mut ZCursor::new(&bytes[..]), start, n, len),
                        "call {n}, start {start}, len {len}"
                    );
                }
            }
        }
    }
}
