//! Split runs: `shard --num-tasks N --task-index I` on each of N workers (any
//! engine that runs indexed tasks), then one `commit`.
//!
//! The inputs are cut into units (a Parquet row group, or a whole file of the
//! other formats, or a chunk of a folder input), in the order a single run
//! reads them; each unit goes to the task whose share of the total weight
//! (compressed bytes) holds the unit's midpoint. The split is a pure function
//! of the inputs and N, so a re-run task reads exactly what it read before,
//! rewrites the same shard names (`shards/task-IIIII-part-PPPPPP.parquet`)
//! and its record (`_tasks/task-IIIII-of-NNNNN.json`), written last.
//! `commit` checks every record and shard, then writes the manifest.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;

use object_store::ObjectStoreExt;
use parquet::file::metadata::ParquetMetaDataReader;
use serde::Serialize;
use shardfeed_format::{Location, MANIFEST_FILE, Manifest, TASKS_DIR, TaskRecord};

use crate::input::{InputFormat, Inputs, Source};
use crate::options::{TaskSplit, TaskStage};
use crate::pipeline::{ShardSummary, write_dataset};
use crate::{PreprocessError, Result, ShardOptions, output, shuffle};

/// Folder (under the dataset) of the rows scattered between shuffled tasks.
const SCATTER_DIR: &str = "_scatter";

fn scatter_record_path(index: usize, count: usize) -> String {
    format!("{TASKS_DIR}/scatter-{index:05}-of-{count:05}.json")
}

/// Rows of task `from` sent to task `to`.
fn scatter_file(to: usize, from: usize) -> String {
    format!("{SCATTER_DIR}/to-{to:05}/from-{from:05}.arrows")
}

/// A task of a split run with `--shuffle`: scatter this task's rows to every
/// task (each row to a task drawn by a seeded hash), wait until every task has
/// scattered, then gather the rows sent here and shuffle them locally (the
/// single-machine external shuffle, bounded by the memory budget). Every row
/// lands in a uniformly random task and a uniformly random place there, so
/// the committed dataset is one uniform permutation of all inputs.
pub(crate) fn shuffled(
    inputs: &Inputs,
    location: &Location,
    options: &ShardOptions,
    task: TaskSplit,
    seed: u64,
    handle: &tokio::runtime::Handle,
    started: std::time::Instant,
) -> Result<ShardSummary> {
    let scattered =
        handle.block_on(location.exists(&scatter_record_path(task.index, task.count)))?;
    let mut rows_scattered = 0;
    if options.stage == TaskStage::Scatter || (options.stage == TaskStage::Both && !scattered) {
        rows_scattered = scatter(inputs, location, options, task, seed, handle)?;
    }
    if options.stage == TaskStage::Scatter {
        return Ok(ShardSummary {
            dataset: location.url().to_string(),
            rows: rows_scattered,
            shards: 0,
            row_groups: 0,
            input_bytes: 0,
            output_bytes: 0,
            compression_ratio: 0.0,
            seconds: started.elapsed().as_secs_f64(),
            input_mb_per_s: 0.0,
            shuffled: true,
            tasks: Some(task.count),
            threads: options.effective_threads(),
            peak_rss_bytes: crate::measure::peak_rss_bytes(),
            skipped_inputs: inputs.skipped.clone(),
            tokens: None,
            null_texts_skipped: 0,
        });
    }
    wait_for_scatter(location, task, options, handle)?;
    let (gathered, _staged) = gather_inputs(inputs, location, options, task, handle)?;
    let mut local = options.clone();
    local.shuffle_seed = Some(shardfeed_format::permute::hash_words(&[
        seed,
        task.index as u64,
        0x6761_7468,
    ]));
    local.recorded_seed = Some(seed);
    write_dataset(&gathered, location, &local, handle, started)
}

