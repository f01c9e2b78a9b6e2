//! A column chunk's pages, read straight from its fetched bytes: page
//! headers parsed here (`shardfeed_format::thrift`), zstd pages decompressed with the
//! decode thread's own reusable context. Chunks of other codecs go through
//! parquet's `SerializedPageReader`.
//!
//! parquet's page reader builds a codec with a fresh zstd compression *and*
//! decompression context for every column chunk, and decodes page
//! statistics nobody reads: for tabular data (40 small chunks per row group)
//! that was 6% of the loader's time.
//!
//! Sizes in a header are untrusted: a page must lie inside its chunk, and no
//! page decompresses to more than the decoder's byte limit.

use std::cell::RefCell;
use std::sync::Arc;

use bytes::Bytes;
use parquet::basic::{Compression, Encoding};
use parquet::column::page::{Page, PageReader};
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::reader::ChunkReader;
use parquet::file::serialized_reader::SerializedPageReader;

use super::Limits;
use super::error::DecodeError;
use shardfeed_format::thrift::{DATA_PAGE, DATA_PAGE_V2, DICTIONARY_PAGE, Thrift};

thread_local! {
    static ZSTD: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// The pages of one column chunk.
pub(super) enum Pages<R: ChunkReader> {
    /// Read here (zstd or uncompressed chunks).
    Own(ChunkPages),
    /// Read by parquet (other codecs), for the column at this path.
    Parquet(Box<SerializedPageReader<R>>, String),
}

impl<R: ChunkReader + 'static> Pages<R> {
    /// The pages of `chunk` (of a row group with `rows` rows) in `file`.
    pub(super) fn open(
        file: Arc<R>,
        chunk: &ColumnChunkMetaData,
        rows: usize,
        limits: &Limits,
    ) -> Result<Self> {
        let zstd = match chunk.compression() {
            Compression::ZSTD(_) => true,
            Compression::UNCOMPRESSED => false,
            _ => {
                let path = chunk.column_path().string();
                let reader = SerializedPageReader::new(file, chunk, rows, None)
                    .map_err(|e| DecodeError::column(&path, e.to_string()))?;
                return Ok(Pages::Parquet(Box::new(reader), path));
            }
        };
        let (start, len) = chunk.byte_range();
        let len = usize::try_from(len).map_err(|_| {
            DecodeError::column(
                &chunk.column_path().string(),
                format!("a column chunk of {len} bytes"),
            )
        })?;
        // A part of a large row group was fetched as two pieces: the
        // dictionary page, and the data pages that cover the part right
        // after it (`super::pagemap`).
        let data = match file.get_bytes(start, len) {
            Ok(bytes) => bytes,
            Err(e) => {
                let data_at = chunk.data_page_offset() as u64;
                let dict = data_at
                    .checked_sub(start)
                    .and_then(|d| usize::try_from(d).ok());
                match dict.filter(|&d| d > 0 && d < len) {
                    Some(d) => {
                        let mut pages = ChunkPages::new(
                            file.get_bytes(data_at, len - d)?,
                            zstd,
                            chunk.column_path().string(),
                            limits.max_bytes,
                        );
                        pages.first = Some(file.get_bytes(start, d)?);
                        return Ok(Pages::Own(pages));
                    }
                    None => return Err(e),
                }
            }
        };
        Ok(Pages::Own(ChunkPages::new(
            data,
            zstd,
            chunk.column_path().string(),
            limits.max_bytes,
        )))
    }

    /// The next page, or `None` after the last.
    pub(super) fn next_page(&mut self) -> Result<Option<Page>> {
        match self {
            Pages::Own(pages) => pages.next_page(),
            // Its errors (a snappy, gzip, lz4 or brotli stream that does not
            // decompress) name the column, as the own pages' do.
            Pages::Parquet(reader, path) => reader
                .get_next_page()
                .map_err(|e| DecodeError::column(path, e.to_string())),
        }
    }
}

/// The pages in a column chunk's bytes.
pub(super) struct ChunkPages {
    /// A dictionary page fetched apart from the data pages, read first.
    first: Option<Bytes>,
    data: Bytes,
    at: usize,
    zstd: bool,
    path: String,
    /// No page decompresses to more bytes than this.
    max_bytes: usize,
}

fn encoding(value: i32) -> Option<Encoding> {
    Some(match value {
        0 => Encoding::PLAIN,
        2 => Encoding::PLAIN_DICTIONARY,
        3 => Encoding::RLE,
        // 4 is the deprecated BIT_PACKED (levels of old writers): such chunks
        // are not decoded here (see the table in `super`); a page that has it
        // (whatever its chunk's metadata lists) sends the column to
        // parquet's reader (`DecodeError::Unsupported`).
        5 => Encoding::DELTA_BINARY_PACKED,
        6 => Encoding::DELTA_LENGTH_BYTE_ARRAY,
        7 => Encoding::DELTA_BYTE_ARRAY,
        8 => Encoding::RLE_DICTIONARY,
        9 => Encoding::BYTE_STREAM_SPLIT,
        _ => return None,
    })
}

