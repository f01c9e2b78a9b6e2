//! What the pipeline's stages hand each other: fetched column chunks
//! (fetch -> decode), decoded segments (decode ->
//! shuffle; the windows shuffle hands collate are
//! [`crate::shuffle::LoadedWindow`]), and the errors of failpoints any
//! stage may hit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use shardfeed_format::failpoint::Action;
use tokio::sync::OwnedSemaphorePermit;

use std::sync::Arc;

use bytes::Bytes;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use shardfeed_format::ChunkSum;

use crate::error::{LoaderError, Result, Stage};
use crate::plan::Segment;
use crate::shard::ShardFooter;

/// A shard's checked footer, ready for decoding.
pub(crate) struct FooterInfo {
    pub footer: ShardFooter,
    pub arrow: ArrowReaderMetadata,
}

/// `(leaf column, file offset, bytes, checksum)` of a fetched column chunk
/// (or of pages of one).
pub(crate) type FetchedChunk = (usize, u64, Bytes, Option<ChunkSum>);

/// The fetched column chunks of one segment's row group.
pub(crate) struct Fetched {
    pub seq: u64,
    pub segment: Segment,
    /// The shard's footer; for an index's file that changed or went away
    /// after indexing, under `on_error="skip"`, why it could not be read
    /// (the decoders skip the segment and count it).
    pub footer: Result<Arc<FooterInfo>>,
    /// `(leaf column, file offset, bytes, checksum)`, one per projected
    /// column chunk: owned bytes, read from the store or a local file; the
    /// checksum when it was computed as the bytes were read.
    pub chunks: Vec<FetchedChunk>,
    /// For a part of a large row group, what its leaves' fetched pages
    /// hold ([`crate::parquet::LeafPart`]); empty when the row group's
    /// chunks were fetched whole.
    pub parts: Vec<crate::parquet::LeafPart>,
}

/// A decoded segment's rows, or the mark of a skipped one.
pub(crate) enum DecodedSegment {
    /// The segment's rows, in order.
    Rows(Vec<RecordBatch>),
    /// A damaged row group left out under [`OnError::Skip`]: its rows hold
    /// no data (`schema`: the projected columns, for an empty placeholder).
    Skipped { schema: SchemaRef },
}

/// A decoded segment by sequence number, or the error that stopped the
/// pipeline, with the budget its row group holds.
pub(crate) type Decoded = (u64, Result<DecodedSegment>, Option<OwnedSemaphorePermit>);

/// The error of failpoint `action` at `stage` ([`Action::Stop`] and
/// [`Action::Exit`] are handled by the caller and by the failpoint).
pub(crate) fn injected(stage: Stage, action: Action, cancel: &AtomicBool) -> LoaderError {
    match action {
        Action::Panic => panic!("injected panic in the {stage} stage (failpoint)"),
        Action::Block => {
            // Logged as the stage blocks and again as the stop releases it,
            // from the stage's thread: a test can wait for the first, and
            // the second comes while the loader stops (the bindings' test
            // that a stop joins threads that log).
            tracing::warn!("the {stage} stage is blocked by a failpoint");
            while !cancel.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            tracing::warn!("the {stage} stage's blocking failpoint was released by the stop");
            LoaderError::Closed
        }
        _ => LoaderError::stage(stage, None, None, "injected failure (failpoint)"),
    }
}
