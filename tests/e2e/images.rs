//! Images decoded by the loader, through the Rust API: PNGs written here
//! (exact pixels), sharded as an ImageFolder with the guide's command (docs/guide/sharding.md).

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

/// A zlib stream of `n` zero bytes, written by hand (fixed Huffman codes: a
/// literal 0, then matches of 258 bytes at distance 1) so that a test can
/// make a chunk that inflates to hundreds of MB without compressing them.
fn zlib_zeros(n: usize) -> Vec<u8> {
    struct Bits {
        out: Vec<u8>,
        acc: u64,
        len: u32,
    }
    impl Bits {
        /// `count` bits of `value`, least significant first.
        fn put(&mut self, value: u64, count: u32) {
            self.acc |= value << self.len;
            self.len += count;
            while self.len >= 8 {
                self.out.push(self.acc as u8);
                self.acc >>= 8;
                self.len -= 8;
            }
        }
        /// A Huffman code: most significant bit first.
        fn code(&mut self, code: u64, count: u32) {
            let reversed = (0..count).fold(0, |r, i| (r << 1) | ((code >> i) & 1));
            self.put(reversed, count);
        }
    }
    let mut b = Bits {
        out: vec![0x78, 0x01],
        acc: 0,
        len: 0,
    };
    b.put(1, 1); // the last block
    b.put(1, 2); // fixed Huffman codes
    b.code(0b0011_0000, 8); // literal 0
    let mut left = n - 1;
    while left > 0 {
        let run = left.min(258);
        if run == 258 {
            b.code(0b1100_0101, 8); // length 258
        } else if run >= 3 {
            // Lengths 3-10: codes 257-264 (7 bits), no extra bits; longer
            // remainders are sent as literals to keep this short.
            let mut r = run;
            while r >= 3 {
                let l = r.min(10);
                b.code(l as u64 - 3 + 1, 7); // 257 + (l - 3) is 0b000_0001.. in 7 bits
                b.code(0, 5); // distance 1
                r -= l;
            }
            for _ in 0..r {
                b.code(0b0011_0000, 8);
            }
            left -= run;
            continue;
        } else {
            for _ in 0..run {
                b.code(0b0011_0000, 8);
            }
            left -= run;
            continue;
        }
        b.code(0, 5); // distance 1
        left -= run;
    }
    b.code(0, 7); // end of block (256)
    if b.len > 0 {
        b.put(0, 8 - b.len);
    }
    let adler = (((n % 65521) as u32) << 16) | 1;
    b.out.extend_from_slice(&adler.to_be_bytes());
    b.out
}

/// `bytes` (a PNG) with an iCCP chunk inserted after its header.
fn with_iccp(bytes: &[u8], compressed: &[u8]) -> Vec<u8> {
    let mut data = b"evil\0\0".to_vec();
    data.extend_from_slice(compressed);
    let mut chunk = (data.len() as u32).to_be_bytes().to_vec();
    chunk.extend_from_slice(b"iCCP");
    chunk.extend_from_slice(&data);
    chunk.extend_from_slice(&shardfeed_format::Crc32::of(&chunk[4..]).0.to_be_bytes());
    let header_end = 8 + 8 + 13 + 4; // signature, IHDR length + type, IHDR, CRC
    [&bytes[..header_end], &chunk, &bytes[header_end..]].concat()
}

/// A PNG whose colour profile inflates to 192 MB decodes without inflating
/// it: the peak RSS of `bench --decode-images` (a child process) on such
/// images stays within 64 MB of the same images without the profile.
#[test]
fn png_colour_profiles_are_not_inflated() {
    let tmp = tempdir();
    let profile = zlib_zeros(192 << 20);
    let mut peaks = Vec::new();
    for evil in [false, true] {
        let root = tmp.path().join(format!("images-{evil}"));
        std::fs::create_dir_all(root.join("a")).unwrap();
        for k in 0..4u32 {
            let (mut bytes, _) = png(32, 24, k);
            if evil {
                bytes = with_iccp(&bytes, &profile);
            }
            std::fs::write(root.join("a").join(format!("{k}.png")), bytes).unwrap();
        }
        let ds = tmp.path().join(format!("ds-{evil}"));
        shardfeed(&["shard".into(), s(&root), "-o".into(), s(&ds)]).success();
        let report = shardfeed(&[
            "bench",
            &s(&ds),
            "--batch-size",
            "2",
            "--threads",
            "1",
            "--decode-images",
            "bytes",
            "--json",
        ])
        .success()
        .json();
        assert_eq!(report["rows"], 4, "{report}");
        peaks.push(report["peak_rss_bytes"].as_u64().unwrap());
    }
    assert!(
        peaks[1] < peaks[0] + (64 << 20),
        "peak RSS {} MB with the profiles, {} MB without",
        peaks[1] >> 20,
        peaks[0] >> 20
    );
}
