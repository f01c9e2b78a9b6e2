//! The pages of a column chunk encoded by `shard` itself ([`dictionary`],
//! [`plain`]), written with parquet's page writer (which writes their
//! headers) into the parts the shard writer splices into a file: headers
//! gathered into parts of their own, each page's data kept as its own
//! buffer instead of copied.
//!
//! [`dictionary`]: crate::dictionary
//! [`plain`]: crate::plain

use std::collections::VecDeque;
use std::io::Write;

use bytes::Bytes;
use parquet::column::page::{CompressedPage, PageWriter};
use parquet::errors::ParquetError;
use parquet::file::writer::{SerializedPageWriter, TrackedWrite};

/// A column chunk's pages as written: their bytes, and where and how large
/// they are in the chunk.
pub(crate) struct Written {
    /// Headers and data, in order (a page's data its own buffer, not copied).
    pub parts: Vec<Bytes>,
    pub dictionary_offset: Option<i64>,
    pub data_offset: Option<u64>,
    pub compressed: usize,
    pub uncompressed: usize,
}

/// Write a chunk's pages (its dictionary page first, if any) with parquet's
/// page writer, which writes their headers.
pub(crate) fn write_pages(
    dictionary_page: Option<CompressedPage>,
    pages: Vec<CompressedPage>,
) -> Result<Written, ParquetError> {
    let all = || dictionary_page.iter().chain(&pages);
    let mut sink = TrackedWrite::new(Parts {
        next: all()
            .map(|p| p.compressed_page().buffer().clone())
            .collect(),
        ..Default::default()
    });
    let mut page_writer = SerializedPageWriter::new(&mut sink);
    let (mut compressed, mut uncompressed) = (0, 0);
    let mut dictionary_offset = None;
    if let Some(page) = dictionary_page {
        let spec = page_writer.write_page(page)?;
        dictionary_offset = Some(spec.offset as i64);
        (compressed, uncompressed) = (spec.compressed_size, spec.uncompressed_size);
    }
    let mut data_offset = None;
    for page in pages {
        let spec = page_writer.write_page(page)?;
        data_offset.get_or_insert(spec.offset);
        compressed += spec.compressed_size;
        uncompressed += spec.uncompressed_size;
    }
    page_writer.close()?;
    Ok(Written {
        parts: sink.into_inner()?.finish(),
        dictionary_offset,
        data_offset,
        compressed,
        uncompressed,
    })
}

/// Where a chunk's page writer writes: the pages' headers are gathered into
/// parts of their own, and a page's data, handed on whole (the page writer
/// writes a page's data in one call, which a buffer at least as large passes
/// on as it is), is kept as the page's own buffer instead of copied.
#[derive(Default)]
struct Parts {
    parts: Vec<Bytes>,
    /// Bytes written since the last part.
    pending: Vec<u8>,
    /// The pages' data not written yet, in order.
    next: VecDeque<Bytes>,
}

impl Parts {
    fn finish(mut self) -> Vec<Bytes> {
        if !self.pending.is_empty() {
            self.parts.push(std::mem::take(&mut self.pending).into());
        }
        self.parts
    }
}

impl Write for Parts {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // The very memory of a page's data (a page small enough to be
        // buffered with its header arrives copied, and is copied here).
        let whole = (self.next.iter())
            .position(|d| d.as_ptr() == buf.as_ptr() && d.len() == buf.len() && !buf.is_empty());
        match whole {
            Some(k) => {
                let data = self
                    .next
                    .drain(..=k)
                    .next_back()
                    .expect("k is in the queue");
                if !self.pending.is_empty() {
                    self.parts.push(std::mem::take(&mut self.pending).into());
                }
                self.parts.push(data);
            }
            None => self.pending.extend_from_slice(buf),
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
