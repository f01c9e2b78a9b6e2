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

    /// Every call, from every position (past the end included), leaves both
    /// sources at the same position with the same bytes and outcome.
    #[test]
    fn reads_as_zcursor_does() {
        let bytes: Vec<u8> = (0..23u8).map(|i| i.wrapping_mul(37)).collect();
        let seeks = [0u64, 1, 5, 19, 20, 22, 23, 30];
        for &start in &seeks {
            for call in 0..9 {
                for len in [0usize, 1, 3, 4, 8, 40] {
                    let mut ours = Input::new(&bytes);
                    let mut theirs = ZCursor::new(&bytes[..]);
                    ours.z_seek(ZSeekFrom::Start(start)).unwrap();
                    theirs.z_seek(ZSeekFrom::Start(start)).unwrap();
                    let (mut a, mut b) = (vec![0xAA; len], vec![0xAA; len]);
                    let (x, y) = match call {
                        0 => (
                            format!("{:?}", ours.read_exact_bytes(&mut a)),
                            format!("{:?}", theirs.read_exact_bytes(&mut b)),
                        ),
                        1 => (
                            format!("{:?}", ours.read_bytes(&mut a)),
                            format!("{:?}", theirs.read_bytes(&mut b)),
                        ),
                        2 => (
                            format!("{:?}", ours.peek_bytes(&mut a)),
                            format!("{:?}", theirs.peek_bytes(&mut b)),
                        ),
                        3 => (
                            format!("{:?}", ours.peek_exact_bytes(&mut a)),
                            format!("{:?}", theirs.peek_exact_bytes(&mut b)),
                        ),
                        4 => (
                            ours.read_byte_no_error().to_string(),
                            theirs.read_byte_no_error().to_string(),
                        ),
                        5 => (
                            format!("{:?}", ours.is_eof()),
                            format!("{:?}", theirs.is_eof()),
                        ),
                        6 => {
                            let (mut s, mut t) = (Vec::new(), Vec::new());
                            let r = (ours.read_remaining(&mut s), theirs.read_remaining(&mut t));
                            assert_eq!(s, t);
                            (format!("{:?}", r.0.ok()), format!("{:?}", r.1.ok()))
                        }
                        7 => (
                            format!("{:?}", ours.z_seek(ZSeekFrom::Current(-(len as i64))).ok()),
                            format!(
                                "{:?}",
                                theirs.z_seek(ZSeekFrom::Current(-(len as i64))).ok()
                            ),
                        ),
                        _ => (
                            format!("{:?}", ours.z_seek(ZSeekFrom::End(-(len as i64))).ok()),
                            format!("{:?}", theirs.z_seek(ZSeekFrom::End(-(len as i64))).ok()),
                        ),
                    };
                    let what = format!("call {call}, start {start}, len {len}");
                    // Errors carry the same counts; only the seek error's
                    // wording differs (`ZCursor` wraps an io::Error).
                    assert_eq!(x, y, "{what}");
                    assert_eq!(a, b, "{what}");
                    assert_eq!(
                        ours.z_position().unwrap(),
                        theirs.z_position().unwrap(),
                        "{what}"
                    );
                }
            }
        }
    }
}
