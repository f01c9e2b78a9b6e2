//! `shardfeed inspect`.

use anyhow::Result;
use serde::Serialize;
use shardfeed_format::Location;
use shardfeed_format::size::format_size;

#[derive(Serialize)]
struct Summary<'a> {
    dataset: &'a str,
    rows: u64,
    shards: usize,
    row_groups: usize,
    bytes: u64,
    input_bytes: u64,
    compression_ratio: f64,
    min_shard_bytes: u64,
    max_shard_bytes: u64,
    tool_version: &'a str,
    options: &'a shardfeed_format::WriteOptions,
    schema: &'a arrow_schema::Schema,
}

/// Print the manifest's summary.
pub fn run(dataset: &str, json: bool, storage_options: &[(String, String)]) -> Result<()> {
    let location = Location::parse_with_options(dataset, storage_options.iter().cloned())?;
    let runtime = tokio_runtime()?;
    let manifest = runtime.block_on(location.read_manifest())?;
    let summary = Summary {
        dataset: location.url(),
        rows: manifest.total_rows,
        shards: manifest.shards.len(),
        row_groups: manifest.row_group_count(),
        bytes: manifest.total_bytes,
        input_bytes: manifest.input_bytes,
        compression_ratio: manifest.input_bytes as f64 / manifest.total_bytes.max(1) as f64,
        min_shard_bytes: manifest.shards.iter().map(|s| s.bytes).min().unwrap_or(0),
        max_shard_bytes: manifest.shards.iter().map(|s| s.bytes).max().unwrap_or(0),
        tool_version: &manifest.tool_version,
        options: &manifest.options,
        schema: &manifest.schema,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
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
        "written by   shardfeed {} with zstd level {}{}",
        summary.tool_version,
        manifest.options.zstd_level,
        manifest
            .options
            .shuffle_seed
            .map(|s| format!(", shuffled with seed {s}"))
            .unwrap_or_default()
    );
    println!("schema");
    for field in manifest.schema.fields() {
        println!(
            "  {}: {}{}",
            field.name(),
            field.data_type(),
            if field.is_nullable() { "" } else { " not null" }
        );
    }
    Ok(())
}

fn tokio_runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
