//! Assembling a loader from its options: the manifest and the first footer
//! read, the memory policy applied (window, in-flight bytes, slabs), the
//! stages' shared parts (fetch context, pool, counters) made.

use std::sync::Arc;

use shardfeed_format::failpoint::Failpoints;
use shardfeed_format::{Location, Manifest};

use crate::budget;
use crate::cache::ShardCache;
use crate::columns::{ColumnPlan, ListMode, plan_columns};
use crate::error::{LoaderError, Result};
use crate::fetch::{FetchContext, LocalReads};
use crate::loader::Loader;
use crate::parquet::projection;
use crate::pinned::Pool;
use crate::stats::Counters;

use crate::config::*;

impl LoaderBuilder {
    /// Check every option, read the manifest and the first footer, allocate
    /// the pool. Errors name the bad option.
    pub fn build(mut self) -> Result<Loader> {
        self.check()?;
        let bad =
            |option: &'static str, reason: String| Err(LoaderError::BadOption { option, reason });
        let failpoints = match &self.failpoints {
            Some(spec) => Failpoints::parse(spec),
            None => Failpoints::from_env(),
        }
        .map_err(|reason| LoaderError::BadOption {
            option: "failpoints",
            reason,
        })?;
        let world_size = match self.world_size {
            Some(w) => w,
            None => env_u64("WORLD_SIZE")?.unwrap_or(1),
        };
        let rank = match self.rank {
            Some(r) => r,
            None => env_u64("RANK")?.unwrap_or(0),
        };
        if world_size == 0 {
            return bad("world_size", "must be greater than 0".into());
        }
        if rank >= world_size {
            return bad(
                "rank",
                format!("rank {rank} is not below world_size {world_size}"),
            );
        }
        let decode_threads = if self.decode_threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            self.decode_threads
        };
        let mut location = match &self.location {
            Some(l) => l.clone(),
            None => Location::parse_with_options(&self.url, self.storage_options.iter().cloned())?,
        };
        if let Some(faults) = &self.faults {
            location = location.with_faults(faults.clone());
        }
        let runtime = match &self.runtime {
            Some(shared) => shared.clone(),
            None => Arc::new(io_runtime(self.io_threads)?),
        };
        let manifest = Arc::new(runtime.block_on(location.read_manifest_with(&self.retry))?);
        let schema = &manifest.schema;
        // An image struct named in `decode_images` (Hugging Face's `image:
        // struct<bytes, path>`) decodes its `bytes` field.
        self.images.columns = self
            .images
            .columns
            .iter()
            .map(|c| crate::select::image_field(schema, c))
            .collect();
        let images = (!self.images.columns.is_empty()).then_some(&self.images);
        let names: Vec<String> = match &self.columns {
            Some(c) if c.is_empty() => {
                return bad("columns", "must name at least one column".into());
            }
            Some(c) => c.clone(),
            None => schema.fields().iter().map(|f| f.name().clone()).collect(),
        };
        // A struct named (or every column's, by default) loads as its fields.
        let names = crate::select::expand_structs(schema, &names)?;
        // Top-level columns, or fields of structs (`image.bytes`).
        let columns = crate::select::Columns::resolve(schema, &names)?;
        let sorted_roots = columns.roots.clone();
        if let Some((name, other)) = crate::batch::buffer_key_clash(&names) {
            return bad(
                "columns",
                format!(
                    "column `{name}` has the name of a buffer of column `{other}` (a batch's buffers are keyed `<column>.offsets`, `.lengths` and `.validity`): leave one of them out of `columns`"
                ),
            );
        }
        // Decoded batches hold the projected columns in schema order.
        let projected = columns.schema.as_ref().clone();
        if let Some(images) = images
            && let Some(missing) = images.columns.iter().find(|c| !names.contains(c))
        {
            return bad(
                "decode_images",
                format!("`{missing}` is not among the loaded columns {names:?}"),
            );
        }
        let plans = plan_columns(&projected, &names, images)?;

