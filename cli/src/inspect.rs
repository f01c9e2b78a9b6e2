//! `shardfeed inspect`.

use anyhow::Result;
use shardfeed_format::Location;
use shardfeed_format::size::format_size;
use shardfeed_loader::Loader;

/// Print the manifest's summary (and, with `images`, the binary columns'
/// image formats and sizes over that many rows, 0 for all).
pub fn run(
    dataset: &str,
    json: bool,
    storage_options: &[(String, String)],
    images_sample: Option<u64>,
) -> Result<()> {
    let location = Location::parse_with_options(dataset, storage_options.iter().cloned())?;
    let runtime = tokio_runtime()?;
    let manifest = runtime.block_on(location.read_manifest())?;
    let summary = manifest.summary(location.url());
    let image_columns = match images_sample {
        Some(sample) => {
            let mut builder = Loader::builder(dataset);
            for (k, v) in storage_options {
                builder = builder.storage_option(k, v);
            }
            Some(shardfeed_loader::image_summary(builder, &manifest, sample)?)
        }
        None => None,
    };
    if json {
        let mut value = serde_json::to_value(&summary)?;
        if let (Some(cols), Some(map)) = (&image_columns, value.as_object_mut()) {
            map.insert("images".into(), serde_json::to_value(cols)?);
        }
        crate::bench::emit(&format!("{}\n", serde_json::to_string_pretty(&value)?))?;
        return Ok(());
    }
    println!("dataset      {}", summary.dataset);
    println!("rows         {}", summary.rows);
    println!(
        "shards       {} ({} to {} each), {} row groups",
        summary.shards,
        format_size(summary.min_shard_bytes),
        format_size(summary.max_shard_bytes),
        summary.row_groups
    );
    println!(
        "size         {} on disk, {} in memory (ratio {:.2})",
        format_size(summary.bytes),
        format_size(summary.input_bytes),
        summary.compression_ratio
    );
    if let Some(index) = &manifest.index {
        println!(
            "index        existing Parquet files read in place ({}), checksums {}, indexed by shardfeed {}",
            manifest.options.compression,
            if index.checksums {
                if manifest.shards.iter().any(|s| s.page_checksums.is_some()) {
                    "recorded (the loader verifies every column chunk, and every page of a row group it reads in parts)"
                } else {
                    "recorded (the loader verifies every column chunk)"
                }
            } else {
                "not recorded (footers and fingerprints are checked)"
            },
            summary.tool_version
        );
        for (i, base) in index.bases.iter().enumerate() {
            let files = manifest
                .shards
                .iter()
                .filter(|s| s.base == Some(i as u32))
                .count();
            println!(
                "source       {} ({files} files)",
                shardfeed_format::redact::url(base)
            );
        }
        for shard in manifest.shards.iter().take(3) {
            let f = shard.fingerprint.clone().unwrap_or_default();
            println!(
                "fingerprint  {}: {} bytes, footer crc32 {}{}{}",
                shard.path,
                shard.bytes,
                shard.footer_crc32,
                f.etag.map(|e| format!(", etag {e}")).unwrap_or_default(),
                f.modified_ns
                    .map(|m| format!(", modified {m} ns"))
                    .unwrap_or_default(),
            );
        }
        if manifest.shards.len() > 3 {
            println!(
                "             ... ({} more: --json lists them all)",
                manifest.shards.len() - 3
            );
        }
    } else {
        println!(
            "written by   shardfeed {} with zstd level {}",
            summary.tool_version, manifest.options.zstd_level,
        );
    }
    match manifest.options.shuffle_seed {
        None if manifest.index.is_some() => println!(
            "order        the files' own order: the loader mixes rows only within its shuffle windows"
        ),
        Some(seed) => println!("order        shuffled at shard time (seed {seed})"),
        None => println!(
            "order        input order (--no-shuffle): the loader mixes rows only within its shuffle windows"
        ),
    }
    if let Some(t) = &manifest.options.tokenizer {
        println!(
            "tokenizer    {} (sha256 {}), vocabulary {}, eos id {}{}: {} -> {}",
            t.file,
            &t.sha256[..t.sha256.len().min(16)],
            t.vocab_size,
            t.eos_id.map_or("none".to_string(), |id| id.to_string()),
            if t.add_eos { " appended" } else { "" },
            t.text_column,
            t.tokens_column,
        );
    }
    if let Some(tokens) = summary.tokens {
        println!(
            "tokens       {tokens} ({:.1} per row)",
            tokens as f64 / summary.rows.max(1) as f64
        );
    }
    println!("schema");
    for field in manifest.schema.fields() {
        println!(
            "  {}: {}{}",
            field.name(),
            field.data_type(),
            if field.is_nullable() { "" } else { " not null" }
        );
    }
    if let Some(cols) = image_columns {
        if cols.is_empty() {
            println!("images       no binary columns");
        }
        for c in cols {
            let formats: Vec<String> = c.formats.iter().map(|(f, n)| format!("{f} {n}")).collect();
            println!(
                "images       `{}` over {} rows: {}; width {}-{}, height {}-{}",
                c.column,
                c.rows_read,
                formats.join(", "),
                c.min_width,
                c.max_width,
                c.min_height,
                c.max_height
            );
            for u in &c.unreadable {
                println!("               unreadable {u}");
            }
        }
    }
    Ok(())
}

fn tokio_runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
