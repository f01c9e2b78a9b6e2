//! Images decoded by the loader, through the Rust API: PNGs written here
//! (exact pixels), sharded as an ImageFolder with the README's command.

use shardfeed_loader::{Crop, Loader};

use crate::support::*;

/// A `w x h` RGB PNG whose pixels are a function of (x, y, k).
fn png(w: u32, h: u32, k: u32) -> (Vec<u8>, Vec<u8>) {
    let pixels: Vec<u8> = (0..h)
        .flat_map(|y| {
            (0..w).flat_map(move |x| {
                [
                    (x * 7 + k) as u8,
                    (y * 5 + k * 3) as u8,
                    ((x ^ y) + k) as u8,
                ]
            })
        })
        .collect();
    let mut out = Vec::new();
    let mut e = png::Encoder::new(&mut out, w, h);
    e.set_color(png::ColorType::Rgb);
    e.set_depth(png::BitDepth::Eight);
    let mut writer = e.write_header().unwrap();
    writer.write_image_data(&pixels).unwrap();
    writer.finish().unwrap();
    (out, pixels)
}

/// `crop = Resize` to the images' own size returns their pixels exactly
/// (channels last and first); `random_resized` + flip gives the same batches
/// with 1 and 3 threads and after a resume; a corrupt image is an error
/// naming shard, row group and row.
#[test]
fn pngs_decode_exactly_and_crops_do_not_depend_on_threads() {
    let tmp = tempdir();
    let root = tmp.path().join("images");
    let (w, h) = (40u32, 30u32);
    let mut expected = std::collections::HashMap::new();
    for k in 0..24u32 {
        let dir = root.join(format!("class{}", k % 3));
        std::fs::create_dir_all(&dir).unwrap();
        let (bytes, pixels) = png(w, h, k);
        std::fs::write(dir.join(format!("i{k:02}.png")), bytes).unwrap();
        expected.insert(format!("class{}/i{k:02}.png", k % 3), pixels);
    }
    let ds = tmp.path().join("ds");
    shardfeed(&[
        "shard".into(),
        s(&root),
        "-o".into(),
        s(&ds),
        "--row-group-rows".into(),
        "5".into(),
    ])
    .success();
    let url = s(&ds);

    let builder = || {
        Loader::builder(&url)
            .batch_size(4)
            .columns(["path", "bytes"])
            .decode_images(["bytes"])
    };
    let mut seen = 0;
    for channels_first in [false, true] {
        let mut loader = builder()
            .image_size(h, w)
            .crop(Crop::Resize)
            .channels_first(channels_first)
            .drop_last(false)
            .build()
            .unwrap();
        for batch in &mut loader {
            let batch = batch.unwrap();
            let pixels: &[u8] = batch.values("bytes").unwrap();
            let per = (w * h * 3) as usize;
            for (i, path) in batch.binary("path").unwrap().enumerate() {
                let path = std::str::from_utf8(path).unwrap();
                let want = &expected[path];
                let got = &pixels[i * per..(i + 1) * per];
                if channels_first {
                    let plane = (w * h) as usize;
                    for p in 0..plane {
                        for c in 0..3 {
                            assert_eq!(got[c * plane + p], want[p * 3 + c], "{path}");
                        }
                    }
                } else {
                    assert_eq!(got, &want[..], "{path}");
                }
                seen += 1;
            }
        }
    }
    assert_eq!(seen, 48);

    let random = |threads: usize| {
        builder()
            .image_size(16, 16)
            .crop(Crop::RandomResized)
            .flip(true)
            .decode_threads(threads)
            .seed(9)
            .build()
            .unwrap()
    };
    let collect = |loader: &mut Loader| -> Vec<Vec<u8>> {
        loader
            .by_ref()
            .map(|b| b.unwrap().values::<u8>("bytes").unwrap().to_vec())
            .collect()
    };
    let one = collect(&mut random(1));
    let three = collect(&mut random(3));
    assert_eq!(one.len(), 6);
    assert_eq!(one, three);
    let mut first = random(2);
    for _ in 0..2 {
        first.next().unwrap().unwrap();
    }
    let state = first.state();
    let mut resumed = random(1);
    resumed.resume(&state).unwrap();
    assert_eq!(collect(&mut resumed), one[2..].to_vec());

    // A corrupt image: an error naming where it is.
    let dir = root.join("class0");
    let (bytes, _) = png(w, h, 99);
    std::fs::write(dir.join("zz.png"), &bytes[..bytes.len() / 2]).unwrap();
    let bad = tmp.path().join("bad");
    shardfeed(&["shard".into(), s(&root), "-o".into(), s(&bad)]).success();
    let mut loader = Loader::builder(&s(&bad))
        .batch_size(5)
        .decode_images(["bytes"])
        .drop_last(false)
        .build()
        .unwrap();
    let error = loader
        .by_ref()
        .find_map(|b| b.err())
        .expect("the truncated PNG fails");
    let message = error.to_string();
    assert!(
        message.contains(
            "image in column `bytes` of shard shards/part-000000.parquet row group 0 row"
        ),
        "{message}"
    );
}

/// A null image (a nullable binary column) is not decoded: its slot holds
/// zeros and its validity 0, beside decoded images in the same batch,
/// however the batch's slab was used before.
#[test]
fn null_images_collate_to_zeros() {
    use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch};
    use std::sync::Arc;
    let tmp = tempdir();
    let (w, h) = (8u32, 6u32);
    let images: Vec<(Option<Vec<u8>>, Vec<u8>)> = (0..12u32)
        .map(|k| {
            let (bytes, pixels) = png(w, h, k);
            ((k % 4 != 1).then_some(bytes), pixels)
        })
        .collect();
    let batch = RecordBatch::try_from_iter_with_nullable([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..12)) as ArrayRef,
            false,
        ),
        (
            "bytes",
            Arc::new(BinaryArray::from_iter(
                images.iter().map(|(b, _)| b.as_deref()),
            )) as ArrayRef,
            true,
        ),
    ])
    .unwrap();
    let input = tmp.path().join("images.parquet");
    write_parquet(&input, &batch);
    let ds = tmp.path().join("ds");
    shardfeed(&["shard".into(), s(&input), "-o".into(), s(&ds)]).success();
    // A batch size that reuses slabs across epochs: a null slot must not
    // keep the pixels an earlier batch left there.
    let mut loader = Loader::builder(&s(&ds))
        .batch_size(4)
        .decode_images(["bytes"])
        .image_size(h, w)
        .crop(Crop::Resize)
        .prefetch(2)
        .build()
        .unwrap();
    let per = (w * h * 3) as usize;
    let mut nulls = 0;
    for _ in 0..3 {
        for batch in &mut loader {
            let batch = batch.unwrap();
            let ids: &[i64] = batch.values("id").unwrap();
            let pixels: &[u8] = batch.values("bytes").unwrap();
            let valid = batch
                .validity("bytes")
                .expect("a nullable column has validity");
            for (i, &id) in ids.iter().enumerate() {
                let slot = &pixels[i * per..(i + 1) * per];
                match &images[id as usize].0 {
                    None => {
                        assert_eq!(valid[i], 0, "row {id}");
                        assert!(slot.iter().all(|&p| p == 0), "row {id} is null");
                        nulls += 1;
                    }
                    Some(_) => {
                        assert_eq!(valid[i], 1, "row {id}");
                        assert_eq!(slot, &images[id as usize].1[..], "row {id}");
                    }
                }
            }
        }
    }
    assert_eq!(nulls, 9);
}
