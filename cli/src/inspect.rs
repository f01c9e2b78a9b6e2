//! `shardfeed inspect`.

use std::collections::BTreeMap;

use anyhow::Result;
use arrow_schema::DataType;
use serde::Serialize;
use shardfeed_format::size::format_size;
use shardfeed_format::{Location, Manifest};
use shardfeed_loader::Loader;

/// Image formats and sizes found in one binary column.
#[derive(Serialize, Default)]
struct ImageColumn {
    column: String,
    rows_read: u64,
    /// Rows per format (`jpeg`, `png`, `webp`), and `unreadable`.
    formats: BTreeMap<String, u64>,
    min_width: u32,
    max_width: u32,
    min_height: u32,
    max_height: u32,
    /// The first few unreadable headers: row and why.
    unreadable: Vec<String>,
}

/// Read up to `sample` rows (0: all) of every binary column in storage
/// order and summarise their image headers.
fn images(
    dataset: &str,
    manifest: &Manifest,
    storage_options: &[(String, String)],
    sample: u64,
) -> Result<Vec<ImageColumn>> {
    let columns: Vec<String> = manifest
        .schema
        .fields()
        .iter()
        .filter(|f| matches!(f.data_type(), DataType::Binary | DataType::LargeBinary))
        .map(|f| f.name().clone())
        .collect();
    if columns.is_empty() {
        return Ok(Vec::new());
    }
    let mut builder = Loader::builder(dataset)
        .columns(columns.clone())
        .batch_size(256)
        .shuffle(false)
        .drop_last(false)
        .slow_warning(None)
        .rank(0)
        .world_size(1);
    for (k, v) in storage_options {
        builder = builder.storage_option(k, v);
    }
    let mut loader = builder.build()?;
    let mut out: Vec<ImageColumn> = columns
        .iter()
        .map(|c| ImageColumn {
            column: c.clone(),
            min_width: u32::MAX,
            min_height: u32::MAX,
            ..ImageColumn::default()
        })
        .collect();
    let mut row = 0u64;
    for batch in &mut loader {
        let batch = batch?;
        for col in &mut out {
            let values: &[u8] = batch.values(&col.column).unwrap_or_default();
            let offsets = batch.offsets(&col.column).unwrap_or_default();
            for (i, w) in offsets.windows(2).enumerate() {
                let value = &values[w[0] as usize..w[1] as usize];
                col.rows_read += 1;
                match shardfeed_loader::probe_image(value) {
                    Ok(h) => {
                        *col.formats.entry(h.format.to_string()).or_default() += 1;
                        col.min_width = col.min_width.min(h.width);
                        col.max_width = col.max_width.max(h.width);
                        col.min_height = col.min_height.min(h.height);
                        col.max_height = col.max_height.max(h.height);
                    }
                    Err(e) => {
                        *col.formats.entry("unreadable".into()).or_default() += 1;
                        if col.unreadable.len() < 5 {
                            col.unreadable.push(format!("row {}: {e}", row + i as u64));
                        }
                    }
                }
            }
        }
        row += batch.rows() as u64;
        if sample > 0 && row >= sample {
            break;
        }
    }
    for col in &mut out {
        if col.min_width == u32::MAX {
            (col.min_width, col.min_height) = (0, 0);
        }
    }
    Ok(out)
}

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
        Some(sample) => Some(images(dataset, &manifest, storage_options, sample)?),
        None => None,
    };
    if json {
        let mut value = serde_json::to_value(&summary)?;
        if let (Some(cols), Some(map)) = (&image_columns, value.as_object_mut()) {
            map.insert("images".into(), serde_json::to_value(cols)?);
        }
        println!("{}", serde_json::to_string_pretty(&value)?);
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
    println!(
        "written by   shardfeed {} with zstd level {}",
        summary.tool_version, manifest.options.zstd_level,
    );
    match manifest.options.shuffle_seed {
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
