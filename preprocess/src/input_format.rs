//! The formats `shard` reads, and how they are recognised.

use std::path::Path;
use std::str::FromStr;

use crate::PreprocessError;
use crate::error::Result;

/// The format of an input file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InputFormat {
    /// Apache Parquet, any codec.
    Parquet,
    /// Arrow IPC, file or stream.
    Ipc,
    /// JSON Lines: one JSON object per line.
    JsonLines,
    /// CSV with a header row.
    Csv,
    /// A folder of arbitrary files, ImageFolder-style: one row per file with
    /// its relative `path`, its `bytes`, and a `label` (with `label_index`)
    /// from the parent folder's name.
    Files,
}

impl InputFormat {
    /// The format implied by a file name's extension.
    pub fn from_path(path: &Path) -> Option<Self> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        Some(match ext.as_str() {
            "parquet" | "pq" | "parq" => InputFormat::Parquet,
            "arrow" | "arrows" | "ipc" | "feather" => InputFormat::Ipc,
            "jsonl" | "ndjson" | "json" => InputFormat::JsonLines,
            "csv" => InputFormat::Csv,
            _ => return None,
        })
    }

    /// The name used by `--format`.
    pub fn name(self) -> &'static str {
        match self {
            InputFormat::Parquet => "parquet",
            InputFormat::Ipc => "arrow",
            InputFormat::JsonLines => "jsonl",
            InputFormat::Csv => "csv",
            InputFormat::Files => "files",
        }
    }
}

impl FromStr for InputFormat {
    type Err = PreprocessError;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "parquet" => InputFormat::Parquet,
            "arrow" | "ipc" | "feather" => InputFormat::Ipc,
            "jsonl" | "json" | "ndjson" => InputFormat::JsonLines,
            "csv" => InputFormat::Csv,
            "files" | "imagefolder" => InputFormat::Files,
            other => {
                return Err(PreprocessError::BadOption {
                    option: "--format",
                    reason: format!(
                        "unknown format {other:?}; use parquet, arrow, jsonl, csv or files"
                    ),
                });
            }
        })
    }
}