fn count(value: i32, what: &str) -> std::result::Result<u32, String> {
    u32::try_from(value).map_err(|_| format!("a page header has {value} {what}"))
}

impl ChunkPages {
    /// The pages in `data`, a whole column chunk (`zstd`: compressed with zstd,
    /// else uncompressed) of column `path`; no page may decompress to more
    /// than `max_bytes`.
    pub(super) fn new(data: Bytes, zstd: bool, path: String, max_bytes: usize) -> Self {
        ChunkPages {
            first: None,
            data,
            at: 0,
            zstd,
            path,
            max_bytes,
        }
    }

    /// The next page, or `None` after the last.
    pub(super) fn next_page(&mut self) -> Result<Option<Page>> {
        if let Some(first) = self.first.take() {
            // The dictionary page's bytes, read as a chunk of their own.
            let data = std::mem::replace(&mut self.data, first);
            let at = std::mem::replace(&mut self.at, 0);
            let page = self.next_page();
            self.data = data;
            self.at = at;
            return page;
        }
        loop {
            if self.at >= self.data.len() {
                return Ok(None);
            }
            let page_at = self.at;
            let err = |what: String| -> ParquetError {
                DecodeError::Column {
                    column: self.path.clone(),
                    offset: Some(page_at),
                    what,
                }
                .into()
            };
            let unsupported = |value: i32| -> ParquetError {
                DecodeError::Unsupported {
                    column: self.path.clone(),
                    what: format!("encoding {value}"),
                }
                .into()
            };
            let encoding = |value: i32| encoding(value).ok_or_else(|| unsupported(value));
            let mut thrift = Thrift::new(&self.data[self.at..]);
            let header = thrift.page_header().map_err(err)?;
            let body_start = self.at + thrift.at;
            let compressed = usize::try_from(header.compressed)
                .map_err(|_| err(format!("a page of {} bytes", header.compressed)))?;
            let uncompressed = usize::try_from(header.uncompressed)
                .map_err(|_| err(format!("a page of {} bytes", header.uncompressed)))?;
            let body_end = body_start
                .checked_add(compressed)
                .filter(|&end| end <= self.data.len())
                .ok_or_else(|| err("a page overruns its column chunk".into()))?;
            self.at = body_end;
            if !matches!(header.page_type, DATA_PAGE | DICTIONARY_PAGE | DATA_PAGE_V2) {
                continue; // index pages
            }
            if !header.has_body {
                return Err(err(format!(
                    "page type {} without its header",
                    header.page_type
                )));
            }
            if uncompressed > self.max_bytes {
                return Err(err(format!(
                    "a page of {uncompressed} bytes is larger than the loader's byte budget ({} bytes)",
                    self.max_bytes
                )));
            }
            let body = self.data.slice(body_start..body_end);
            // V2 pages keep their levels uncompressed ahead of the values.
            let (plain_prefix, compressed_body) = if header.page_type == DATA_PAGE_V2 {
                let levels = header
                    .def_bytes
                    .checked_add(header.rep_bytes)
                    .and_then(|l| usize::try_from(l).ok())
                    .filter(|&l| l <= compressed && l <= uncompressed)
                    .ok_or_else(|| err("implausible level lengths".into()))?;
                (levels, header.is_compressed)
            } else {
                (0, true)
            };
            let buf = if self.zstd && compressed_body {
                // zstd writes from the start of the vector it is given: V2
                // levels are put in front afterwards. The capacity is bounded
                // by `max_bytes` above, and zstd never writes past it.
                let mut out = Vec::with_capacity(uncompressed);
                if uncompressed > plain_prefix {
                    ZSTD.with(|cell| -> Result<()> {
                        let mut cell = cell.borrow_mut();
                        if cell.is_none() {
                            *cell =
                                Some(zstd::bulk::Decompressor::new().map_err(|e| {
                                    err(format!("cannot create a zstd context: {e}"))
                                })?);
                        }
                        let decompressor = cell.as_mut().expect("created above");
                        decompressor
                            .decompress_to_buffer(&body[plain_prefix..], &mut out)
                            .map_err(|e| err(format!("zstd: {e}")))?;
                        Ok(())
                    })?;
                }
                if plain_prefix > 0 {
                    out.splice(0..0, body[..plain_prefix].iter().copied());
                }
                if out.len() != uncompressed {
                    return Err(err(format!(
                        "a page decompressed to {} bytes, its header says {uncompressed}",
                        out.len()
                    )));
                }
                Bytes::from(out)
            } else {
                body
            };
            let num_values = count(header.num_values, "values").map_err(err)?;
            return Ok(Some(match header.page_type {
                DICTIONARY_PAGE => Page::DictionaryPage {
                    buf,
                    num_values,
                    encoding: encoding(header.encoding)?,
                    is_sorted: false,
                },
                DATA_PAGE => Page::DataPage {
                    buf,
                    num_values,
                    encoding: encoding(header.encoding)?,
                    def_level_encoding: encoding(header.def_encoding)?,
                    rep_level_encoding: encoding(header.rep_encoding)?,
                    statistics: None,
                },
                _ => Page::DataPageV2 {
                    buf,
                    num_values,
                    encoding: encoding(header.encoding)?,
                    num_nulls: count(header.num_nulls, "nulls").map_err(err)?,
                    num_rows: count(header.num_rows, "rows").map_err(err)?,
                    def_levels_byte_len: count(header.def_bytes, "level bytes").map_err(err)?,
                    rep_levels_byte_len: count(header.rep_bytes, "level bytes").map_err(err)?,
                    is_compressed: header.is_compressed,
                    statistics: None,
                },
            }));
        }
    }
}