        let counters = Arc::new(Counters {
            trace: self
                .trace
                .as_deref()
                .map(crate::trace::Tracer::create)
                .transpose()?,
            ..Counters::default()
        });
        // Shards read from local files (not through an object store).
        let local = match &manifest.index {
            Some(index) => index.bases.iter().all(|b| b.starts_with("file://")),
            None => location.local_root().is_some(),
        };
        let cache = match (&self.cache_dir, local) {
            (Some(dir), false) => Some(
                ShardCache::new(
                    dir,
                    &format!(
                        "{}|{}",
                        location.url(),
                        crate::state::dataset_fingerprint(&manifest)
                    ),
                    self.cache_limit,
                )
                .map_err(|source| LoaderError::Io {
                    op: format!("create the cache folder {}", dir.display()),
                    source,
                })?,
            ),
            _ => None,
        };
        let places = index_places(&manifest, &self.storage_options, self.faults.as_ref())?;
        let fetch = Arc::new(
            FetchContext::new(
                location.clone(),
                manifest.clone(),
                sorted_roots,
                counters.clone(),
                self.retry.clone(),
                cache,
                LocalReads {
                    // Read buffers (in use and idle) kept for reuse up to the
                    // budget, which already bounds the reads in flight: every
                    // buffer the pipeline goes on needing is kept. Reads of 2 MiB
                    // and more are mapped for themselves, not taken from the
                    // allocator (whose heap they fragmented), so this pool is what
                    // keeps them from being faulted in afresh (docs/performance-notes.md).
                    buffer_bytes: usize::try_from(self.byte_budget).unwrap_or(usize::MAX),
                    threads: local_readers(decode_threads),
                    mapped: self.mapped_reads,
                },
            )
            .with_places(places)
            .with_columns(columns),
        );
        let sizes = estimate_sizes(&runtime, &fetch, &manifest, &self, &plans)?;

        let shuffled_at_shard_time = manifest.options.shuffle_seed.is_some();
        let units = manifest.row_group_count().max(1) as u64;
        // Memory: the budget bounds the projected bytes of row groups fetched
        // or decoded but not yet collated. The collator holds the windows a
        // batch touches: every row group of the batch's rows plus the rest of
        // its first and last windows; the budget must hold that many.
        let min_group_rows = manifest
            .shards
            .iter()
            .flat_map(|s| s.row_groups.iter().copied())
            .filter(|&r| r > 0)
            .min()
            .unwrap_or(1);
        // A mixture's source whose one column is a list of numbers hands
        // its rows on uncollated (an index read in parts aside, below).
        let hands_on = self.handoff
            && images.is_none()
            && self.steps.is_empty()
            && matches!(&plans[..], [p] if matches!(p.kind, crate::columns::Kind::List { .. }))
            && matches!(self.list_mode, ListMode::Ragged);
        let mut shape = budget::Shape {
            byte_budget: self.byte_budget,
            unit_bytes: sizes.unit_bytes,
            units,
            batch_groups: budget::batch_groups(self.batch_size, min_group_rows),
            fitted_window: match self.window_share {
                None => DEFAULT_WINDOW,
                Some(share) if hands_on => budget::handoff_window(share),
                Some(share) => budget::shared_window(share),
            },
        };
        let fitted = shuffled_at_shard_time || !self.shuffle;
        // An index's row groups are its writers' (hundreds of MB from
        // pyarrow, Spark, DuckDB): where the budget cannot hold what two
        // windows of them touch, they are read in parts, each a unit.
        // Parts get the window that mixes best and fits, down to the
        // smallest fitted one.
        // (An index's rows are not random samples: a mixture's share of the
        // default window is not theirs.)
        let part_window = |s: &budget::Shape| {
            self.window.unwrap_or_else(|| {
                let w = s.auto_window(fitted);
                if s.fits(w) {
                    w
                } else if fitted {
                    s.auto_window(true)
                } else {
                    budget::Shape {
                        fitted_window: DEFAULT_WINDOW,
                        ..*s
                    }
                    .auto_window(true)
                }
            })
        };
        let mut part_rows = 0;
        let whole_window = self.window.unwrap_or_else(|| shape.auto_window(fitted));
        if let Some(rows) = self.part_rows.filter(|&r| r > 0) {
            // A state's parts (the order follows them).
            let cut = budget::parts_of(
                &shape,
                sizes.unit_rows,
                sizes.part_overhead,
                self.batch_size,
                rows,
            )
            .ok_or_else(|| LoaderError::BadState {
                reason: format!(
                    "the state reads row groups in parts of {rows} rows, which this dataset's row groups are not cut into"
                ),
            })?;
            part_rows = rows;
            shape = cut;
        } else if self.part_rows.is_none()
            && manifest.index.is_some()
            && !shape.fits(whole_window)
            && let Some((rows, cut)) = budget::parts(
                &shape,
                sizes.unit_rows,
                sizes.part_overhead,
                self.batch_size,
                part_window,
            )
        {
            part_rows = rows;
            shape = cut;
        }
        let window = match self.window {
            Some(w) => w,
            // A dataset shuffled at shard time: windows of the default size,
            // or as large as the budget holds two of (a mixture's sources
            // share one budget: eight sources of 8 MB row groups get 128 MiB
            // each, which holds two windows of 7), down to 2; below that the
            // budget is refused by name.
            None if part_rows > 0 => part_window(&shape),
            None => shape.auto_window(fitted),
        };
        // The window one loader's default gives, without a mixture source's
        // share: what a mixture state saved before sources' windows were
        // recorded was read in.
        let unshared_window = match self.window {
            Some(w) => w,
            None => {
                let one = budget::Shape {
                    fitted_window: DEFAULT_WINDOW,
                    ..shape
                };
                if part_rows > 0 {
                    part_window(&one)
                } else {
                    one.auto_window(fitted)
                }
            }
        };
        if self.window.is_none() && window < shape.fitted_window {
            tracing::info!(
                "{}: shuffle windows of {window} row groups (not {}): byte_budget ({} bytes) holds two of that many",
                location.url(),
                shape.fitted_window,
                self.byte_budget
            );
        }
        if self.shuffle && !shuffled_at_shard_time && (window as u64) < units.min(MIXED_ROW_GROUPS)
        {
            tracing::warn!(
                "{} was written in input order (shard --no-shuffle) and each shuffle window mixes only {window} of its {units} row groups: batches may hold few classes or domains; raise byte_budget or window, or shard it again with the default shuffle",
                location.url()
            );
        }

