//! The byte ranges of a file that were fetched, as parquet's `ChunkReader`:
//! reads outside them are errors, never reads of bytes that are not there.

use bytes::{Buf, Bytes};
use parquet::errors::Result;

use super::error::DecodeError;
use parquet::file::reader::{ChunkReader, Length};

/// Fetched ranges `(file offset, bytes)` of a file of `len` bytes.
#[derive(Clone)]
pub(crate) struct SparseFile {
    len: u64,
    /// Sorted by offset.
    chunks: Vec<(u64, Bytes)>,
}

impl SparseFile {
    /// The ranges `chunks` (in any order) of a file of `len` bytes.
    pub(crate) fn new(len: u64, mut chunks: Vec<(u64, Bytes)>) -> Self {
        chunks.sort_by_key(|(start, _)| *start);
        SparseFile { len, chunks }
    }

    /// The fetched chunk holding byte `start`, and `start`'s offset in it.
    fn holding(&self, start: u64) -> Option<(&Bytes, usize)> {
        let i = self.chunks.partition_point(|(s, _)| *s <= start);
        let (s, bytes) = self.chunks.get(i.checked_sub(1)?)?;
        let offset = usize::try_from(start - s).ok()?;
        (offset < bytes.len()).then_some((bytes, offset))
    }
}

impl Length for SparseFile {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for SparseFile {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> Result<Self::T> {
        let (bytes, offset) = self.holding(start).ok_or(DecodeError::NotFetched {
            start,
            end: start.saturating_add(1),
        })?;
        Ok(bytes.slice(offset..).reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> Result<Bytes> {
        let not_fetched = || DecodeError::NotFetched {
            start,
            end: start.saturating_add(length as u64),
        };
        if length == 0 {
            return Ok(Bytes::new());
        }
        let (bytes, offset) = self.holding(start).ok_or_else(not_fetched)?;
        let end = offset
            .checked_add(length)
            .filter(|&end| end <= bytes.len())
            .ok_or_else(not_fetched)?;
        Ok(bytes.slice(offset..end))
    }
}
