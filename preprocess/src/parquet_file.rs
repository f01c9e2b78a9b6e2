//! A Parquet input file read for parquet's reader a row group at a time.
//!
//! parquet's reader over a `File` makes four system calls for every page
//! (duplicate the handle, seek, an 8 KiB buffered read for the page header,
//! then the page): on an input of small row groups (4,000 rows of 40 columns,
//! pages of a few KiB) `shard` made 237,000 reads for 407 MB, a third of its
//! CPU time. [`RowGroupFile`] reads the column chunks of a row group with one
//! positioned read and serves the pages from memory.
//!
//! Where the file can be mapped (`shardfeed_format::mapping`), pages are
//! served from the mapping instead, without the kernel's copy into a read
//! buffer (on the blob set of docs/performance-notes.md, `shard --no-shuffle` took
//! 10% less time); the pages of the blocks least recently read leave the
//! process as the reads go on. A file truncated or rewritten while it is read is found by
//! [`MapCheck::changed`], which the reader asks after every batch.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes};
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::reader::{ChunkReader, Length};
use shardfeed_format::mapping::{FileChange, MappedFile};

/// The most bytes one read brings in: a larger row group is read in pieces
/// of this size (as its pages are asked for), so memory stays bounded
/// whatever the input's row groups.
const MAX_READ: u64 = 2 << 20;

/// The most bytes of past reads kept. parquet's reader decodes a batch
/// column by column, and a batch spans several small row groups: it asks
/// for column 0 of each, then column 1 of each... so the reads of those row
/// groups are kept together (the oldest dropped first). A batch is about
/// 2 MiB of the input's pages, so this holds its row groups with room to
/// spare (and the reads of two large ones it starts and ends in). Too small
/// a value would read a row group again for each column.
const MAX_KEPT: usize = 3 * MAX_READ as usize + (2 << 20);

/// A Parquet file whose row groups are read whole (up to [`MAX_READ`]) the
/// first time one of their pages is asked for.
pub(crate) struct RowGroupFile {
    file: Arc<File>,
    len: u64,
    /// The byte ranges of the row groups' column chunks (from the footer,
    /// those inside the file), sorted by start.
    groups: Vec<Range<u64>>,
    /// Past reads (oldest first), and their offsets in the file.
    kept: Mutex<std::collections::VecDeque<(u64, Bytes)>>,
    /// Reads made.
    reads: std::sync::atomic::AtomicU64,
    /// The whole file mapped, where it could be.
    map: Option<Arc<MappedFile>>,
    /// Blocks of the mapping ([`MAX_READ`] bytes each, by index) touched
    /// lately, least recent first: past [`MAX_KEPT`] bytes of them besides
    /// the latest read's, the oldest leave the process.
    touched: Mutex<std::collections::VecDeque<u64>>,
}

/// A mapped input file, to check for changes after each batch read from it.
pub(crate) struct MapCheck {
    map: Arc<MappedFile>,
    file: Arc<File>,
}

impl MapCheck {
    /// How the file changed since it was mapped, if it did: bytes read from
    /// it since may be zeros or another file's.
    pub(crate) fn changed(&self) -> Option<FileChange> {
        self.map.changed(&self.file)
    }
}

/// A range of a mapped file handed to parquet's reader.
struct MapRange {
    map: Arc<MappedFile>,
    range: Range<usize>,
}

impl AsRef<[u8]> for MapRange {
    fn as_ref(&self) -> &[u8] {
        // Inside the mapping: checked where it is made.
        self.map.get(self.range.clone()).unwrap_or_default()
    }
}