        let needed = shape.needed(window);
        if !shape.fits(window) {
            let (units, parts) = match part_rows {
                0 => ("row groups", String::new()),
                rows => (
                    "parts",
                    format!(" (row groups read in parts of {rows} rows)"),
                ),
            };
            return bad(
                "byte_budget",
                format!(
                    "{} bytes cannot hold the {needed} {units} (~{} bytes of the projected columns each) that two shuffle windows of {} {units} and a batch of {} rows touch{parts}; raise it, or lower window or batch_size",
                    self.byte_budget, shape.unit_bytes, window, self.batch_size
                ),
            );
        }
        if sizes.batch_bytes > self.byte_budget {
            let option = if matches!(self.list_mode, ListMode::Padded { .. }) {
                "pad_to"
            } else {
                "batch_size"
            };
            return bad(
                option,
                format!(
                    "one batch of {} rows needs about {} bytes, more than the byte budget ({} bytes); lower it or raise byte_budget",
                    self.batch_size, sizes.batch_bytes, self.byte_budget
                ),
            );
        }
        let plan_rows = manifest.total_rows / world_size;
        if self.drop_last
            && !self.keep_partial
            && plan_rows > 0
            && (self.batch_size as u64) > plan_rows
        {
            return bad(
                "batch_size",
                format!(
                    "{} is more than the {plan_rows} rows each of the {world_size} ranks gets per epoch: with drop_last every batch would be dropped",
                    self.batch_size
                ),
            );
        }
        let slab_bytes = match self.slab_bytes {
            Some(b) => b,
            None => sizes.slab_bytes,
        };
        // The default reads ahead as many batches as DEFAULT_PREFETCH_BYTES
        // hold, fewer (down to 2) where their pool would pass its bound on
        // a small budget: a default the user did not set is not refused.
        let prefetch = self.prefetch_batches.unwrap_or_else(|| {
            let most = budget::default_prefetch(sizes.batch_bytes);
            (2..=most)
                .rev()
                .find(|&p| budget::pool_fits(slab_bytes, budget::slabs(p), self.byte_budget))
                .unwrap_or(most.min(2))
        });
        let slabs = budget::slabs(prefetch);
        if !budget::pool_fits(slab_bytes, slabs, self.byte_budget) {
            let option = if self.slab_bytes.is_some() {
                "slab_bytes"
            } else if self.prefetch_batches.is_some() {
                "prefetch"
            } else {
                "byte_budget"
            };
            return bad(
                option,
                format!(
                    "{slabs} slabs of {slab_bytes} bytes (batches of {} rows read {prefetch} ahead) are more than 4x the byte budget ({} bytes); lower prefetch, batch_size or slab_bytes, or raise byte_budget",
                    self.batch_size, self.byte_budget
                ),
            );
        }
        // Read ahead no further than is useful: the row groups that must be
        // held (the window being collated and the next one, fetched and
        // decoded meanwhile) and two per decode thread; from object storage
        // one window more, to keep requests in flight through the latency
        // (with 50 ms per request it was 25% of throughput). Local datasets
        // of fixed-width columns get that window too: the shuffle stage
        // permutes each of their windows whole, a barrier, and without work
        // a window ahead the decode threads idled through it (tabular: 1.6
        // of 2 cores busy, 1.85 with it, +10-15% rows/s for ~40-90 MiB).
        // Elsewhere it would only be fresh memory the first epoch pays for
        // (10-90 MiB more peak RSS for the same throughput on tokens and
        // images).
        // A packing mixture's source hands its rows on uncollated: the
        // batches in flight (a slab each) hold the windows their rows lie
        // in, as many as their rows reach back behind the one the collator
        // is on. Room for those row groups comes on top of what the collator
        // needs, so that the decoders never wait on a batch the consumer
        // holds; where the budget has none, the source collates as usual.
        let handoff_units = (hands_on && part_rows == 0)
            .then(|| {
                let window_rows = (window as u64).saturating_mul(min_group_rows).max(1);
                let behind = (slabs as u64)
                    .saturating_mul(self.batch_size as u64)
                    .div_ceil(window_rows);
                needed
                    .saturating_add(behind.saturating_mul(window as u64))
                    .min(units.max(needed))
            })
            .filter(|&with| sizes.unit_bytes.saturating_mul(with) <= self.byte_budget);
        let fixed_width = plans.iter().all(ColumnPlan::is_fixed_width);
        let extra_window = if local && !(fixed_width && self.shuffle) {
            0
        } else {
            window as u64
        };
        // Batches handed on hold their windows in place of the read-ahead
        // they would have let go: room for the row groups they may hold, no
        // more (more read-ahead would only be memory touched afresh).
        let in_flight = match handoff_units {
            Some(units) => shape
                .in_flight(needed, extra_window, decode_threads)
                .max(sizes.unit_bytes.saturating_mul(units))
                .min(self.byte_budget),
            None => shape.in_flight(needed, extra_window, decode_threads),
        };
        // Slabs for a transform's outputs, as many as the budget allows (and
        // larger ones for outputs larger than batches, within the budget).
        let slabs =
            budget::with_transform_slabs(slabs, slab_bytes, self.transform_slabs, self.byte_budget);
        let pool = Arc::new(
            Pool::new(slabs, slab_bytes, self.pinning, self.shared_slabs)?
                .with_large(self.transform_slabs, self.byte_budget)
                .with_growth(budget::max_slab_bytes(slabs, self.byte_budget)),
        );
        let config = Config {
            batch_size: self.batch_size,
            shuffle: self.shuffle,
            seed: self.seed,
            window,
            unshared_window,
            rank,
            world_size,
            drop_last: self.drop_last,
            keep_partial: self.keep_partial,
            decode_threads,
            decode_niceness: self.decode_niceness,
            // Local reads are copies from the page cache (or a disk read
            // ahead by the kernel) on the read threads: twice as many in
            // flight as threads, so that a thread that finishes one finds the
            // next queued. More threads than decode threads took cores from
            // decoding (one more: images +5-9% rows/s, tokens -7-10%, their
            // CPU time +8%); a queued read holds no buffer, only its share of
            // the byte budget.
            io_concurrency: self.io_concurrency.unwrap_or(if local {
                2 * local_readers(decode_threads)
            } else {
                DEFAULT_IO_CONCURRENCY
            }),
            prefetch_batches: prefetch,
            list_mode: self.list_mode,
            fixed_width,
            plans,
            byte_budget: self.byte_budget,
            in_flight_bytes: in_flight,
            // Each row group's permits are at most a `needed_units`th of
            // them, so that many always fit: with batches handed on, the
            // windows they may hold too.
            needed_units: handoff_units.unwrap_or(needed),
            part_rows,
            batch_bytes: sizes.batch_bytes,
            on_error: self.on_error,
            max_skipped: self.max_skipped,
            failpoints,
            slow_warning: self.slow_warning.filter(|&(f, n)| f > 0.0 && n > 0),
            images: images.cloned(),
            steps: self.steps.clone(),
            row_ids: self.row_ids,
            handoff: handoff_units.is_some(),
        };
        Ok(Loader::from_parts(
            config, manifest, fetch, runtime, pool, counters, self.epoch,
        ))
    }
}

