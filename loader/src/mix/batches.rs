//! How the mixture's core makes a batch: a slab leased, rows drawn (and
//! packed), columns laid out.

use super::*;

impl Core {
    /// A slab for `bytes`: waits while every slab is in the queue or held
    /// by the consumer (the consumer names that case), until cancelled.
    pub(super) fn lease(&self, bytes: usize) -> Result<SlabLease> {
        if !self.pool.grow_for(bytes) {
            return self.pool.oversize(bytes);
        }
        self.pool
            .acquire(&self.streams.cancel)?
            .ok_or(LoaderError::Interrupted)
    }

    /// The next batch, or `None` at the end of the mixture epoch (the next
    /// call starts the following one).
    pub(super) fn next_batch(&mut self) -> Option<Result<Batch>> {
        let result = if self.packer.is_some() {
            self.next_packed()
        } else {
            self.next_rows()
        };
        match result.and_then(|made| made.map(|b| self.steps(b)).transpose()) {
            Ok(Some(batch)) => {
                self.index += 1;
                Some(Ok(batch))
            }
            Ok(None) => {
                // The mixture epoch is over: counts restart with the next.
                self.epoch += 1;
                self.index = 0;
                self.streams.ended = false;
                self.streams.blend.reset();
                for s in &mut self.streams.sources {
                    s.exhausted = false;
                }
                self.epoch_start = self
                    .streams
                    .sources
                    .iter()
                    .map(|s| (s.epoch, s.position))
                    .collect();
                if let Some(p) = &mut self.packer {
                    p.reset();
                }
                self.streams.anchor = None;
                self.streams.previous_anchor = None;
                None
            }
            Err(e) => Some(Err(e)),
        }
    }

    /// The batch through the user's steps ([`crate::LoaderBuilder::filter`],
    /// `map_rows`, `map_batch`), if any: each row's generator follows
    /// (rank, batch index, position).
    fn steps(&mut self, mut batch: Batch) -> Result<Batch> {
        if self.steps.is_empty() {
            return Ok(batch);
        }
        let index = batch.index();
        batch.filtered = self
            .steps
            .apply(
                &mut batch,
                self.seed,
                self.epoch,
                self.rank,
                &mut Vec::new(),
            )
            .map_err(|e| {
                let row = e.row.map_or(String::new(), |r| format!(", row {r}"));
                LoaderError::stage(
                    Stage::Mix,
                    None,
                    None,
                    format!("{} failed on batch {index}{row}: {}", e.step, e.detail),
                )
            })?;
        Ok(batch)
    }

    /// A partial batch at the epoch's end: kept, or dropped with `drop_last`.
    pub(super) fn partial(&mut self, rows: usize) -> bool {
        if rows == 0 {
            return false;
        }
        if rows < self.batch_size && self.drop_last {
            self.dropped_batches += 1;
            return false;
        }
        true
    }

    pub(super) fn next_packed(&mut self) -> Result<Option<Batch>> {
        let packer = self.packer.as_mut().expect("packing");
        let l = packer.options.length;
        let b = self.batch_size;
        // At most i32::MAX: checked when the mixture was built.
        let tokens = b * l;
        let mut lease = self.lease(packed_slab_bytes(tokens)?)?;
        let region = (tokens * 4).next_multiple_of(64);
        let cu_region = ((tokens + 1) * 4).next_multiple_of(64);
        let slab = lease.slab_mut().as_mut_slice();
        let (ids, rest) = slab.split_at_mut(region);
        let (pos, rest) = rest.split_at_mut(region);
        let (seg, rest) = rest.split_at_mut(region);
        let (cu, rest) = rest.split_at_mut(cu_region);
        let (src, _) = rest.split_at_mut(region);
        let mut out = Out {
            input_ids: as_i32(ids, tokens),
            position_ids: as_i32(pos, tokens),
            segment_ids: as_i32(seg, tokens),
            cu_seqlens: as_i32(cu, tokens + 1),
            source: as_i32(src, tokens),
            segments: 0,
        };
        let packer = self.packer.as_mut().expect("packing");
        let rows = packer.fill(&mut self.streams, b, &mut out)?;
        let segments = out.segments;
        if !self.partial(rows) {
            return Ok(None);
        }
        let int32 = |shape: Vec<usize>, offset: usize| Buffer {
            dtype: DType::I32,
            shape,
            offset,
        };
        let dense = |name: &str, values: Buffer| Column {
            name: name.into(),
            layout: ColumnLayout::Dense { values },
            validity: None,
        };
        let columns = vec![
            dense("input_ids", int32(vec![rows, l], 0)),
            dense("position_ids", int32(vec![rows, l], region)),
            dense("segment_ids", int32(vec![rows, l], 2 * region)),
            dense("cu_seqlens", int32(vec![segments + 1], 3 * region)),
            dense(SOURCE_COLUMN, int32(vec![segments], 3 * region + cu_region)),
        ];
        Ok(Some(self.batch(lease, rows, columns)))
    }

    /// A batch of this mixture's epoch over `lease`.
    pub(super) fn batch(&self, lease: SlabLease, rows: usize, columns: Vec<Column>) -> Batch {
        Batch {
            lease: Arc::new(lease),
            rows,
            columns,
            index: self.index,
            held: None,
            filtered: 0,
            row_ids: None,
        }
    }

    pub(super) fn next_rows(&mut self) -> Result<Option<Batch>> {
        let b = self.batch_size;
        let mut staging = std::mem::take(&mut self.staging);
        staging.iter_mut().for_each(Staged::clear);
        let mut sources: Vec<i32> = Vec::with_capacity(b);
        while sources.len() < b {
            let Some(s) = self.streams.next_row()? else {
                break;
            };
            let src = &self.streams.sources[s];
            let batch = src.batch.as_ref().expect("a row was drawn");
            if staging.is_empty() {
                staging = batch.columns().iter().map(Staged::new).collect();
            }
            for (st, col) in staging.iter_mut().zip(batch.columns()) {
                st.push(batch, col, src.row, sources.len())
                    .map_err(|e| source_error(s, &src.url, e))?;
            }
            sources.push(s as i32);
        }
        let rows = sources.len();
        if !self.partial(rows) {
            return Ok(None);
        }
        // Lay the buffers out, 64-byte aligned, then copy.
        let mut at = 0usize;
        let mut place = |bytes: usize| {
            let offset = at;
            at = (at + bytes).next_multiple_of(64);
            offset
        };
        let mut columns = Vec::with_capacity(staging.len() + 1);
        let mut copies: Vec<(usize, &[u8])> = Vec::new();
        for st in &staging {
            let (column, mut c) = st.layout(rows, &mut place);
            columns.push(column);
            copies.append(&mut c);
        }
        let source_bytes: &[u8] = as_bytes(&sources);
        let src_offset = place(source_bytes.len());
        copies.push((src_offset, source_bytes));
        columns.push(Column {
            name: SOURCE_COLUMN.into(),
            layout: ColumnLayout::Dense {
                values: Buffer {
                    dtype: DType::I32,
                    shape: vec![rows],
                    offset: src_offset,
                },
            },
            validity: None,
        });
        let mut lease = self.lease(at.max(64))?;
        let slab = lease.slab_mut().as_mut_slice();
        for (offset, bytes) in copies {
            slab[offset..offset + bytes.len()].copy_from_slice(bytes);
        }
        let batch = self.batch(lease, rows, columns);
        self.staging = staging;
        Ok(Some(batch))
    }
}
