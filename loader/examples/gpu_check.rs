//! GPU check: pinned slabs, asynchronous host-to-device copies, and loader
//! throughput with the copy overlapped. Prints one JSON object.
//!
//! ```sh
//! cargo run --release -p shardfeed-loader --example gpu_check -- /data/ds [batch_size]
//! ```
//! Without a CUDA driver and device it reports the page-aligned fallback and
//! the host-only throughput.

use std::time::Instant;

use shardfeed_loader::{Batch, Loader, Pinning, PinningMode};

type Error = Box<dyn std::error::Error>;

/// Bytes of the slab a batch actually uses.
fn used_bytes(batch: &Batch) -> usize {
    batch
        .columns()
        .iter()
        .flat_map(|c| c.buffers())
        .map(|(_, b)| b.offset + b.bytes())
        .max()
        .unwrap_or(0)
}

fn host_rows_per_s(dataset: &str, batch_size: usize) -> Result<f64, Error> {
    let mut loader = Loader::builder(dataset)
        .batch_size(batch_size)
        .pinning(PinningMode::Off)
        .build()?;
    let started = Instant::now();
    let mut rows = 0;
    for batch in &mut loader {
        rows += batch?.rows();
    }
    Ok(rows as f64 / started.elapsed().as_secs_f64())
}

#[cfg(feature = "cuda")]
fn cuda_checks(dataset: &str, batch_size: usize) -> Result<serde_json::Value, Error> {
    use cudarc::driver::{CudaContext, result};

    let mut loader = Loader::builder(dataset)
        .batch_size(batch_size)
        .pinning(PinningMode::Cuda)
        .build()?;
    assert_eq!(loader.pinning(), Pinning::Cuda);
    let ctx = CudaContext::new(0)?;
    let stream = ctx.new_stream()?;
    let first = loader.next().ok_or("empty dataset")??;
    let bytes = first.slab().capacity();
    // SAFETY: a plain device allocation of `bytes`, freed below.
    let device = unsafe { result::malloc_sync(bytes) }?;
    // SAFETY: the slab holds `bytes` initialised bytes while `first` lives.
    let pinned = unsafe { std::slice::from_raw_parts(first.slab().as_ptr(), bytes) };
    let pageable = vec![1u8; bytes];
    let copies = 50;
    let rate = |src: &[u8]| -> Result<f64, Error> {
        let started = Instant::now();
        for _ in 0..copies {
            // SAFETY: `device` holds `bytes`; `src` outlives the synchronize below.
            unsafe { result::memcpy_htod_async(device, src, stream.cu_stream()) }?;
        }
        stream.synchronize()?;
        Ok((copies * bytes) as f64 / 1e9 / started.elapsed().as_secs_f64())
    };
    let pinned_gb_s = rate(pinned)?;
    let pageable_gb_s = rate(&pageable)?;
    drop(first);

    // Stream an epoch, copying each batch while the loader prepares the next.
    loader.set_epoch(1);
    let started = Instant::now();
    let (mut rows, mut copied) = (0usize, 0usize);
    let mut in_flight: Option<Batch> = None;
    for batch in &mut loader {
        let batch = batch?;
        let used = used_bytes(&batch);
        // SAFETY: the batch (and its slab) is kept alive until the copy completes.
        let src = unsafe { std::slice::from_raw_parts(batch.slab().as_ptr(), used.min(bytes)) };
        stream.synchronize()?; // the previous copy is done: its batch can go
        in_flight.take();
        // SAFETY: as above; `device` holds at least `used` bytes.
        unsafe { result::memcpy_htod_async(device, src, stream.cu_stream()) }?;
        rows += batch.rows();
        copied += used;
        in_flight = Some(batch);
    }
    stream.synchronize()?;
    drop(in_flight);
    let seconds = started.elapsed().as_secs_f64();
    // SAFETY: allocated above and no longer in use.
    unsafe { result::free_sync(device) }?;
    Ok(serde_json::json!({
        "pinning": loader.pinning().name(),
        "slab_bytes": bytes,
        "h2d_pinned_gb_s": pinned_gb_s,
        "h2d_pageable_gb_s": pageable_gb_s,
        "pinned_over_pageable": pinned_gb_s / pageable_gb_s,
        "rows_per_s_with_overlapped_copy": rows as f64 / seconds,
        "h2d_gb_s_while_streaming": copied as f64 / 1e9 / seconds,
    }))
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let dataset = args.get(1).ok_or("usage: gpu_check DATASET [BATCH_SIZE]")?;
    let batch_size: usize = args.get(2).map_or(Ok(256), |s| s.parse())?;
    let host = host_rows_per_s(dataset, batch_size)?;
    let probe = Loader::builder(dataset).batch_size(batch_size).build()?;
    let mut report = serde_json::json!({ "dataset": dataset, "batch_size": batch_size, "rows_per_s_host_only": host });
    if probe.pinning() == Pinning::Cuda {
        drop(probe);
        #[cfg(feature = "cuda")]
        {
            let cuda = cuda_checks(dataset, batch_size)?;
            report["cuda"] = cuda;
        }
    } else {
        report["cuda"] = serde_json::json!(null);
        report["pinning"] = serde_json::json!(probe.pinning().name());
    }
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