/// Sizes estimated from the manifest and the first footer.
struct Sizes {
    /// Projected bytes (fetched + decoded) of an average row group.
    unit_bytes: u64,
    /// Rows of an average row group.
    unit_rows: u64,
    /// Bytes a part of a row group reads beyond its share
    /// ([`part_overhead_of`], the largest of a row group's sum).
    part_overhead: u64,
    /// Bytes of one collated batch.
    batch_bytes: u64,
    /// Bytes per slab: twice a batch's (decoded images: once).
    slab_bytes: usize,
}

fn estimate_sizes(
    runtime: &tokio::runtime::Runtime,
    fetch: &Arc<FetchContext>,
    manifest: &Manifest,
    builder: &LoaderBuilder,
    plans: &[ColumnPlan],
) -> Result<Sizes> {
    let rows = builder.batch_size;
    let overhead: usize = plans.iter().map(|p| p.overhead_bytes(rows)).sum();
    let Some(first) = manifest.shards.iter().position(|s| s.rows > 0) else {
        return Ok(Sizes {
            unit_bytes: 1,
            unit_rows: 1,
            part_overhead: 0,
            batch_bytes: 0,
            slab_bytes: 64 << 10,
        });
    };
    let footer = runtime.block_on(fetch.footer(first as u32))?;
    let (leaves, _) = projection(&footer.arrow, &fetch.roots);
    // Image columns collate to their decoded size, not their stored one.
    // (A struct's field, `image.bytes`, counts its struct's column.)
    let image_roots: Vec<usize> = builder
        .images
        .columns
        .iter()
        .filter_map(|name| crate::select::root_of(&manifest.schema, name))
        .collect();
    let (image_leaves, _) = projection(&footer.arrow, &image_roots);
    let decoded_per_row = if image_roots.is_empty() {
        0
    } else {
        (builder.images.image_bytes() * image_roots.len()) as u64
    };
    let meta = &footer.footer.metadata;
    let (mut projected, mut all, mut cost) = (0u64, 0u64, 0u64);
    let (mut group_rows, mut part_overhead) = (0u64, 0u64);
    for g in meta.row_groups() {
        cost = cost.saturating_add(fetch.row_group_cost(&footer.arrow, g));
        group_rows = group_rows.saturating_add(g.num_rows().max(0) as u64);
        part_overhead = part_overhead.max(
            leaves
                .iter()
                .map(|&leaf| part_overhead_of(g.column(leaf)))
                .fold(0, u64::saturating_add),
        );
        for (i, c) in g.columns().iter().enumerate() {
            let size = crate::fetch::decoded_bytes(c);
            all = all.saturating_add(size);
            if leaves.contains(&i) && !image_leaves.contains(&i) {
                projected = projected.saturating_add(size);
            }
        }
    }
    let unit_bytes = cost / meta.num_row_groups().max(1) as u64;
    let unit_rows = group_rows / meta.num_row_groups().max(1) as u64;
    // Parquet's uncompressed sizes are of encoded pages (dictionaries, bit
    // packing); scale the dataset's Arrow bytes per row by the projected share.
    let arrow_per_row = manifest.input_bytes as f64 / manifest.total_rows.max(1) as f64;
    let mut per_row = (arrow_per_row * projected as f64 / all.max(1) as f64).ceil() as u64;
    if manifest.index.is_some() {
        // An index's input bytes are its files' sizes, compressed: the first
        // file's decoded sizes come nearer what a batch collates (token lists
        // in place took slabs of half their batches).
        per_row = per_row.max(projected.div_ceil(group_rows.max(1)));
    }
    let padded = match builder.list_mode {
        ListMode::Padded { to, .. } => (to as u64)
            .saturating_mul(8)
            .saturating_mul(plans.len() as u64),
        ListMode::Ragged => 0,
    };
    let batch_bytes = (rows as u64)
        .saturating_mul(
            per_row
                .saturating_add(padded)
                .saturating_add(decoded_per_row),
        )
        .saturating_add(overhead as u64);
    // Twice the estimate for what varies from batch to batch (lists,
    // strings, encoded bytes); decoded images have exactly their size, and
    // so does a batch of fixed-width columns only (when some columns vary,
    // their share of the estimate is itself an estimate: the whole batch
    // keeps the margin).
    let images = (rows as u64).saturating_mul(decoded_per_row);
    let all_fixed = plans.iter().all(|p| p.is_fixed_width() || p.is_image());
    let fixed_bytes = all_fixed.then(|| {
        plans
            .iter()
            .map(|p| p.fixed_bytes(rows) as u64)
            .fold(images, u64::saturating_add)
            .saturating_add(overhead as u64)
    });
    let slab_bytes = budget::slab_bytes(batch_bytes, images, fixed_bytes);
    Ok(Sizes {
        unit_bytes,
        unit_rows,
        part_overhead,
        batch_bytes,
        slab_bytes,
    })
}

