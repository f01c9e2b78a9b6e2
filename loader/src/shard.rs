//! Reading one shard safely: footers and column chunks checked against the
//! checksums anchored in the manifest before any byte is decoded.

use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use shardfeed_format::{ChunkChecksums, ChunkHash, ChunkSum, Crc32, PageChecksums, ShardEntry};

use crate::error::{LoaderError, Result};

/// A shard's footer, checked and decoded.
#[derive(Debug, Clone)]
pub(crate) struct ShardFooter {
    /// The Parquet metadata.
    pub metadata: ParquetMetaData,
    /// Checksums of every column chunk, `[row_group][leaf]`: always for
    /// shards written by `shard`; for an index's files only when it was
    /// made with `--checksums` (then from the index, not the file).
    pub checksums: Option<ChunkChecksums>,
}

fn corrupt(entry: &ShardEntry, row_group: Option<usize>, detail: String) -> LoaderError {
    LoaderError::Corrupt {
        shard: entry.path.clone(),
        row_group,
        detail,
    }
}

/// Check `footer` (the last `footer_len` bytes of the shard) against the
/// manifest, decode it, and check that it agrees with the manifest entry.
pub(crate) fn decode_footer(entry: &ShardEntry, footer: &[u8]) -> Result<ShardFooter> {
    if footer.len() as u64 != entry.footer_len {
        return Err(corrupt(
            entry,
            None,
            format!(
                "footer is {} bytes, the manifest says {}",
                footer.len(),
                entry.footer_len
            ),
        ));
    }
    let crc = Crc32::of(footer);
    if crc != entry.footer_crc32 {
        return Err(corrupt(
            entry,
            None,
            format!(
                "footer checksum {crc} does not match the manifest's {}",
                entry.footer_crc32
            ),
        ));
    }
    // Page counts kept (a few bytes per column chunk): they size the parts
    // large row groups are read in (`crate::fetch`'s parts).
    let options =
        parquet::file::metadata::ParquetMetaDataOptions::new().with_encoding_stats_as_mask(false);
    let metadata = ParquetMetaDataReader::decode_metadata_with_options(
        &footer[..footer.len() - 8],
        Some(&options),
    )
    .map_err(|source| LoaderError::Decode {
        shard: entry.path.clone(),
        row_group: None,
        source,
    })?;
    let groups: Vec<u64> = metadata
        .row_groups()
        .iter()
        .map(|rg| rg.num_rows() as u64)
        .collect();
    if groups != entry.row_groups {
        return Err(corrupt(
            entry,
            None,
            format!(
                "row groups hold {groups:?} rows, the manifest says {:?}",
                entry.row_groups
            ),
        ));
    }
    // An index made with `--checksums` holds its files' checksums; else
    // XXH3-64 checksums in the footer (what `shard` writes), or CRC-32s
    // (shards written before). An index's file may have none.
    let kv = metadata.file_metadata().key_value_metadata();
    let found = match &entry.chunk_checksums {
        Some(encoded) => Some((ChunkHash::Xxh3, encoded.as_str())),
        None => [ChunkHash::Xxh3, ChunkHash::Crc32]
            .into_iter()
            .find_map(|hash| {
                kv.and_then(|kv| kv.iter().find(|k| k.key == hash.key()))
                    .and_then(|k| k.value.as_deref())
                    .map(|v| (hash, v))
            }),
    };
    let checksums = match found {
        Some((hash, encoded)) => {
            let checksums = ChunkChecksums::decode(hash, encoded)
                .map_err(|e| corrupt(entry, None, e.to_string()))?;
            for (i, rg) in metadata.row_groups().iter().enumerate() {
                if checksums.sums.get(i).map(Vec::len) != Some(rg.num_columns()) {
                    return Err(corrupt(
                        entry,
                        Some(i),
                        "column chunk checksums are missing".into(),
                    ));
                }
            }
            Some(checksums)
        }
        None if entry.base.is_some() => None,
        None => {
            return Err(corrupt(
                entry,
                None,
                format!(
                    "footer has no {} (or {}) entry",
                    ChunkHash::Xxh3.key(),
                    ChunkHash::Crc32.key()
                ),
            ));
        }
    };
    Ok(ShardFooter {
        metadata,
        checksums,
    })
}

