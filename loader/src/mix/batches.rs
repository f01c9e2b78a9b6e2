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
            handoff: None,
        }
    }

    pub(super) fn next_rows(&mut self) -> Result<Option<Batch>> {
        let b = self.batch_size;
        let mut staging = std::mem::take(&mut self.staging);
        staging.iter_mut().for_each(Staged::clear);
        let mut sources: Vec<i32> = Vec::with_capacity(b);
        // Rows are copied once, after the batch's rows are drawn, while the
        // sources keep the batches they lie in; staged (copied as drawn)
        // once a source has kept as many as it may.
        let mut direct = self.may_keep();
        let mut at: Vec<RowAt> = Vec::with_capacity(if direct { b } else { 0 });
        for s in &mut self.streams.sources {
            s.keep = direct;
        }
        let made = self.draw_rows(&mut staging, &mut sources, &mut at, &mut direct);
        let made = made.and_then(|()| self.lay_out(&staging, &sources, &at, direct));
        for s in &mut self.streams.sources {
            s.release_kept();
        }
        self.staging = staging;
        made
    }

    /// Draw the batch's rows: into `at` while `direct`, else into `staging`.
    fn draw_rows(
        &mut self,
        staging: &mut Vec<Staged>,
        sources: &mut Vec<i32>,
        at: &mut Vec<RowAt>,
        direct: &mut bool,
    ) -> Result<()> {
        while sources.len() < self.batch_size {
            if *direct
                && self
                    .streams
                    .sources
                    .iter()
                    .any(|s| s.kept.len() >= s.keep_limit())
            {
                // A source may keep no more batches: stage what was drawn.
                self.stage(staging, at, 0)?;
                at.clear();
                *direct = false;
                for s in &mut self.streams.sources {
                    s.keep = false;
                    s.release_kept();
                }
            }
            let Some(s) = self.streams.next_row()? else {
                break;
            };
            let src = &self.streams.sources[s];
            let row = RowAt {
                source: s,
                kept: src.kept.len(),
                row: src.row,
            };
            if *direct {
                at.push(row);
            } else {
                self.stage(staging, &[row], sources.len())?;
            }
            sources.push(s as i32);
        }
        Ok(())
    }

    /// Copy rows `at` into `staging` (made from the first row's batch);
    /// `first` rows were staged before them.
    fn stage(&self, staging: &mut Vec<Staged>, at: &[RowAt], first: usize) -> Result<()> {
        for (i, r) in at.iter().enumerate() {
            let src = &self.streams.sources[r.source];
            let batch = src.batch_at(r.kept);
            if staging.is_empty() {
                *staging = batch.columns().iter().map(Staged::new).collect();
            }
            for (st, col) in staging.iter_mut().zip(batch.columns()) {
                st.push(batch, col, r.row, first + i)
                    .map_err(|e| source_error(r.source, &src.url, e))?;
            }
        }
        Ok(())
    }

    /// The batch of the rows drawn: copied straight from the sources'
    /// batches (`direct`), or from `staging`.
    fn lay_out(
        &mut self,
        staging: &[Staged],
        sources: &[i32],
        at: &[RowAt],
        direct: bool,
    ) -> Result<Option<Batch>> {
        let rows = sources.len();
        if !self.partial(rows) {
            return Ok(None);
        }
        if direct {
            let (lease, columns) = self.lay_out_direct(at, sources)?;
            return Ok(Some(self.batch(lease, rows, columns)));
        }
        self.staged_batches += 1;
        // Lay the buffers out, 64-byte aligned, then copy.
        let mut at = 0usize;
        let mut place = |bytes: usize| {
            let offset = at;
            at = (at + bytes).next_multiple_of(64);
            offset
        };
        let mut columns = Vec::with_capacity(staging.len() + 1);
        let mut copies: Vec<(usize, &[u8])> = Vec::new();
        for st in staging.iter() {
            let (column, mut c) = st.layout(rows, &mut place);
            columns.push(column);
            copies.append(&mut c);
        }
        let source_bytes: &[u8] = as_bytes(sources);
        let src_offset = place(source_bytes.len());
        copies.push((src_offset, source_bytes));
        columns.push(source_column(rows, src_offset));
        let mut lease = self.lease(at.max(64))?;
        let slab = lease.slab_mut().as_mut_slice();
        for (offset, bytes) in copies {
            slab[offset..offset + bytes.len()].copy_from_slice(bytes);
        }
        Ok(Some(self.batch(lease, rows, columns)))
    }
}