impl RowGroupFile {
    /// `file`, whose footer is `metadata`; mapped where `mapped` and the
    /// system allow it.
    pub(crate) fn new(file: File, metadata: &ParquetMetaData, mapped: bool) -> io::Result<Self> {
        let len = file.metadata()?.len();
        let map = mapped
            .then(|| MappedFile::map(&file, len))
            .flatten()
            .map(Arc::new);
        let mut groups: Vec<Range<u64>> = metadata
            .row_groups()
            .iter()
            .filter_map(|rg| {
                let (mut first, mut end) = (u64::MAX, 0);
                for c in rg.columns() {
                    let (start, n) = c.byte_range();
                    first = first.min(start);
                    end = end.max(start.checked_add(n)?);
                }
                // A footer's offsets are untrusted: a range outside the file
                // is left out (its pages are then read where asked, and the
                // reader reports what it finds there).
                (first < end && end <= len).then_some(first..end)
            })
            .collect();
        groups.sort_by_key(|r| r.start);
        Ok(RowGroupFile {
            file: Arc::new(file),
            len,
            groups,
            kept: Mutex::new(Default::default()),
            reads: Default::default(),
            map,
            touched: Default::default(),
        })
    }

    /// The check of its mapping, where it is mapped.
    pub(crate) fn map_check(&self) -> Option<MapCheck> {
        self.map.as_ref().map(|map| MapCheck {
            map: map.clone(),
            file: self.file.clone(),
        })
    }

    /// Note the blocks of `range` (of the file, mapped) as the latest used;
    /// the pages of the least recent ones past [`MAX_KEPT`] bytes leave the
    /// process (a later read maps them again), so that it holds about as
    /// much of the file as the reads kept on the other path, whatever order
    /// the reader goes in.
    fn touch(&self, map: &MappedFile, range: Range<u64>) {
        let (first, last) = (
            range.start / MAX_READ,
            range.end.saturating_sub(1).max(range.start) / MAX_READ,
        );
        let mut touched = self.touched.lock().unwrap_or_else(|p| p.into_inner());
        touched.retain(|b| !(first..=last).contains(b));
        touched.extend(first..=last);
        let keep = (MAX_KEPT as u64 / MAX_READ).saturating_add(last - first + 1);
        while touched.len() as u64 > keep {
            let Some(block) = touched.pop_front() else {
                break;
            };
            let at = |b: u64| usize::try_from(b.saturating_mul(MAX_READ)).unwrap_or(usize::MAX);
            map.drop_pages(at(block)..at(block + 1));
        }
    }

    /// Where a read from `start` ends: the end of the row group holding
    /// `start` (at most [`MAX_READ`] bytes on, unless `want_end` is further),
    /// within the file.
    fn end_of_read(&self, start: u64, want_end: u64) -> u64 {
        let i = self.groups.partition_point(|g| g.start <= start);
        // Outside the footer's row groups (a damaged footer): 64 KiB, so a
        // page header there is not read a few bytes per system call.
        let group_end = match i.checked_sub(1).map(|i| &self.groups[i]) {
            Some(g) if start < g.end => g.end,
            _ => start.saturating_add(64 << 10),
        };
        group_end
            .min(start.saturating_add(MAX_READ))
            .max(want_end)
            .min(self.len)
    }

