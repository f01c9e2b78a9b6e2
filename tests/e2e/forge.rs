//! Forged data: Parquet files built page by page (page headers written here
//! in the Thrift compact protocol, footers by parquet's metadata writer),
//! and shardfeed datasets around them whose checksums and manifest are all
//! consistent, so the bytes reach the loader's decoders past every check a
//! forger can satisfy. Their column chunks carry CRC-32s under the key of
//! shards written before XXH3-64 (`shardfeed.chunk_crc32`), which the loader
//! still reads: these tests also cover that path.

#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use parquet::basic::{Compression, Encoding};
use parquet::file::metadata::{
    ColumnChunkMetaData, FileMetaData, KeyValue, ParquetMetaData, ParquetMetaDataWriter,
    RowGroupMetaData,
};
use parquet::schema::types::SchemaDescriptor;
use shardfeed_format::checksum::CHUNK_CRC_KEY;
use shardfeed_format::{
    ChunkChecksums, ChunkHash, Crc32, Manifest, ShardEntry, WriteOptions, shard_path,
};

/// A Thrift compact protocol writer (structs of i32 fields, enough for page headers).
#[derive(Default)]
pub struct Thrift {
    pub out: Vec<u8>,
    last: Vec<i16>,
}

impl Thrift {
    /// A writer inside a struct (a page header's top level).
    pub fn in_struct() -> Self {
        let mut t = Thrift::default();
        t.last.push(0);
        t
    }

    fn varint(&mut self, mut v: u64) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.out.push(byte);
                return;
            }
            self.out.push(byte | 0x80);
        }
    }

    fn header(&mut self, id: i16, ty: u8) {
        let last = self.last.last().copied().unwrap_or(0);
        let delta = id - last;
        if (1..=15).contains(&delta) {
            self.out.push(((delta as u8) << 4) | ty);
        } else {
            self.out.push(ty);
            self.varint(((id << 1) ^ (id >> 15)) as u16 as u64);
        }
        if let Some(l) = self.last.last_mut() {
            *l = id;
        }
    }

    /// Field `id`, an i32.
    pub fn i32(&mut self, id: i16, v: i32) -> &mut Self {
        self.header(id, 5);
        self.varint(((v << 1) ^ (v >> 31)) as u32 as u64);
        self
    }

    /// Field `id`, a binary of claimed length `len` followed by `bytes`.
    pub fn binary(&mut self, id: i16, len: u64, bytes: &[u8]) -> &mut Self {
        self.header(id, 8);
        self.varint(len);
        self.out.extend_from_slice(bytes);
        self
    }

    /// Field `id`, a bool.
    pub fn bool(&mut self, id: i16, v: bool) -> &mut Self {
        self.header(id, if v { 1 } else { 2 });
        self
    }

    /// Start struct field `id`.
    pub fn begin(&mut self, id: i16) -> &mut Self {
        self.header(id, 12);
        self.last.push(0);
        self
    }

    /// End the innermost struct.
    pub fn end(&mut self) -> &mut Self {
        self.out.push(0);
        self.last.pop();
        self
    }
}

/// Encoding numbers of parquet.thrift.
pub const PLAIN: i32 = 0;
pub const RLE: i32 = 3;
pub const RLE_DICTIONARY: i32 = 8;

/// A dictionary page of `num_values` values: header and (uncompressed) body.
pub fn dictionary_page(num_values: i32, body: &[u8]) -> Vec<u8> {
    let mut t = Thrift::default();
    t.last.push(0);
    t.i32(1, 2)
        .i32(2, body.len() as i32)
        .i32(3, body.len() as i32)
        .begin(7)
        .i32(1, num_values)
        .i32(2, PLAIN)
        .end()
        .end();
    let mut out = t.out;
    out.extend_from_slice(body);
    out
}

/// A V1 data page of `num_values` values (levels included in `body`).
pub fn data_page(num_values: i32, encoding: i32, body: &[u8]) -> Vec<u8> {
    data_page_with(num_values, encoding, body, |_| {})
}

/// A V1 data page whose header also holds what `extra` writes (after the
/// standard fields, before the struct ends).
pub fn data_page_with(
    num_values: i32,
    encoding: i32,
    body: &[u8],
    extra: impl FnOnce(&mut Thrift),
) -> Vec<u8> {
    let mut t = Thrift::default();
    t.last.push(0);
    t.i32(1, 0)
        .i32(2, body.len() as i32)
        .i32(3, body.len() as i32)
        .begin(5)
        .i32(1, num_values)
        .i32(2, encoding)
        .i32(3, RLE)
        .i32(4, RLE);
    t.end();
    extra(&mut t);
    t.end();
    let mut out = t.out;
    out.extend_from_slice(body);
    out
}

/// An RLE run of `count` copies of `value` (bit width `width`).
pub fn rle_run(count: u64, value: u32, width: u8) -> Vec<u8> {
    let mut t = Thrift::default();
    t.varint(count << 1);
    let mut out = t.out;
    out.extend_from_slice(&value.to_le_bytes()[..(width as usize).div_ceil(8)]);
    out
}