/// What a part of a row group reads of `chunk` beyond its share of the
/// rows: the dictionary page, and a data page at each end (the pages that
/// cover its first and last rows also hold rows of other parts). Page sizes
/// come from the chunk's page counts where the footer's reading kept them,
/// else a sixteenth of the chunk, at most pyarrow's default of 1 MiB. An
/// estimate, for the plan: what a part takes of the budget when it is read
/// comes from its pages' map.
fn part_overhead_of(chunk: &parquet::file::metadata::ColumnChunkMetaData) -> u64 {
    let size = chunk.compressed_size().max(0) as u64;
    let dict = chunk.dictionary_page_offset().map_or(0, |d| {
        chunk.data_page_offset().saturating_sub(d).max(0) as u64
    });
    let pages: u64 = chunk.page_encoding_stats().map_or(0, |stats| {
        stats
            .iter()
            .filter(|s| {
                matches!(
                    s.page_type,
                    parquet::basic::PageType::DATA_PAGE | parquet::basic::PageType::DATA_PAGE_V2
                )
            })
            .map(|s| s.count.max(0) as u64)
            .sum()
    });
    let page = match pages {
        0 => (size / 16).min(1 << 20),
        n => size.saturating_sub(dict) / n,
    };
    dict.saturating_add(page.saturating_mul(2)).min(size)
}

