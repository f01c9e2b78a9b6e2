//! `shardfeed generate`: seeded synthetic datasets for demos, tests and benchmarks.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use parquet::basic::{Compression, GzipLevel, ZstdLevel};
use shardfeed_fixtures::{FileFormat, Kind};

/// Arguments of `generate`.
#[derive(Args)]
pub struct GenerateArgs {
    /// tokens, tabular, images, kitchen-sink or text.
    kind: String,
    /// Output folder.
    #[arg(long, short)]
    output: PathBuf,
    /// Rows to write (or use --size).
    #[arg(long)]
    rows: Option<u64>,
    /// Approximate in-memory size to write, e.g. 1.5GB.
    #[arg(long)]
    size: Option<String>,
    /// Number of files.
    #[arg(long, default_value_t = 8)]
    files: usize,
    /// parquet, parquet-zstd, parquet-gzip, parquet-lz4, parquet-brotli,
    /// parquet-none, arrow, arrows, jsonl, csv, or imagefolder.
    #[arg(long, default_value = "parquet")]
    format: String,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

fn file_format(name: &str) -> Result<FileFormat> {
    Ok(match name {
        "parquet" | "parquet-snappy" => FileFormat::Parquet(Compression::SNAPPY),
        "parquet-zstd" => FileFormat::Parquet(Compression::ZSTD(ZstdLevel::default())),
        "parquet-gzip" => FileFormat::Parquet(Compression::GZIP(GzipLevel::default())),
        "parquet-lz4" => FileFormat::Parquet(Compression::LZ4_RAW),
        "parquet-brotli" => FileFormat::Parquet(Compression::BROTLI(Default::default())),
        "parquet-none" => FileFormat::Parquet(Compression::UNCOMPRESSED),
        "arrow" => FileFormat::IpcFile,
        "arrows" => FileFormat::IpcStream,
        "jsonl" => FileFormat::JsonLines,
        "csv" => FileFormat::Csv,
        other => bail!("unknown --format {other:?}"),
    })
}

/// Run `generate`.
pub fn run(args: &GenerateArgs) -> Result<()> {
    let kind: Kind = args.kind.parse().map_err(anyhow::Error::msg)?;
    let rows = match (args.rows, &args.size) {
        (Some(rows), _) => rows,
        (None, Some(size)) => {
            let bytes = shardfeed_format::size::parse_size(size).context("invalid --size")?;
            bytes.div_ceil(kind.approx_row_bytes())
        }
        (None, None) => bail!("pass --rows or --size"),
    };
    if args.format == "imagefolder" {
        let paths = shardfeed_fixtures::write_image_folder(&args.output, rows, 10, args.seed)?;
        println!(
            "wrote {} files under {}",
            paths.len(),
            args.output.display()
        );
        return Ok(());
    }
    let paths = shardfeed_fixtures::write_dataset(
        &args.output,
        kind,
        rows,
        args.files,
        args.seed,
        file_format(&args.format)?,
    )?;
    println!(
        "wrote {rows} {} rows in {} files under {}",
        args.kind,
        paths.len(),
        args.output.display()
    );
    Ok(())
}