    /// The bytes of the file from `start` on, at least `min` of them, to the
    /// end of the row group holding `start` (at most [`MAX_READ`] bytes
    /// unless `min` is more): from the mapping where the file is mapped,
    /// else from a kept read where one holds them, else from a new read.
    fn bytes_from(&self, start: u64, min: usize) -> parquet::errors::Result<Bytes> {
        let min = min as u64;
        let want_end = start.checked_add(min).filter(|&end| end <= self.len);
        let Some(want_end) = want_end else {
            return Err(ParquetError::EOF(format!(
                "{min} bytes at offset {start} lie past the end of the file ({} bytes)",
                self.len
            )));
        };
        let end = self.end_of_read(start, want_end);
        if let Some(map) = &self.map {
            // Within the file (`want_end <= len`), so within the mapping.
            let range = usize::try_from(start).unwrap_or(usize::MAX)
                ..usize::try_from(end).unwrap_or(usize::MAX);
            if map.get(range.clone()).is_some() {
                self.touch(map, start..end);
                return Ok(Bytes::from_owner(MapRange {
                    map: map.clone(),
                    range,
                }));
            }
        }
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        for (at, bytes) in kept.iter().rev() {
            let end = at + bytes.len() as u64;
            if *at <= start && start < end && want_end <= end {
                return Ok(bytes.slice((start - at) as usize..));
            }
        }
        // Read into fresh capacity without zeroing it first (`read_to_end`
        // tracks what is filled); the handle's cursor is only moved here,
        // under the lock (a `PageRead` reads at its own offsets).
        let n = end - start;
        let mut buf = Vec::with_capacity(n as usize);
        let mut file: &File = &self.file;
        file.seek(SeekFrom::Start(start))?;
        file.take(n).read_to_end(&mut buf)?;
        if buf.len() as u64 != n {
            return Err(ParquetError::EOF(format!(
                "{n} bytes at offset {start}: the file ended after {}",
                buf.len()
            )));
        }
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let bytes = Bytes::from(buf);
        kept.push_back((start, bytes.clone()));
        let mut total: usize = kept.iter().map(|(_, b)| b.len()).sum();
        while total > MAX_KEPT && kept.len() > 1 {
            let (_, dropped) = kept.pop_front().expect("more than one kept");
            total -= dropped.len();
        }
        Ok(bytes)
    }
}

impl Length for RowGroupFile {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for RowGroupFile {
    type T = PageRead;

    fn get_read(&self, start: u64) -> parquet::errors::Result<PageRead> {
        let head = if start < self.len {
            self.bytes_from(start, 1)?
        } else {
            Bytes::new()
        };
        Ok(PageRead {
            next: start + head.len() as u64,
            head: head.reader(),
            file: self.file.clone(),
        })
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        Ok(self.bytes_from(start, length)?.slice(..length))
    }
}

/// A reader from an offset of a [`RowGroupFile`]: the bytes already read,
/// then (should a page header run past them) the file itself.
pub(crate) struct PageRead {
    head: bytes::buf::Reader<Bytes>,
    file: Arc<File>,
    /// The file offset after `head`.
    next: u64,
}

impl Read for PageRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.head.read(buf)?;
        if n > 0 || buf.is_empty() {
            return Ok(n);
        }
        let n = self.file.read_at(buf, self.next)?;
        self.next += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A file of `groups` row-group ranges and filler bytes `i as u8`.
    fn file_of(len: usize, groups: &[(u64, u64)]) -> RowGroupFile {
        file_mapped_or_not(len, groups, false)
    }

    /// [`file_of`], its pages served from a mapping where `mapped`.
    fn file_mapped_or_not(len: usize, groups: &[(u64, u64)], mapped: bool) -> RowGroupFile {
        let mut f = tempfile::tempfile().unwrap();
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        f.write_all(&bytes).unwrap();
        let map = mapped.then(|| Arc::new(MappedFile::map(&f, len as u64).expect("mapped")));
        RowGroupFile {
            file: Arc::new(f),
            len: len as u64,
            groups: groups.iter().map(|&(a, b)| a..b).collect(),
            kept: Mutex::new(Default::default()),
            reads: Default::default(),
            map,
            touched: Default::default(),
        }
    }

    fn expected(range: Range<usize>) -> Vec<u8> {
        range.map(|i| (i % 251) as u8).collect()
    }

    /// Pages come back byte for byte wherever they lie, read or mapped:
    /// inside a row group, across its end, in a group larger than one read,
    /// outside any group, after the blocks read least lately were dropped; a reader runs
    /// on past the bytes served into the file itself.
    #[test]
    fn pages_read_from_memory_match_the_file() {
        for mapped in [false, true] {
            pages_match_the_file(mapped);
        }
    }

