//! `shardfeed inspect`.

use anyhow::Result;
use shardfeed_format::Location;
use shardfeed_format::size::format_size;

/// Print the manifest's summary.
pub fn run(dataset: &str, json: bool, storage_options: &[(String, String)]) -> Result<()> {
    let location = Location::parse_with_options(dataset, storage_options.iter().cloned())?;
    let runtime = tokio_runtime()?;
    let manifest = runtime.block_on(location.read_manifest())?;
    let summary = manifest.summary(location.url());
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
    Ok(())
}

fn tokio_runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
