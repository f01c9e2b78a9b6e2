//! Parquet page headers: parquet.thrift's `PageHeader`, read with the Thrift
//! compact protocol straight from a column chunk's bytes (the loader's own
//! reader decodes pages with it; `shard` checks its inputs' pages with it
//! before parquet's reader sizes buffers by them).
//!
//! Every length and count in a header is untrusted: cursor moves are checked
//! against the bytes present (a length near 2^64 cannot wrap the cursor),
//! nesting is bounded, and every element of a skipped list consumes at least
//! one byte, so a forged header ends in an error after at most as many steps
//! as it has bytes.

/// parquet.thrift `PageType` of a data page (V1).
pub const DATA_PAGE: i32 = 0;
/// `PageType` of a dictionary page.
pub const DICTIONARY_PAGE: i32 = 2;
/// `PageType` of a V2 data page.
pub const DATA_PAGE_V2: i32 = 3;

/// The fields of a page header this reader uses.
#[derive(Debug, Default)]
pub struct Header {
    /// `type` (a `PageType`).
    pub page_type: i32,
    /// `uncompressed_page_size`.
    pub uncompressed: i32,
    /// `compressed_page_size`.
    pub compressed: i32,
    /// Values in the page (data pages, V1 and V2; dictionary pages).
    pub num_values: i32,
    /// The values' encoding.
    pub encoding: i32,
    /// V1: the definition levels' encoding.
    pub def_encoding: i32,
    /// V1: the repetition levels' encoding.
    pub rep_encoding: i32,
    /// V2: nulls in the page.
    pub num_nulls: i32,
    /// V2: rows in the page.
    pub num_rows: i32,
    /// V2: bytes of definition levels.
    pub def_bytes: i32,
    /// V2: bytes of repetition levels.
    pub rep_bytes: i32,
    /// V2: whether the values are compressed.
    pub is_compressed: bool,
    /// Whether a data or dictionary page header was found.
    pub has_body: bool,
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
pub struct Thrift<'a> {
    data: &'a [u8],
    /// The cursor; always at most `data.len()`.
    pub at: usize,
}

/// A parse's result: an error says what in the header was wrong.
pub type ThriftResult<T> = std::result::Result<T, String>;

impl<'a> Thrift<'a> {
    /// A reader at the start of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Thrift { data, at: 0 }
    }

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
                let len = usize::try_from(self.varint()?)
                    .map_err(|_| "a binary length in a page header is too long".to_string())?;
                self.advance(len)?;
            }
            T_LIST | T_SET => {
                let b = self.byte()?;
                let size = match b >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                self.check_elements(size)?;
                for _ in 0..size {
                    self.element(b & 0x0f, depth + 1)?;
                }
            }
            T_MAP => {
                let size = self.varint()?;
                if size > 0 {
                    let kv = self.byte()?;
                    self.check_elements(size)?;
                    for _ in 0..size {
                        self.element(kv >> 4, depth + 1)?;
                        self.element(kv & 0x0f, depth + 1)?;
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

    /// Skip one element of a list, set or map: booleans take a byte there
    /// (in a struct they live in the field header), so every element
    /// consumes at least one byte.
    fn element(&mut self, ty: u8, depth: usize) -> ThriftResult<()> {
        if ty == T_TRUE || ty == T_FALSE {
            self.byte().map(|_| ())
        } else {
            self.skip(ty, depth)
        }
    }

    /// A container of `size` elements (each at least one byte) must fit in
    /// the bytes left: a forged size fails here instead of looping.
    fn check_elements(&self, size: u64) -> ThriftResult<()> {
        if size > (self.data.len() - self.at) as u64 {
            return Err(format!(
                "a page header lists {size} elements in {} bytes",
                self.data.len() - self.at
            ));
        }
        Ok(())
    }

    fn advance(&mut self, n: usize) -> ThriftResult<()> {
        self.at = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.data.len())
            .ok_or_else(|| "a page header overruns its column chunk".to_string())?;
        Ok(())
    }

    /// parquet.thrift `PageHeader`, with its data, dictionary or V2 header.
    pub fn page_header(&mut self) -> ThriftResult<Header> {
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
