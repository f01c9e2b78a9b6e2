//! Sizes the pipeline plans with: a batch's in-memory bytes, and the
//! process's peak memory.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;

/// The in-memory bytes of a batch's rows (slices count only what they cover).
pub(crate) fn batch_bytes(batch: &RecordBatch) -> u64 {
    batch
        .columns()
        .iter()
        .map(|c| array_bytes(c.as_ref()))
        .sum()
}

/// The bytes of the rows an array covers, following list offsets so that a
/// slice of a list column is not charged for its parent's whole child array.
fn array_bytes(array: &dyn Array) -> u64 {
    let nulls = array
        .logical_nulls()
        .map_or(0, |_| array.len().div_ceil(8) as u64);
    match array.data_type() {
        DataType::List(_) => {
            let list = array.as_list::<i32>();
            let o = list.value_offsets();
            let (start, end) = (o[0] as usize, o[o.len() - 1] as usize);
            nulls
                + 4 * o.len() as u64
                + array_bytes(list.values().slice(start, end - start).as_ref())
        }
        DataType::LargeList(_) => {
            let list = array.as_list::<i64>();
            let o = list.value_offsets();
            let (start, end) = (o[0] as usize, o[o.len() - 1] as usize);
            nulls
                + 8 * o.len() as u64
                + array_bytes(list.values().slice(start, end - start).as_ref())
        }
        DataType::Map(_, _) => {
            let map = array.as_map();
            let o = map.value_offsets();
            let (start, end) = (o[0] as usize, o[o.len() - 1] as usize);
            let entries: ArrayRef = Arc::new(map.entries().clone());
            nulls + 4 * o.len() as u64 + array_bytes(entries.slice(start, end - start).as_ref())
        }
        DataType::FixedSizeList(_, size) => {
            let list = array.as_fixed_size_list();
            let size = *size as usize;
            let values = list.values().slice(list.offset() * size, list.len() * size);
            nulls + array_bytes(values.as_ref())
        }
        DataType::Struct(_) => {
            nulls
                + array
                    .as_struct()
                    .columns()
                    .iter()
                    .map(|c| array_bytes(c.as_ref()))
                    .sum::<u64>()
        }
        _ => array.to_data().get_slice_memory_size().unwrap_or(0) as u64,
    }
}

/// Peak resident set size of this process (Linux), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    kib_field("/proc/self/status", "VmHWM:")
}

/// Anonymous memory of this process now held in transparent huge pages
/// (Linux), in bytes.
pub fn huge_page_bytes() -> Option<u64> {
    kib_field("/proc/self/smaps_rollup", "AnonHugePages:")
}

/// The value of a `NAME: N kB` line of a `/proc` file, in bytes.
fn kib_field(path: &str, name: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}
