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

/// `PageHeader`'s required fields 1 to 3 (each an i32), by name.
const PAGE_HEADER_FIELDS: [&str; 3] = ["type", "uncompressed_page_size", "compressed_page_size"];

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
    ///
    /// A required field that is missing, or a field this reader uses that
    /// has another Thrift type than parquet.thrift gives it, is an error: a
    /// skipped `encoding` would otherwise read as PLAIN (0) and decode the
    /// page's bytes as something they are not.
    pub fn page_header(&mut self) -> ThriftResult<Header> {
        let mut h = Header {
            is_compressed: true,
            ..Header::default()
        };
        let mut last = 0;
        let mut seen = 0u32;
        while let Some((id, ty)) = self.field(&mut last)? {
            match (id, ty) {
                (1..=3, T_I32) => {
                    let v = self.i32()?;
                    match id {
                        1 => h.page_type = v,
                        2 => h.uncompressed = v,
                        _ => h.compressed = v,
                    }
                    seen |= 1 << id;
                }
                (1..=3, t) => {
                    let what = PAGE_HEADER_FIELDS[id as usize - 1];
                    return Err(format!(
                        "a page header's {what} has Thrift type {t}, not i32"
                    ));
                }
                (5 | 7 | 8, t) if t != T_STRUCT => {
                    return Err(format!(
                        "a page header's field {id} has Thrift type {t}, not struct"
                    ));
                }
                (5 | 7 | 8, _) => {
                    let body = match id {
                        5 => h.page_type == DATA_PAGE,
                        7 => h.page_type == DICTIONARY_PAGE,
                        _ => h.page_type == DATA_PAGE_V2,
                    };
                    if !body || h.has_body {
                        // Another page type's header (or a second one):
                        // not this page's.
                        self.skip(T_STRUCT, 0)?;
                        continue;
                    }
                    h.has_body = true;
                    self.body_header(id, &mut h)?;
                }
                (_, t) => self.skip(t, 0)?,
            }
        }
        for (i, what) in PAGE_HEADER_FIELDS.iter().enumerate() {
            if seen & (1 << (i + 1)) == 0 {
                return Err(format!("a page header without its {what}"));
            }
        }
        Ok(h)
    }

    /// The fields of a `DataPageHeader` (`id` 5), `DictionaryPageHeader`
    /// (7) or `DataPageHeaderV2` (8) into `h`: each required one present,
    /// with its type.
    fn body_header(&mut self, id: i16, h: &mut Header) -> ThriftResult<()> {
        let (name, required): (&str, &[(i16, &str)]) = match id {
            5 => (
                "data page header",
                &[
                    (1, "num_values"),
                    (2, "encoding"),
                    (3, "definition_level_encoding"),
                    (4, "repetition_level_encoding"),
                ],
            ),
            7 => (
                "dictionary page header",
                &[(1, "num_values"), (2, "encoding")],
            ),
            _ => (
                "V2 data page header",
                &[
                    (1, "num_values"),
                    (2, "num_nulls"),
                    (3, "num_rows"),
                    (4, "encoding"),
                    (5, "definition_levels_byte_length"),
                    (6, "repetition_levels_byte_length"),
                ],
            ),
        };
        let mut seen = 0u32;
        let mut last = 0;
        while let Some((field, t)) = self.field(&mut last)? {
            let target = match (id, field) {
                (_, 1) => Some(&mut h.num_values),
                (5 | 7, 2) | (8, 4) => Some(&mut h.encoding),
                (5, 3) => Some(&mut h.def_encoding),
                (5, 4) => Some(&mut h.rep_encoding),
                (8, 2) => Some(&mut h.num_nulls),
                (8, 3) => Some(&mut h.num_rows),
                (8, 5) => Some(&mut h.def_bytes),
                (8, 6) => Some(&mut h.rep_bytes),
                _ => None,
            };
            match (target, t) {
                (Some(target), T_I32) => {
                    *target = self.i32()?;
                    seen |= 1 << field;
                }
                (Some(_), t) => {
                    let what = required
                        .iter()
                        .find(|(f, _)| *f == field)
                        .map_or("field", |(_, w)| w);
                    return Err(format!("a {name}'s {what} has Thrift type {t}, not i32"));
                }
                (None, T_TRUE) if id == 8 && field == 7 => h.is_compressed = true,
                (None, T_FALSE) if id == 8 && field == 7 => h.is_compressed = false,
                (None, t) if id == 8 && field == 7 => {
                    return Err(format!(
                        "a {name}'s is_compressed has Thrift type {t}, not bool"
                    ));
                }
                (None, t) => self.skip(t, 1)?,
            }
        }
        match required.iter().find(|(f, _)| seen & (1 << f) == 0) {
            Some((_, what)) => Err(format!("a {name} without its {what}")),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A V2 page header in the compact protocol: `type` 3, sizes 50, then
    /// the V2 header's fields (`fields`: (delta-encoded id byte, value
    /// bytes)), then the stops.
    fn v2_header(fields: &[(u8, &[u8])]) -> Vec<u8> {
        let mut bytes = vec![0x15, 0x06, 0x15, 0x64, 0x15, 0x64, 0x5c];
        for (head, value) in fields {
            bytes.push(*head);
            bytes.extend_from_slice(value);
        }
        bytes.extend_from_slice(&[0x00, 0x00]);
        bytes
    }

    /// num_values 12, num_nulls 0, num_rows 12, encoding 5
    /// (DELTA_BINARY_PACKED), level lengths 2 and 0, is_compressed false.
    const FIELDS: [(u8, &[u8]); 7] = [
        (0x15, &[0x18]),
        (0x15, &[0x00]),
        (0x15, &[0x18]),
        (0x15, &[0x0a]),
        (0x15, &[0x04]),
        (0x15, &[0x00]),
        (0x12, &[]),
    ];

    #[test]
    fn a_v2_header_parses_with_every_field() {
        let bytes = v2_header(&FIELDS);
        let mut thrift = Thrift::new(&bytes);
        let h = thrift.page_header().unwrap();
        assert_eq!(thrift.at, bytes.len());
        assert_eq!(
            (h.page_type, h.uncompressed, h.compressed, h.has_body),
            (DATA_PAGE_V2, 50, 50, true)
        );
        assert_eq!(
            (h.num_values, h.num_nulls, h.num_rows, h.encoding),
            (12, 0, 12, 5)
        );
        assert_eq!((h.def_bytes, h.rep_bytes, h.is_compressed), (2, 0, false));
    }

    /// An `encoding` written with another type (one byte of a real file's
    /// header changed: i32 to i64), or left out, is refused naming it: a
    /// skipped encoding would read as PLAIN and decode delta-packed bytes as
    /// plain values.
    #[test]
    fn a_required_field_missing_or_of_another_type_is_refused_naming_it() {
        let mut fields = FIELDS.to_vec();
        fields[3].0 = 0x16;
        let e = Thrift::new(&v2_header(&fields)).page_header().unwrap_err();
        assert!(e.contains("encoding has Thrift type 6, not i32"), "{e}");
        // Left out: the next field's id is written as a delta of 2.
        let mut fields = FIELDS.to_vec();
        fields.remove(3);
        fields[3].0 = 0x25;
        let e = Thrift::new(&v2_header(&fields)).page_header().unwrap_err();
        assert!(
            e.contains("V2 data page header without its encoding"),
            "{e}"
        );
        // The page's sizes: compressed_page_size left out.
        let bytes = [0x15, 0x06, 0x15, 0x64, 0x00];
        let e = Thrift::new(&bytes).page_header().unwrap_err();
        assert!(e.contains("without its compressed_page_size"), "{e}");
    }
}
