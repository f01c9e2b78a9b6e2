//! The README's Rust quickstart, as written: an end-to-end test checks that
//! the two agree and runs this over a small generated dataset `ds`.

fn main() -> Result<(), shardfeed_loader::LoaderError> {
    let loader = quickstart()?;
    println!("rows {}", loader.stats().rows);
    Ok(())
}

#[rustfmt::skip]
#[allow(unused_variables)]
fn quickstart() -> Result<shardfeed_loader::Loader, shardfeed_loader::LoaderError> {
    // README begins
    use shardfeed_loader::Loader;
    let mut loader = Loader::builder("ds").batch_size(256).columns(["input_ids"]).seed(0).build()?;
    for epoch in 0..3 {
        loader.set_epoch(epoch);
        for batch in &mut loader {
            let batch = batch?;                                    // one slab of the pool
            let ids: &[i32] = batch.values("input_ids").unwrap(); // ragged values, with offsets
        }
    }
    // README ends
    Ok(loader)
}
