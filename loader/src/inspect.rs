//! Reports over a dataset that stream it through a loader: the image
//! headers of its binary columns (`shardfeed inspect --images`).

/// Image formats and sizes found in one binary column of a dataset (what
/// `shardfeed inspect --images` and Python's `inspect(images=True)` report).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ImageColumnSummary {
    /// The column.
    pub column: String,
    /// Rows whose header was read.
    pub rows_read: u64,
    /// Rows per format (`jpeg`, `png`, `webp`), and `unreadable`.
    pub formats: std::collections::BTreeMap<String, u64>,
    /// Smallest width (pixels, as stored) among the readable headers.
    pub min_width: u32,
    /// Largest width.
    pub max_width: u32,
    /// Smallest height.
    pub min_height: u32,
    /// Largest height.
    pub max_height: u32,
    /// The first few unreadable headers: row (in storage order) and why.
    pub unreadable: Vec<String>,
}

/// Read up to `sample` rows (0: all) of every binary column of the dataset
/// `builder` points at, in storage order, and summarise their image
/// headers (format and size; pixels are not decoded).
pub fn image_summary(
    builder: crate::LoaderBuilder,
    manifest: &shardfeed_format::Manifest,
    sample: u64,
) -> crate::error::Result<Vec<ImageColumnSummary>> {
    use arrow_schema::DataType;
    let columns: Vec<String> = manifest
        .schema
        .fields()
        .iter()
        .filter(|f| {
            matches!(
                f.data_type(),
                DataType::Binary | DataType::LargeBinary | DataType::BinaryView
            )
        })
        .map(|f| f.name().clone())
        .collect();
    if columns.is_empty() {
        return Ok(Vec::new());
    }
    let mut loader = builder
        .columns(columns.clone())
        .batch_size(256)
        .shuffle(false)
        .drop_last(false)
        .slow_warning(None)
        .rank(0)
        .world_size(1)
        .build()?;
    let mut out: Vec<ImageColumnSummary> = columns
        .iter()
        .map(|c| ImageColumnSummary {
            column: c.clone(),
            min_width: u32::MAX,
            min_height: u32::MAX,
            ..ImageColumnSummary::default()
        })
        .collect();
    let mut row = 0u64;
    for batch in &mut loader {
        let batch = batch?;
        for col in &mut out {
            for (i, value) in batch.binary(&col.column).into_iter().flatten().enumerate() {
                col.rows_read += 1;
                match crate::image::probe(value) {
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