/// Check that a shard's Arrow schema (from its footer) is the manifest's:
/// the same fields, names, types and nullability. The collator sizes and
/// reads buffers by the manifest's types, so a shard that disagrees (a
/// forged manifest, or a shard from another dataset) is refused here.
pub(crate) fn check_schema(
    entry: &ShardEntry,
    manifest: &arrow_schema::Schema,
    footer: &arrow_schema::Schema,
) -> Result<()> {
    let describe = |f: &arrow_schema::Field| {
        format!(
            "`{}` {}{}",
            f.name(),
            f.data_type(),
            if f.is_nullable() { " (nullable)" } else { "" }
        )
    };
    if manifest.fields().len() != footer.fields().len() {
        return Err(corrupt(
            entry,
            None,
            format!(
                "the shard has {} columns, the manifest's schema {}",
                footer.fields().len(),
                manifest.fields().len()
            ),
        ));
    }
    for (m, f) in manifest.fields().iter().zip(footer.fields()) {
        // An index's schema is nullable where any of its files is.
        let nullable_ok = m.is_nullable() == f.is_nullable()
            || (entry.base.is_some() && m.is_nullable() && !f.is_nullable());
        // An index's column may be wider than a file's (read widened).
        let type_ok = m.data_type().equals_datatype(f.data_type())
            || (entry.base.is_some() && shardfeed_format::widens_to(f.data_type(), m.data_type()));
        let same = m.name() == f.name() && type_ok && nullable_ok;
        if !same {
            return Err(corrupt(
                entry,
                None,
                format!(
                    "column {} in the shard is {} in the manifest's schema",
                    describe(f),
                    describe(m)
                ),
            ));
        }
    }
    Ok(())
}

/// Check one column chunk's bytes against its checksum.
pub(crate) fn check_chunk(
    entry: &ShardEntry,
    footer: &ShardFooter,
    row_group: usize,
    column: usize,
    bytes: &[u8],
) -> Result<()> {
    match &footer.checksums {
        Some(sums) => check_chunk_sum(entry, footer, row_group, column, sums.hash.of(bytes)),
        None => Ok(()),
    }
}

/// Check `bytes`, pages of column `column` of `row_group` read from file
/// offset `origin` (a part of a large row group), against the index's page
/// checksums ([`shardfeed_format::PageChecksums`]): every page they hold, and
/// that they begin and end at its pages. Files indexed without
/// `--checksums`, and chunks of one page (read whole, and checked whole),
/// have none.
pub(crate) fn check_pages(
    entry: &ShardEntry,
    footer: &ShardFooter,
    row_group: usize,
    column: usize,
    origin: u64,
    bytes: &[u8],
) -> Result<()> {
    let Some(pages) = entry
        .page_checksums
        .as_ref()
        .and_then(|p| p.get(row_group, column))
    else {
        return Ok(());
    };
    let chunk = footer.metadata.row_group(row_group).column(column);
    let name = || chunk.column_path().string();
    let mut at = chunk.byte_range().0;
    let mut pages = pages.iter().copied();
    // The page the bytes begin at.
    let mut page = loop {
        match pages.next() {
            Some((len, sum)) if at == origin => break Some((len, sum)),
            Some((len, _)) if at < origin => at = at.saturating_add(u64::from(len)),
            _ => break None,
        }
    };
    let mut done = 0usize;
    while done < bytes.len() {
        let Some((len, sum)) = page else {
            return Err(corrupt(
                entry,
                Some(row_group),
                format!(
                    "column `{}`: bytes {origin}..{} read are not pages the index recorded",
                    name(),
                    origin + bytes.len() as u64
                ),
            ));
        };
        let end = done.saturating_add(len as usize);
        let Some(body) = bytes.get(done..end) else {
            return Err(corrupt(
                entry,
                Some(row_group),
                format!(
                    "column `{}`: the bytes read end inside the page at byte {at}",
                    name()
                ),
            ));
        };
        let found = PageChecksums::of(body);
        if found != sum {
            return Err(corrupt(
                entry,
                Some(row_group),
                format!(
                    "column `{}` page at byte {at}: checksum {found:08x} does not match the index's {sum:08x}",
                    name()
                ),
            ));
        }
        at = at.saturating_add(u64::from(len));
        done = end;
        page = pages.next();
    }
    Ok(())
}

/// [`check_chunk`] with the chunk's checksum already computed (`found`, by
/// the footer's [`ChunkHash`]).
pub(crate) fn check_chunk_sum(
    entry: &ShardEntry,
    footer: &ShardFooter,
    row_group: usize,
    column: usize,
    found: ChunkSum,
) -> Result<()> {
    let Some(checksums) = &footer.checksums else {
        // An index's file indexed without `--checksums`: the footer and
        // fingerprint were checked, the decoders check every bound.
        return Ok(());
    };
    let expected = checksums.get(row_group, column).ok_or_else(|| {
        corrupt(
            entry,
            Some(row_group),
            format!("no checksum for column {column}"),
        )
    })?;
    if found != expected {
        let name = footer
            .metadata
            .row_group(row_group)
            .column(column)
            .column_path()
            .string();
        return Err(corrupt(
            entry,
            Some(row_group),
            format!("column `{name}` checksum {found} does not match {expected}"),
        ));
    }
    Ok(())
}