/// Scatter this task's rows; returns how many.
fn scatter(
    inputs: &Inputs,
    location: &Location,
    options: &ShardOptions,
    task: TaskSplit,
    seed: u64,
    handle: &tokio::runtime::Handle,
) -> Result<u64> {
    let mut rows = 0u64;
    let batches = inputs.sources.iter().flat_map(|source| {
        let opened: Box<dyn Iterator<Item = Result<arrow_array::RecordBatch>>> =
            match crate::input::open(source, &inputs.schema, options.max_value_bytes(), &[]) {
                Ok(it) => it,
                Err(e) => Box::new(std::iter::once(Err(e))),
            };
        opened
    });
    let batches = batches.inspect(|b| {
        if let Ok(b) = b {
            rows += b.num_rows() as u64;
        }
    });
    // Buckets are staged beside their final place when the output is local
    // (so publishing is a rename), else in the temporary folder.
    let temp = match location.local_root() {
        Some(root) => {
            let dir = root.join(SCATTER_DIR);
            std::fs::create_dir_all(&dir)
                .map_err(|e| PreprocessError::io("create folder", &dir, e))?;
            Some(dir)
        }
        None => options.temp_dir.clone(),
    };
    let task_seed = shardfeed_format::permute::hash_words(&[seed, task.index as u64, 0x7363_6174]);
    let spilled = shuffle::scatter(
        batches,
        &inputs.schema,
        task_seed,
        task.count as u64,
        // Every bucket becomes a file for the other tasks: nothing is held.
        (options.memory_budget, u64::MAX),
        temp.as_deref(),
        true,
    )?;
    let (_dir, files) = spilled.into_files()?;
    let publish = output::publisher(
        location,
        handle,
        options.temp_dir.as_deref(),
        &options.attempt,
    )?;
    for (to, path) in files.iter().enumerate() {
        if path.exists() {
            publish.publish(path, &scatter_file(to, task.index))?;
        }
    }
    let record = serde_json::json!({
        "task_index": task.index,
        "num_tasks": task.count,
        "rows": rows,
    });
    handle.block_on(location.put(
        &scatter_record_path(task.index, task.count),
        serde_json::to_vec_pretty(&record).expect("a scatter record always serializes"),
    ))?;
    Ok(rows)
}