/// A page of a flat column (no repetition levels).
pub(super) enum FlatPage {
    /// The dictionary: `num_values` plain values.
    Dictionary { buf: Bytes, num_values: usize },
    /// Values, plain or dictionary keys, of `num_values` rows; `def`: the
    /// definition levels (bit width 1) of a nullable column, whose values are
    /// those of the non-null rows only.
    Data {
        buf: Bytes,
        num_values: usize,
        encoding: Encoding,
        def: Option<Bytes>,
    },
}

/// The values part of `page`, a page of a flat column, and its definition
/// levels when the column is nullable (`def_levels`).
pub(super) fn flat_page(page: Page, def_levels: bool) -> std::result::Result<FlatPage, String> {
    Ok(match page {
        Page::DictionaryPage {
            buf,
            num_values,
            encoding,
            ..
        } => {
            if !matches!(encoding, Encoding::PLAIN | Encoding::PLAIN_DICTIONARY) {
                return Err(format!(
                    "dictionary page encoding {encoding} is not supported"
                ));
            }
            FlatPage::Dictionary {
                buf,
                num_values: num_values as usize,
            }
        }
        Page::DataPage {
            buf,
            num_values,
            encoding,
            def_level_encoding,
            ..
        } => {
            // Levels in another encoding, read as RLE, would give other
            // values without an error (BIT_PACKED ones went to parquet's
            // reader above).
            if def_levels && def_level_encoding != Encoding::RLE {
                return Err(format!(
                    "definition levels encoded as {def_level_encoding} are not supported"
                ));
            }
            let (buf, def) = if def_levels {
                // Length-prefixed RLE definition levels, then the values.
                let (def, rest) = length_prefixed(&buf, 0)?;
                (buf.slice(rest..), Some(def))
            } else {
                (buf, None)
            };
            FlatPage::Data {
                buf,
                num_values: num_values as usize,
                encoding,
                def,
            }
        }
        Page::DataPageV2 {
            buf,
            num_values,
            encoding,
            def_levels_byte_len,
            rep_levels_byte_len,
            ..
        } => {
            let (rep, def) = (rep_levels_byte_len as usize, def_levels_byte_len as usize);
            let skip = rep
                .checked_add(def)
                .filter(|&s| s <= buf.len())
                .ok_or_else(|| "levels overrun the page".to_string())?;
            FlatPage::Data {
                def: def_levels.then(|| buf.slice(rep..skip)),
                buf: buf.slice(skip..),
                num_values: num_values as usize,
                encoding,
            }
        }
    })
}

/// The 4-byte length-prefixed part of `buf` at `at`, and where it ends.
fn length_prefixed(buf: &Bytes, at: usize) -> std::result::Result<(Bytes, usize), String> {
    let overrun = || "levels overrun the page".to_string();
    let len_bytes = buf.get(at..at.checked_add(4).ok_or_else(overrun)?);
    let len = len_bytes
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
        .ok_or_else(overrun)?;
    let start = at + 4;
    let end = start
        .checked_add(len)
        .filter(|&end| end <= buf.len())
        .ok_or_else(overrun)?;
    Ok((buf.slice(start..end), end))
}

/// Repetition and definition levels of one data page of a repeated column,
/// and its values.
pub(super) struct LevelPage {
    pub rep: Bytes,
    pub def: Bytes,
    pub values: Bytes,
    pub num_levels: usize,
    pub encoding: Encoding,
}

/// Split a V1 data page's buffer into its length-prefixed RLE repetition and
/// definition levels and its values.
pub(super) fn v1_levels(buf: &Bytes) -> std::result::Result<(Bytes, Bytes, Bytes), String> {
    let (rep, at) = length_prefixed(buf, 0)?;
    let (def, at) = length_prefixed(buf, at)?;
    Ok((rep, def, buf.slice(at..)))
}
