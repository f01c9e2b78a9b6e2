//! A column chunk's pages, read straight from its fetched bytes: page headers
//! parsed here (Thrift compact protocol), zstd pages decompressed with the
//! decode thread's own reusable context.
//!
//! parquet's `SerializedPageReader` builds a codec with a fresh zstd
//! compression *and* decompression context for every column chunk, and
//! decodes page statistics nobody reads: for tabular data (40 small chunks
//! per row group) that was 6% of the loader's time. Chunks with other
//! codecs go through parquet's reader.

use std::cell::RefCell;
use std::sync::Arc;

use bytes::Bytes;
use parquet::basic::{Compression, Encoding};
use parquet::column::page::{Page, PageReader};
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::reader::ChunkReader;
use parquet::file::serialized_reader::SerializedPageReader;

thread_local! {
    static ZSTD: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

fn general(message: String) -> ParquetError {
    ParquetError::General(message)
}

/// The pages of one column chunk.
pub(crate) enum Pages<R: ChunkReader> {
    /// Read here (zstd or uncompressed chunks).
    Own(ChunkPages),
    /// Read by parquet (other codecs).
    Parquet(Box<SerializedPageReader<R>>),
}

impl<R: ChunkReader + 'static> Pages<R> {
    /// The pages of `chunk` (of a row group with `rows` rows) in `file`.
    pub(crate) fn open(file: Arc<R>, chunk: &ColumnChunkMetaData, rows: usize) -> Result<Self> {
        let zstd = match chunk.compression() {
            Compression::ZSTD(_) => true,
            Compression::UNCOMPRESSED => false,
            _ => {
                return Ok(Pages::Parquet(Box::new(SerializedPageReader::new(
                    file, chunk, rows, None,
                )?)));
            }
        };
        let (start, len) = chunk.byte_range();
        Ok(Pages::Own(ChunkPages::new(
            file.get_bytes(start, len as usize)?,
            zstd,
            chunk.column_path().string(),
        )))
    }

    /// The next page, or `None` after the last.
    pub(crate) fn next_page(&mut self) -> Result<Option<Page>> {
        match self {
            Pages::Own(pages) => pages.next_page(),
            Pages::Parquet(reader) => reader.get_next_page(),
        }
    }
}

/// The pages in a column chunk's bytes.
pub(crate) struct ChunkPages {
    data: Bytes,
    at: usize,
    zstd: bool,
    path: String,
}

/// Page types (parquet.thrift `PageType`).
const DATA_PAGE: i32 = 0;
const DICTIONARY_PAGE: i32 = 2;
const DATA_PAGE_V2: i32 = 3;

/// The fields of a page header this crate uses.
#[derive(Default)]
struct Header {
    page_type: i32,
    uncompressed: i32,
    compressed: i32,
    num_values: i32,
    encoding: i32,
    def_encoding: i32,
    rep_encoding: i32,
    num_nulls: i32,
    num_rows: i32,
    def_bytes: i32,
    rep_bytes: i32,
    is_compressed: bool,
    has_body: bool,
}

fn encoding(value: i32) -> Result<Encoding> {
    Ok(match value {
        0 => Encoding::PLAIN,
        2 => Encoding::PLAIN_DICTIONARY,
        3 => Encoding::RLE,
        // 4 is the deprecated BIT_PACKED (levels of old writers): such chunks
        // are not decoded here (`pages::supported`).
        5 => Encoding::DELTA_BINARY_PACKED,
        6 => Encoding::DELTA_LENGTH_BYTE_ARRAY,
        7 => Encoding::DELTA_BYTE_ARRAY,
        8 => Encoding::RLE_DICTIONARY,
        9 => Encoding::BYTE_STREAM_SPLIT,
        other => return Err(general(format!("unknown encoding {other}"))),
    })
}

fn count(value: i32, what: &str) -> Result<u32> {
    u32::try_from(value).map_err(|_| general(format!("a page header has {value} {what}")))
}

impl ChunkPages {
    /// The pages in `data`, a whole column chunk (`zstd`: compressed with zstd,
    /// else uncompressed) of column `path`.
    pub(crate) fn new(data: Bytes, zstd: bool, path: String) -> Self {
        ChunkPages {
            data,
            at: 0,
            zstd,
            path,
        }
    }