/// Wait until every task's scatter record is there (or fail at once for
/// `--stage gather`, naming the missing tasks).
fn wait_for_scatter(
    location: &Location,
    task: TaskSplit,
    options: &ShardOptions,
    handle: &tokio::runtime::Handle,
) -> Result<()> {
    let count = task.count;
    let deadline = std::time::Instant::now() + options.wait_timeout;
    loop {
        let names: std::collections::HashSet<String> = handle
            .block_on(location.list(TASKS_DIR))?
            .into_iter()
            .map(|m| format!("{TASKS_DIR}/{}", m.location.filename().unwrap_or_default()))
            .collect();
        let missing: Vec<String> = (0..count)
            .filter(|&i| !names.contains(&scatter_record_path(i, count)))
            .map(|i| i.to_string())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if options.stage == TaskStage::Gather || std::time::Instant::now() >= deadline {
            return Err(PreprocessError::Gather {
                url: location.url().to_string(),
                task: task.index,
                reason: format!(
                    "{} of {count} tasks have not scattered their rows yet: task {}",
                    missing.len(),
                    missing.join(", ")
                ),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// The rows scattered to this task, as inputs (staged locally when remote).
fn gather_inputs(
    inputs: &Inputs,
    location: &Location,
    options: &ShardOptions,
    task: TaskSplit,
    handle: &tokio::runtime::Handle,
) -> Result<(Inputs, Option<tempfile::TempDir>)> {
    let folder = format!("{SCATTER_DIR}/to-{:05}", task.index);
    let (dir, staged) = match location.local_root() {
        Some(root) => (root.join(&folder), None),
        None => {
            let (paths, staged) =
                crate::remote::stage(&[location.url_of(&folder)], options, handle).or_else(
                    |e| match e {
                        // Nothing was sent to this task.
                        PreprocessError::InputNotFound { .. } | PreprocessError::NoMatch { .. } => {
                            Ok((Vec::new(), None))
                        }
                        e => Err(e),
                    },
                )?;
            match paths.into_iter().next() {
                Some(p) => (std::path::PathBuf::from(p), staged),
                None => (std::path::PathBuf::new(), staged),
            }
        }
    };
    let mut files: Vec<std::path::PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "arrows"))
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    let estimated_bytes = files
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    let sources = files
        .into_iter()
        .map(|path| Source::File {
            path,
            format: InputFormat::Ipc,
            row_groups: None,
        })
        .collect();
    Ok((
        Inputs {
            sources,
            schema: inputs.schema.clone(),
            estimated_bytes,
            given: vec![location.url_of(&folder)],
            skipped: Vec::new(),
        },
        staged,
    ))
}

/// The identity of a split run when no `--run-id` is given: a fingerprint of
/// every input (its path and size, in order) and of the options that shape
/// the output. Every task of a run computes the same one; a task run later
/// on other inputs or options (a stale record after `--overwrite`) does not.
pub(crate) fn run_fingerprint(
    inputs: &Inputs,
    options: &ShardOptions,
    tasks: usize,
) -> Result<String> {
    use shardfeed_format::permute::hash_words;
    let text = |s: &str| -> u64 { hash_words(&s.bytes().map(u64::from).collect::<Vec<_>>()) };
    let mut words = vec![
        tasks as u64,
        options.zstd_level as u64,
        options.shard_size,
        options.row_group_rows.unwrap_or(0),
        options.effective_row_group_bytes(),
        options.effective_large_row_group_bytes().unwrap_or(0),
        options.shuffle_seed.map_or(u64::MAX, |s| s),
    ];
    for source in &inputs.sources {
        match source {
            Source::File { path, .. } => {
                let size = std::fs::metadata(path)
                    .map_err(|e| PreprocessError::io("read metadata of", path, e))?
                    .len();
                words.extend([text(&path.display().to_string()), size]);
            }
            Source::Files { root, files, .. } => {
                words.push(text(&root.display().to_string()));
                for (file, _) in files {
                    words.push(text(file));
                }
            }
        }
    }
    Ok(format!("{:016x}", hash_words(&words)))
}

/// Before a task writes: records of another split run under `_tasks/` are
/// removed with `--overwrite`, and refused without it (they would be
/// committed with this run's).
pub(crate) fn claim_output(
    location: &Location,
    options: &ShardOptions,
    handle: &tokio::runtime::Handle,
) -> Result<()> {
    let mut others = Vec::new();
    for meta in handle.block_on(location.list(TASKS_DIR))? {
        let name = meta.location.filename().unwrap_or_default().to_string();
        if parse_record_name(&name).is_none() {
            continue;
        }
        let bytes = handle.block_on(location.read(&format!("{TASKS_DIR}/{name}")))?;
        let run = serde_json::from_slice::<TaskRecord>(&bytes)
            .map_or_else(|_| String::new(), |r| r.run_id);
        if run != options.run {
            others.push((name, run, meta.location));
        }
    }
    if others.is_empty() {
        return Ok(());
    }
    if options.overwrite {
        for (_, _, path) in &others {
            handle.block_on(location.delete(path))?;
        }
        return Ok(());
    }
    let (name, run, _) = &others[0];
    Err(PreprocessError::OtherRun {
        url: location.url().to_string(),
        detail: format!(
            "{TASKS_DIR}/{name} (run {run:?}, and {} more) is not of this run ({:?}); pass --overwrite to replace that run, or give every task the same --run-id",
            others.len() - 1,
            options.run
        ),
    })
}

/// One unit of input and its weight.
struct Unit {
    source: Source,
    weight: u64,
}

fn units(sources: Vec<Source>) -> Result<Vec<Unit>> {
    let mut out = Vec::new();
    for source in sources {
        match &source {
            Source::File {
                path,
                format: InputFormat::Parquet,
                row_groups: None,
            } => {
                let file = File::open(path).map_err(|e| PreprocessError::io("open", path, e))?;
                let meta = ParquetMetaDataReader::new()
                    .parse_and_finish(&file)
                    .map_err(|e| PreprocessError::read(path, None, e))?;
                for (i, rg) in meta.row_groups().iter().enumerate() {
                    out.push(Unit {
                        source: Source::File {
                            path: path.clone(),
                            format: InputFormat::Parquet,
                            row_groups: Some(vec![i]),
                        },
                        weight: rg.compressed_size().max(1) as u64,
                    });
                }
            }
            Source::File { path, .. } => {
                let weight = std::fs::metadata(path)
                    .map_err(|e| PreprocessError::io("read metadata of", path, e))?
                    .len();
                out.push(Unit {
                    source,
                    weight: weight.max(1),
                });
            }
            Source::Files { files, .. } => {
                let weight = files.len().max(1) as u64;
                out.push(Unit { source, weight });
            }
        }
    }
    Ok(out)
}

/// The sources task `task.index` of `task.count` reads, in order.
pub(crate) fn split(sources: Vec<Source>, task: TaskSplit) -> Result<Vec<Source>> {
    let units = units(sources)?;
    let total: u128 = units.iter().map(|u| u.weight as u128).sum::<u128>().max(1);
    let mut mine: Vec<Source> = Vec::new();
    let mut before: u128 = 0;
    for unit in units {
        let mid = before + unit.weight as u128 / 2;
        before += unit.weight as u128;
        let owner = ((mid * task.count as u128) / total).min(task.count as u128 - 1) as usize;
        if owner != task.index {
            continue;
        }
        // Merge consecutive row groups of one file into one source.
        if let (
            Some(Source::File {
                path: last_path,
                row_groups: Some(last_groups),
                ..
            }),
            Source::File {
                path,
                row_groups: Some(groups),
                ..
            },
        ) = (mine.last_mut(), &unit.source)
            && last_path == path
        {
            last_groups.extend_from_slice(groups);
            continue;
        }
        mine.push(unit.source);
    }
    Ok(mine)
}

/// What `commit` did.
#[derive(Clone, Debug, Serialize)]
pub struct CommitSummary {
    /// The dataset committed.
    pub dataset: String,
    /// Tasks in the run.
    pub tasks: usize,
    /// Shards in the manifest.
    pub shards: usize,
    /// Rows in the dataset.
    pub rows: u64,
    /// Whether the manifest was already there, identical (a repeated commit).
    pub already_committed: bool,
}

/// Check that every task of the split run at `output` finished, with one
/// schema and one set of options, and that every shard they list is in place;
/// then write the manifest (shards in task order) and remove shard files no
/// task lists (left by earlier attempts).
pub fn commit(output: &str, storage_options: &[(String, String)]) -> Result<CommitSummary> {
    let location = Location::parse_with_options(output, storage_options.iter().cloned())?;
    // Multi-threaded: `remove_stale` blocks on the runtime's handle, which a
    // current-thread runtime would not drive.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| PreprocessError::io("start I/O runtime for", output, e))?;
    let lock = crate::lock::Lock::acquire(
        &location,
        runtime.handle(),
        "commit",
        &crate::lock::run_id(),
    )?;
    let (summary, keep) = runtime.block_on(commit_at(&location))?;
    output::remove_stale(&location, &keep, runtime.handle())?;
    runtime.block_on(remove_scatter(&location))?;
    lock.release()?;
    Ok(summary)
}

async fn commit_at(
    location: &Location,
) -> Result<(CommitSummary, Vec<shardfeed_format::ShardEntry>)> {
    let incomplete = |reason: String| PreprocessError::Commit {
        url: location.url().to_string(),
        reason,
    };
    // Records, keyed by run size then task.
    let mut runs: BTreeMap<usize, BTreeMap<usize, TaskRecord>> = BTreeMap::new();
    for meta in location.list(TASKS_DIR).await? {
        let name = meta.location.filename().unwrap_or_default().to_string();
        let Some((index, count)) = parse_record_name(&name) else {
            continue;
        };
        let relative = format!("{TASKS_DIR}/{name}");
        let bytes = location.read(&relative).await?;
        let record: TaskRecord = serde_json::from_slice(&bytes).map_err(|e| {
            incomplete(format!(
                "task record {} is not valid: {e}",
                location.url_of(&relative)
            ))
        })?;
        if record.task_index != index || record.num_tasks != count {
            return Err(incomplete(format!(
                "task record {} describes task {} of {}",
                location.url_of(&relative),
                record.task_index,
                record.num_tasks
            )));
        }
        runs.entry(count).or_default().insert(index, record);
    }
    if runs.len() > 1 {
        let sizes: Vec<String> = runs.keys().map(|n| n.to_string()).collect();
        return Err(incomplete(format!(
            "{TASKS_DIR}/ holds records of runs with different --num-tasks ({}); remove the stale ones",
            sizes.join(", ")
        )));
    }
    let Some((count, records)) = runs.into_iter().next() else {
        return Err(incomplete(format!(
            "no task has finished: {} is empty",
            location.url_of(TASKS_DIR)
        )));
    };
    let missing: Vec<String> = (0..count)
        .filter(|i| !records.contains_key(i))
        .map(|i| i.to_string())
        .collect();
    if !missing.is_empty() {
        return Err(incomplete(format!(
            "{} of {count} tasks have not finished (no record under {TASKS_DIR}/): task {}; run them (again) with --num-tasks {count} --task-index I",
            missing.len(),
            missing.join(", ")
        )));
    }
    let first = &records[&0];
    let other_runs: Vec<String> = records
        .values()
        .filter(|r| r.run_id != first.run_id)
        .map(|r| format!("task {} (run {:?})", r.task_index, r.run_id))
        .collect();
    if !other_runs.is_empty() {
        return Err(incomplete(format!(
            "task records of different runs: task 0 is of run {:?}, but {}; re-run those tasks with this run's inputs and options (or --run-id)",
            first.run_id,
            other_runs.join(", ")
        )));
    }
    for record in records.values() {
        if let Some(detail) = crate::input::schema_difference(&first.schema, &record.schema) {
            return Err(incomplete(format!(
                "task {} wrote a different schema from task 0: {detail}",
                record.task_index
            )));
        }
        if record.options != first.options {
            return Err(incomplete(format!(
                "task {} was run with different options from task 0 ({:?} vs {:?})",
                record.task_index, record.options, first.options
            )));
        }
    }
    // Every listed shard is in place, with the size its task recorded.
    let present: HashMap<String, u64> = location
        .list("shards")
        .await?
        .into_iter()
        .map(|m| {
            (
                format!("shards/{}", m.location.filename().unwrap_or_default()),
                m.size,
            )
        })
        .collect();
    // The manifest the records describe, checked as its readers will check
    // it before anything is read or written: a shard listed twice, paths
    // outside `shards/`, row counts or sizes that overflow are refused.
    let mut shards = Vec::new();
    let mut input_bytes = 0u64;
    let mut tokens: Option<u64> = None;
    let overflow = |what: &str| incomplete(format!("the task records' {what} overflow"));
    for record in records.values() {
        shards.extend(record.shards.iter().cloned());
        input_bytes = input_bytes
            .checked_add(record.input_bytes)
            .ok_or_else(|| overflow("input_bytes"))?;
        if let Some(t) = record.tokens {
            tokens = Some(
                tokens
                    .unwrap_or(0)
                    .checked_add(t)
                    .ok_or_else(|| overflow("token counts"))?,
            );
        }
    }
    let mut manifest = Manifest::new(
        first.schema.clone(),
        first.options.clone(),
        shards,
        input_bytes,
    );
    manifest.total_tokens = tokens;
    manifest.validate(location.url()).map_err(|e| {
        incomplete(format!(
            "the task records describe a dataset its readers would refuse ({e}); re-run the tasks"
        ))
    })?;
    if manifest.total_rows == 0 {
        return Err(PreprocessError::NoRows {
            inputs: format!("all {count} tasks of {}", location.url()),
        });
    }
    for record in records.values() {
        for shard in &record.shards {
            match present.get(&shard.path) {
                Some(&size) if size == shard.bytes => {}
                found => {
                    return Err(incomplete(format!(
                        "shard {} of task {} is {}; re-run that task",
                        location.url_of(&shard.path),
                        record.task_index,
                        found.map_or("missing".to_string(), |s| format!(
                            "{s} bytes, not the {} its record lists",
                            shard.bytes
                        ))
                    )));
                }
            }
        }
        for shard in &record.shards {
            // The bytes in place are the ones the record describes: its
            // footer's checksum (one ranged read per shard).
            let range = shard.bytes.saturating_sub(shard.footer_len)..shard.bytes;
            let path = location.child(&shard.path);
            let footer = location
                .retry()
                .run(|| location.store().get_range(&path, range.clone()), || {})
                .await
                .map_err(|e| shardfeed_format::FormatError::Store {
                    op: "read",
                    url: location.url_of(&shard.path),
                    error: shardfeed_format::StoreError(e),
                })?;
            if shardfeed_format::Crc32::of(&footer) != shard.footer_crc32 {
                return Err(incomplete(format!(
                    "shard {} is not the one task {} recorded (another attempt replaced it); re-run that task",
                    location.url_of(&shard.path),
                    record.task_index
                )));
            }
        }
    }
    let mut already_committed = false;
    if location.has_manifest().await? {
        let existing = location.read(MANIFEST_FILE).await?;
        if existing.as_ref() == manifest.to_json().as_slice() {
            already_committed = true;
        } else {
            return Err(PreprocessError::DatasetExists {
                url: location.url().to_string(),
            });
        }
    } else {
        location.write_manifest(&manifest).await?;
    }
    let summary = CommitSummary {
        dataset: location.url().to_string(),
        tasks: count,
        shards: manifest.shards.len(),
        rows: manifest.total_rows,
        already_committed,
    };
    Ok((summary, manifest.shards))
}

/// Delete the rows scattered between shuffled tasks, once committed.
async fn remove_scatter(location: &Location) -> Result<()> {
    let mut doomed = location.list(SCATTER_DIR).await?;
    doomed.extend(location.list(TASKS_DIR).await?.into_iter().filter(|m| {
        m.location
            .filename()
            .is_some_and(|n| n.starts_with("scatter-"))
    }));
    for meta in doomed {
        location.delete(&meta.location).await?;
    }
    if let Some(root) = location.local_root() {
        let _ = std::fs::remove_dir_all(root.join(SCATTER_DIR));
    }
    Ok(())
}

/// `task-IIIII-of-NNNNN.json` -> (I, N).
fn parse_record_name(name: &str) -> Option<(usize, usize)> {
    let rest = name.strip_prefix("task-")?.strip_suffix(".json")?;
    let (index, count) = rest.split_once("-of-")?;
    Some((index.parse().ok()?, count.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardfeed_format::task_record_path;

    #[test]
    fn record_names_round_trip() {
        let name = task_record_path(3, 12);
        let file = name.rsplit('/').next().unwrap();
        assert_eq!(parse_record_name(file), Some((3, 12)));
        assert_eq!(parse_record_name("task-1.json"), None);
    }
}
