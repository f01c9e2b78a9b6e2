//! One source of a mixture: its loader, the batch its current row lies in,
//! and the batches a mixture batch still copies rows from.

use super::*;

/// One source: its loader and the batch the current row lies in.
pub(super) struct Source {
    pub(super) url: String,
    pub(super) loader: Loader,
    pub(super) batch: Option<Batch>,
    /// The row drawn last, in `batch`.
    pub(super) row: usize,
    /// The next row of `batch` to draw.
    pub(super) next_row: usize,
    /// The source epoch, and rows drawn from it in this epoch.
    pub(super) epoch: u64,
    pub(super) position: u64,
    /// Ran out in the current mixture epoch.
    pub(super) exhausted: bool,
    /// Rows drawn over the mixture's life.
    pub(super) drawn: u64,
    pub(super) fingerprint: String,
    /// After an elastic resume: epochs planned from pieces of the old ranks'
    /// sequences, and documents whose first tokens were emitted before it
    /// (epoch, position, tokens).
    pub(super) pending: Vec<(u64, Vec<Piece>)>,
    pub(super) skips: Vec<(u64, u64, usize)>,
    /// Tokens of the document drawn last to leave out (a skip).
    pub(super) skip: usize,
    /// Batches this source moved past while the mixture batch being made
    /// still has rows of them to copy ([`Source::keep`]), oldest first.
    pub(super) kept: Vec<Batch>,
    /// Keep batches past instead of giving their slabs back at once.
    pub(super) keep: bool,
    /// A row of `batch` was drawn since it came (or since `release_kept`).
    used: bool,
}

impl Source {
    pub(super) fn new(url: &str, loader: Loader) -> Self {
        Source {
            url: url.to_string(),
            epoch: loader.epoch(),
            fingerprint: loader.fingerprint().to_string(),
            loader,
            batch: None,
            row: 0,
            next_row: 0,
            position: 0,
            exhausted: false,
            drawn: 0,
            pending: Vec::new(),
            skips: Vec::new(),
            skip: 0,
            kept: Vec::new(),
            keep: false,
            used: false,
        }
    }

    /// Batches this source may keep past before the mixture copies their
    /// rows: two of its pool's slabs stay for its collator and the batch it
    /// delivers next, so keeping them never stalls the source (0: none).
    pub(super) fn keep_limit(&self) -> usize {
        self.loader.pool_size().saturating_sub(3)
    }

    /// The batch a row drawn with `kept` batches kept before it lies in:
    /// `kept[k]`, or the current one.
    pub(super) fn batch_at(&self, k: usize) -> &Batch {
        self.kept
            .get(k)
            .or(self.batch.as_ref())
            .expect("a row was drawn from a batch kept or current")
    }

    /// Give the batches kept back (their rows were copied).
    pub(super) fn release_kept(&mut self) {
        self.kept.clear();
        self.used = false;
    }

    /// Make the next row current; `false` when the source epoch is over (the
    /// loader has moved to the next one). A wait for the source's next batch
    /// gives up with [`LoaderError::Interrupted`] once `cancel` is set.
    pub(super) fn draw(&mut self, cancel: &AtomicBool) -> Result<bool> {
        loop {
            if let Some(b) = &self.batch
                && self.next_row < b.rows()
            {
                self.row = self.next_row;
                self.next_row += 1;
                self.used = true;
                self.position += 1;
                self.drawn += 1;
                self.skip = if self.skips.is_empty() {
                    0
                } else {
                    let at = (self.epoch, self.position - 1);
                    self.skips
                        .iter()
                        .find(|k| (k.0, k.1) == at)
                        .map_or(0, |k| k.2)
                };
                return Ok(true);
            }
            // Give the slab back before waiting for the next batch (or keep
            // it while the mixture batch being made has rows of it).
            if let Some(b) = self.batch.take()
                && self.keep
                && self.used
            {
                self.kept.push(b);
            }
            self.used = false;
            match self
                .loader
                .next_interruptible(|| cancel.load(Ordering::Relaxed))
            {
                Some(Ok(b)) => {
                    self.batch = Some(b);
                    self.next_row = 0;
                }
                Some(Err(e)) => return Err(e),
                None => {
                    self.epoch = self.loader.epoch();
                    self.position = 0;
                    return Ok(false);
                }
            }
        }
    }

    /// Continue at `position` of source epoch `epoch` (planned from
    /// `pending` where it names the epoch).
    pub(super) fn seek(&mut self, epoch: u64, position: u64) -> Result<()> {
        self.loader.set_pending(&self.pending)?;
        let mut state = self.loader.state();
        state.epoch = epoch;
        state.position = position;
        self.loader.resume(&state)?;
        self.loader.start();
        self.batch = None;
        self.release_kept();
        self.next_row = 0;
        self.epoch = epoch;
        self.position = position;
        Ok(())
    }

    pub(super) fn tokens(&self, column: usize) -> Result<Tokens<'_>> {
        let batch = self.batch.as_ref().expect("a row was drawn");
        if let Some(handoff) = &batch.handoff {
            return handoff.tokens(self.row).ok_or_else(|| {
                LoaderError::stage(
                    Stage::Pack,
                    None,
                    None,
                    format!("row {} is not in its batch", self.row),
                )
            });
        }
        let col = &batch.columns()[column];
        let ColumnLayout::Ragged { values, offsets } = &col.layout else {
            return Err(LoaderError::BadOption {
                option: "pack_column",
                reason: format!("column `{}` is not a list column", col.name),
            });
        };
        let offsets = batch.typed::<i64>(offsets).expect("offsets are i64");
        let (a, z) = (offsets[self.row], offsets[self.row + 1]);
        let range = usize::try_from(a).unwrap_or(usize::MAX)..usize::try_from(z).unwrap_or(0);
        let bad = || {
            LoaderError::stage(
                Stage::Pack,
                None,
                None,
                format!("row {} has list offsets {a}..{z}", self.row),
            )
        };
        if range.start > range.end || range.end > values.len() {
            return Err(bad());
        }
        Ok(match values.dtype {
            DType::I32 => Tokens::I32(&batch.typed::<i32>(values).expect("i32")[range]),
            DType::U32 => Tokens::U32(&batch.typed::<u32>(values).expect("u32")[range]),
            DType::I64 => Tokens::I64(&batch.typed::<i64>(values).expect("i64")[range]),
            DType::U16 => Tokens::U16(&batch.typed::<u16>(values).expect("u16")[range]),
            DType::I16 => Tokens::I16(&batch.typed::<i16>(values).expect("i16")[range]),
            DType::U8 => Tokens::U8(&batch.typed::<u8>(values).expect("u8")[range]),
            DType::I8 => {
                return Err(LoaderError::BadOption {
                    option: "pack_column",
                    reason: "int8 token ids are not supported".into(),
                });
            }
            other => {
                return Err(LoaderError::BadOption {
                    option: "pack_column",
                    reason: format!("{other:?} values are not token ids"),
                });
            }
        })
    }
}