    /// The next page, or `None` after the last.
    pub(crate) fn next_page(&mut self) -> Result<Option<Page>> {
        loop {
            if self.at >= self.data.len() {
                return Ok(None);
            }
            let err = |e: String| general(format!("column {}: {e}", self.path));
            let mut thrift = Thrift {
                data: &self.data[self.at..],
                at: 0,
            };
            let header = thrift.page_header().map_err(err)?;
            let body_start = self.at + thrift.at;
            let compressed = usize::try_from(header.compressed)
                .map_err(|_| err(format!("a page of {} bytes", header.compressed)))?;
            let uncompressed = usize::try_from(header.uncompressed)
                .map_err(|_| err(format!("a page of {} bytes", header.uncompressed)))?;
            if body_start + compressed > self.data.len() {
                return Err(err("a page overruns its column chunk".into()));
            }
            self.at = body_start + compressed;
            if !matches!(header.page_type, DATA_PAGE | DICTIONARY_PAGE | DATA_PAGE_V2) {
                continue; // index pages
            }
            if !header.has_body {
                return Err(err(format!(
                    "page type {} without its header",
                    header.page_type
                )));
            }
            let body = self.data.slice(body_start..body_start + compressed);
            // V2 pages keep their levels uncompressed ahead of the values.
            let (plain_prefix, compressed_body) = if header.page_type == DATA_PAGE_V2 {
                let levels = usize::try_from(header.def_bytes + header.rep_bytes)
                    .ok()
                    .filter(|&l| l <= compressed && l <= uncompressed)
                    .ok_or_else(|| err("implausible level lengths".into()))?;
                (levels, header.is_compressed)
            } else {
                (0, true)
            };
            let buf = if self.zstd && compressed_body {
                // zstd writes from the start of the vector it is given: V2
                // levels are put in front afterwards.
                let mut out = Vec::with_capacity(uncompressed);
                if uncompressed > plain_prefix {
                    ZSTD.with(|cell| -> Result<()> {
                        let mut cell = cell.borrow_mut();
                        if cell.is_none() {
                            *cell = Some(zstd::bulk::Decompressor::new().map_err(|e| {
                                general(format!("cannot create a zstd context: {e}"))
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
            let num_values = count(header.num_values, "values")?;
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
                    num_nulls: count(header.num_nulls, "nulls")?,
                    num_rows: count(header.num_rows, "rows")?,
                    def_levels_byte_len: count(header.def_bytes, "level bytes")?,
                    rep_levels_byte_len: count(header.rep_bytes, "level bytes")?,
                    is_compressed: header.is_compressed,
                    statistics: None,
                },
            }));
        }
    }
}

/// Thrift compact protocol types.
const T_TRUE: u8 = 1;
const T_FALSE: u8 = 2;
const T_BYTE: u8 = 3;
const T_I16: u8 = 4;
const T_I32: u8 = 5;
const T_I64: u8 = 6;
const T_DOUBLE: u8 = 7;
const T_BINARY: u8 = 8;
const T_LIST: u8 = 9;
const T_SET: u8 = 10;
const T_MAP: u8 = 11;
const T_STRUCT: u8 = 12;

/// Nesting allowed in skipped values (a corrupt header cannot recurse deeper).
const MAX_DEPTH: usize = 32;

/// A reader of the Thrift compact protocol.
struct Thrift<'a> {
    data: &'a [u8],
    at: usize,
}

type ThriftResult<T> = std::result::Result<T, String>;

impl Thrift<'_> {
    fn byte(&mut self) -> ThriftResult<u8> {
        let b = *self
            .data
            .get(self.at)
            .ok_or_else(|| "a page header overruns its column chunk".to_string())?;
        self.at += 1;
        Ok(b)
    }

    fn varint(&mut self) -> ThriftResult<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("a varint in a page header is too long".into())
    }

    fn i32(&mut self) -> ThriftResult<i32> {
        let v = self.varint()?;
        let v = ((v >> 1) as i64) ^ -((v & 1) as i64);
        i32::try_from(v).map_err(|_| format!("{v} does not fit a page header's i32"))
    }

    /// The next field's (id, type), or `None` at the end of the struct.
    fn field(&mut self, last: &mut i16) -> ThriftResult<Option<(i16, u8)>> {
        let b = self.byte()?;
        let ty = b & 0x0f;
        if ty == 0 {
            return Ok(None);
        }
        let delta = (b >> 4) as i16;
        let id = if delta == 0 {
            let v = self.varint()?;
            ((v >> 1) as i64 ^ -((v & 1) as i64)) as i16
        } else {
            last.wrapping_add(delta)
        };
        *last = id;
        Ok(Some((id, ty)))
    }

    fn skip(&mut self, ty: u8, depth: usize) -> ThriftResult<()> {
        if depth > MAX_DEPTH {
            return Err("a page header nests too deeply".into());
        }
        match ty {
            T_TRUE | T_FALSE => {}
            T_BYTE => {
                self.byte()?;
            }
            T_I16 | T_I32 | T_I64 => {
                self.varint()?;
            }
            T_DOUBLE => self.advance(8)?,
            T_BINARY => {
                let len = self.varint()? as usize;
                self.advance(len)?;
            }
            T_LIST | T_SET => {
                let b = self.byte()?;
                let size = match b >> 4 {
                    15 => self.varint()? as usize,
                    n => n as usize,
                };
                let elem = b & 0x0f;
                for _ in 0..size {
                    if elem == T_TRUE || elem == T_FALSE {
                        self.byte()?;
                    } else {
                        self.skip(elem, depth + 1)?;
                    }
                }
            }
            T_MAP => {
                let size = self.varint()? as usize;
                if size > 0 {
                    let kv = self.byte()?;
                    for _ in 0..size {
                        self.skip(kv >> 4, depth + 1)?;
                        self.skip(kv & 0x0f, depth + 1)?;
                    }
                }
            }
            T_STRUCT => {
                let mut last = 0;
                while let Some((_, t)) = self.field(&mut last)? {
                    self.skip(t, depth + 1)?;
                }
            }
            other => return Err(format!("unknown Thrift type {other} in a page header")),
        }
        Ok(())
    }

    fn advance(&mut self, n: usize) -> ThriftResult<()> {
        if self.at + n > self.data.len() {
            return Err("a page header overruns its column chunk".into());
        }
        self.at += n;
        Ok(())
    }

    /// parquet.thrift `PageHeader`, with its data, dictionary or V2 header.
    fn page_header(&mut self) -> ThriftResult<Header> {
        let mut h = Header {
            is_compressed: true,
            ..Header::default()
        };
        let mut last = 0;
        while let Some((id, ty)) = self.field(&mut last)? {
            match (id, ty) {
                (1, T_I32) => h.page_type = self.i32()?,
                (2, T_I32) => h.uncompressed = self.i32()?,
                (3, T_I32) => h.compressed = self.i32()?,
                (5 | 7 | 8, T_STRUCT) => {
                    h.has_body |= match id {
                        5 => h.page_type == DATA_PAGE,
                        7 => h.page_type == DICTIONARY_PAGE,
                        _ => h.page_type == DATA_PAGE_V2,
                    };
                    let mut last = 0;
                    while let Some((field, t)) = self.field(&mut last)? {
                        match (id, field, t) {
                            (_, 1, T_I32) => h.num_values = self.i32()?,
                            (5 | 7, 2, T_I32) | (8, 4, T_I32) => h.encoding = self.i32()?,
                            (5, 3, T_I32) => h.def_encoding = self.i32()?,
                            (5, 4, T_I32) => h.rep_encoding = self.i32()?,
                            (8, 2, T_I32) => h.num_nulls = self.i32()?,
                            (8, 3, T_I32) => h.num_rows = self.i32()?,
                            (8, 5, T_I32) => h.def_bytes = self.i32()?,
                            (8, 6, T_I32) => h.rep_bytes = self.i32()?,
                            (8, 7, T_TRUE) => h.is_compressed = true,
                            (8, 7, T_FALSE) => h.is_compressed = false,
                            (_, _, t) => self.skip(t, 1)?,
                        }
                    }
                }
                (_, t) => self.skip(t, 0)?,
            }
        }
        Ok(h)
    }
}