    fn pages_match_the_file(mapped: bool) {
        let len = (MAX_READ as usize) * 2 + MAX_KEPT + 5000;
        let big = MAX_READ * 2 + MAX_KEPT as u64 + 4000;
        let f = file_mapped_or_not(len, &[(100, 3000), (3000, big)], mapped);
        for (start, n) in [
            (100u64, 50usize),
            (150, 2850),
            (2990, 100),
            (3000, 10),
            (MAX_READ + 2990, 20),
            (big - 100, 50),
            (5, 10),
            (200, 1000),
            (len as u64 - 7, 7),
        ] {
            let got = f.get_bytes(start, n).unwrap();
            assert_eq!(
                got,
                expected(start as usize..start as usize + n),
                "{start}+{n}"
            );
        }
        let mut r = f.get_read(2000).unwrap();
        let mut all = Vec::new();
        r.read_to_end(&mut all).unwrap();
        assert_eq!(all, expected(2000..len));
    }

    /// A mapped file keeps the blocks read lately, at most [`MAX_KEPT`]
    /// bytes of them besides the latest read's, and drops the least recent
    /// (whatever order the reads go in); every read still sees its bytes.
    #[test]
    fn a_mapped_file_keeps_the_blocks_read_lately() {
        let blocks = 12u64;
        let len = (blocks * MAX_READ) as usize;
        let f = file_mapped_or_not(len, &[(0, len as u64)], true);
        let keep = MAX_KEPT as u64 / MAX_READ;
        let touched = || {
            f.touched
                .lock()
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<_>>()
        };
        for b in 0..blocks {
            let at = b * MAX_READ + 10;
            let got = f.get_bytes(at, 100).unwrap();
            assert_eq!(got, expected(at as usize..at as usize + 100));
        }
        assert_eq!(touched(), (blocks - 1 - keep..blocks).collect::<Vec<_>>());
        // Back to an early block, then a read across three blocks: the
        // latest last, the oldest gone.
        let got = f.get_bytes(MAX_READ + 5, 10).unwrap();
        assert_eq!(got, expected(MAX_READ as usize + 5..MAX_READ as usize + 15));
        let (start, n) = (3 * MAX_READ - 1, (MAX_READ + 2) as usize);
        let got = f.get_bytes(start, n).unwrap();
        assert_eq!(got, expected(start as usize..start as usize + n));
        let t = touched();
        assert_eq!(&t[t.len() - 3..], &[2, 3, 4]);
        assert_eq!(t.len() as u64, keep + 3);
        assert!(t.contains(&1) && !t.contains(&0));
    }

    /// parquet's reader asks for column 0 of each row group a batch spans,
    /// then column 1 of each...: each row group is read once.
    #[test]
    fn columns_read_across_row_groups_read_each_group_once() {
        let (columns, chunk, groups) = (40u64, 1000u64, 6u64);
        let ranges: Vec<(u64, u64)> = (0..groups)
            .map(|g| (4 + g * columns * chunk, 4 + (g + 1) * columns * chunk))
            .collect();
        let len = 4 + groups * columns * chunk + 100;
        let f = file_of(len as usize, &ranges);
        for c in 0..columns {
            for &(start, _) in &ranges {
                let at = start + c * chunk;
                let mut header = [0u8; 16];
                f.get_read(at).unwrap().read_exact(&mut header).unwrap();
                assert_eq!(header[..], expected(at as usize..at as usize + 16)[..]);
                let page = f.get_bytes(at + 16, (chunk - 16) as usize).unwrap();
                assert_eq!(page, expected(at as usize + 16..(at + chunk) as usize));
            }
        }
        assert_eq!(f.reads.load(std::sync::atomic::Ordering::Relaxed), groups);
    }

    /// Asking for bytes past the end is an error, before anything is
    /// allocated for them.
    #[test]
    fn bytes_past_the_end_are_an_error() {
        let f = file_of(1000, &[(0, 1000)]);
        assert!(f.get_bytes(990, 20).is_err());
        assert!(f.get_bytes(10, usize::MAX).is_err());
        let mut r = f.get_read(1000).unwrap();
        assert_eq!(r.read(&mut [0u8; 8]).unwrap(), 0);
    }
}