/// Levels as a V1 page holds them: a 4-byte length, then the RLE data.
pub fn levels(runs: &[u8]) -> Vec<u8> {
    let mut out = (runs.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(runs);
    out
}

/// One forged column chunk: its page bytes and what the footer says of it.
pub struct Chunk {
    pub pages: Vec<u8>,
    /// Values (levels) the footer claims.
    pub num_values: i64,
    /// Where the data pages start, from the chunk's first byte (the
    /// dictionary page, if any, comes before).
    pub data_offset: usize,
    pub dictionary: bool,
    pub encodings: Vec<Encoding>,
}

/// A one-row-group Parquet file of the columns of `message` (a Parquet
/// schema in its text form), with shardfeed's chunk checksums in the
/// footer; `rows`: what the row group and the file claim.
pub fn parquet_file(message: &str, rows: i64, chunks: Vec<Chunk>) -> Vec<u8> {
    parquet_file_claiming(message, rows, rows, chunks)
}

/// [`parquet_file`] whose footer claims `file_rows` rows for the whole file
/// (old writers left it at 0) and `rows` for its row group.
pub fn parquet_file_claiming(
    message: &str,
    rows: i64,
    file_rows: i64,
    chunks: Vec<Chunk>,
) -> Vec<u8> {
    let schema = Arc::new(parquet::schema::parser::parse_message_type(message).unwrap());
    let descr = Arc::new(SchemaDescriptor::new(schema));
    let mut file = b"PAR1".to_vec();
    let mut columns = Vec::new();
    let mut sums = Vec::new();
    for (i, chunk) in chunks.into_iter().enumerate() {
        let start = file.len() as i64;
        sums.push(ChunkHash::Crc32.of(&chunk.pages).value);
        file.extend_from_slice(&chunk.pages);
        let len = chunk.pages.len() as i64;
        columns.push(
            ColumnChunkMetaData::builder(descr.column(i))
                .set_compression(Compression::UNCOMPRESSED)
                .set_encodings(chunk.encodings)
                .set_num_values(chunk.num_values)
                .set_total_compressed_size(len)
                .set_total_uncompressed_size(len)
                .set_data_page_offset(start + chunk.data_offset as i64)
                .set_dictionary_page_offset(chunk.dictionary.then_some(start))
                .build()
                .unwrap(),
        );
    }
    let total: i64 = columns.iter().map(|c| c.compressed_size()).sum();
    let group = RowGroupMetaData::builder(descr.clone())
        .set_num_rows(rows)
        .set_total_byte_size(total)
        .set_column_metadata(columns)
        .build()
        .unwrap();
    let kv = vec![KeyValue::new(
        CHUNK_CRC_KEY.to_string(),
        ChunkChecksums {
            hash: ChunkHash::Crc32,
            sums: vec![sums],
        }
        .encode(),
    )];
    let meta = ParquetMetaData::new(
        FileMetaData::new(1, file_rows, None, Some(kv), descr, None),
        vec![group],
    );
    ParquetMetaDataWriter::new(&mut file, &meta)
        .finish()
        .unwrap();
    file
}

/// A one-shard dataset at `dir` holding `file`, whose manifest says its
/// schema is `schema`; everything the loader checks before decoding
/// (sizes, footer and file checksums, row counts) agrees. Returns its path.
pub fn dataset(dir: &Path, schema: arrow_schema::Schema, file: Vec<u8>) -> String {
    std::fs::create_dir_all(dir.join("shards")).unwrap();
    let tail = &file[file.len() - 8..];
    let footer_len = u32::from_le_bytes(tail[..4].try_into().unwrap()) as u64 + 8;
    let meta = parquet::file::metadata::ParquetMetaDataReader::new()
        .parse_and_finish(&bytes::Bytes::from(file.clone()))
        .unwrap();
    let row_groups: Vec<u64> = meta
        .row_groups()
        .iter()
        .map(|g| g.num_rows() as u64)
        .collect();
    let entry = ShardEntry {
        path: shard_path(0),
        rows: row_groups.iter().sum(),
        bytes: file.len() as u64,
        row_groups,
        footer_len,
        footer_crc32: Crc32::of(&file[file.len() - footer_len as usize..]),
        crc32: Some(Crc32::of(&file)),
        base: None,
        fingerprint: None,
        chunk_checksums: None,
        page_checksums: None,
    };
    std::fs::write(dir.join(&entry.path), &file).unwrap();
    let manifest = Manifest::new(
        schema,
        WriteOptions {
            compression: "zstd".into(),
            zstd_level: 3,
            shard_size: 1 << 20,
            row_group_rows: None,
            row_group_bytes: None,
            large_row_group_bytes: None,
            shuffle_seed: None,
            tokenizer: None,
        },
        vec![entry],
        1000,
    );
    std::fs::write(dir.join("manifest.json"), manifest.to_json()).unwrap();
    dir.display().to_string()
}

/// A column chunk of `pages` without a dictionary, claiming `num_values`.
pub fn plain_chunk(pages: Vec<u8>, num_values: i64) -> Chunk {
    Chunk {
        pages,
        num_values,
        data_offset: 0,
        dictionary: false,
        encodings: vec![Encoding::PLAIN, Encoding::RLE],
    }
}