/// A loader's I/O runtime, with `threads` workers.
pub(crate) fn io_runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("shardfeed-io")
        .enable_all()
        .build()
        .map_err(|source| LoaderError::Io {
            op: "start the I/O runtime".into(),
            source,
        })
}

/// Threads that read local files (a local dataset's shards, or a remote
/// one's cached copies), for `decode_threads` decode threads.
fn local_readers(decode_threads: usize) -> usize {
    decode_threads.max(2)
}

/// The locations of an index's bases (empty for a dataset of shards), each
/// its own store: the loader's storage options go to those on object
/// stores, none to local folders. A base that does not resolve is an error
/// naming it.
pub(crate) fn index_places(
    manifest: &Manifest,
    storage_options: &[(String, String)],
    faults: Option<&shardfeed_format::fault::FaultConfig>,
) -> Result<Vec<Location>> {
    let Some(index) = &manifest.index else {
        return Ok(Vec::new());
    };
    index
        .bases
        .iter()
        .map(|base| {
            let mut place = if base.starts_with("file://") {
                Location::parse(base)?
            } else {
                Location::parse_with_options(base, storage_options.iter().cloned())?
            };
            if let Some(faults) = faults {
                place = place.with_faults(faults.clone());
            }
            Ok(place)
        })
        .collect()
}
