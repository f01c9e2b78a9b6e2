//! Tests of [`super`].

use super::*;

fn id(row: u32) -> RowId {
    RowId {
        shard: 1,
        row_group: 2,
        row,
    }
}

fn key(seed: u64, epoch: u64, row: u32) -> CropKey {
    CropKey {
        seed,
        epoch,
        id: id(row),
        column: 0,
    }
}

/// A photograph-like `w x h` RGB image: gradients plus texture, so
/// every block holds detail and a wrong row shows.
fn photo(w: u32, h: u32, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    let mut rgb = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            let noise = (rng.next_u64() % 48) as u32;
            rgb.push(((x * 255 / w + noise) % 256) as u8);
            rgb.push(((y * 255 / h + noise / 2) % 256) as u8);
            rgb.push((((x ^ y) * 3 + noise) % 256) as u8);
        }
    }
    rgb
}

/// `rgb` as a JPEG with the given chroma sampling (`None`: grayscale),
/// restart interval and progressive flag.
fn jpeg(
    rgb: &[u8],
    w: u32,
    h: u32,
    sampling: Option<jpeg_encoder::SamplingFactor>,
    restart: Option<u16>,
    progressive: bool,
) -> Vec<u8> {
    use jpeg_encoder::{ColorType, Encoder};
    let mut out = Vec::new();
    let mut e = Encoder::new(&mut out, 90);
    e.set_progressive(progressive);
    if let Some(r) = restart {
        e.set_restart_interval(r);
    }
    let (w, h) = (w as u16, h as u16);
    match sampling {
        Some(s) => {
            e.set_sampling_factor(s);
            e.encode(rgb, w, h, ColorType::Rgb).unwrap();
        }
        None => {
            let grey: Vec<u8> = rgb.chunks_exact(3).map(|p| p[1]).collect();
            e.encode(&grey, w, h, ColorType::Luma).unwrap();
        }
    }
    out
}

/// A crop that stops decoding early gives exactly the pixels of a
/// whole-image decode (the rows below it left as garbage in the buffer),
/// for every chroma layout; progressive, truncated and tall crops decode
/// whole.
#[test]
fn crops_decode_only_their_rows_and_give_the_same_pixels() {
    use jpeg_encoder::SamplingFactor as S;
    let options = ImageOptions {
        flip: true,
        ..ImageOptions::default()
    };
    let layouts = [
        (Some(S::R_4_2_0), None, false),
        (Some(S::R_4_2_2), None, false),
        (Some(S::R_4_4_4), None, false),
        (Some(S::R_4_4_0), None, false),
        (Some(S::R_4_2_0), Some(3), false),
        (None, None, false),
        (Some(S::R_4_2_0), None, true),
    ];
    for (i, &(sampling, restart, progressive)) in layouts.iter().enumerate() {
        let (w, h) = if i % 2 == 0 { (333, 250) } else { (250, 333) };
        let bytes = jpeg(&photo(w, h, i as u64), w, h, sampling, restart, progressive);
        let mut partial = 0;
        for row in 0..20 {
            let k = key(11, 0, row);
            let mut whole = Scratch::default();
            let image = decode(&bytes, DEFAULT_MAX_IMAGE_PIXELS, &mut whole).unwrap();
            let mut expected = vec![0u8; options.image_bytes()];
            let crop = crop_box(&options, k, image);
            render(&options, image, crop, &mut whole, &mut expected).unwrap();

            let mut scratch = Scratch {
                rgb: vec![0x5A; (w * h * 3) as usize],
                ..Scratch::default()
            };
            let rows = |d: Decoded| rows_read(&options, crop_box(&options, k, d), d);
            let (got_image, stopped) =
                decode_top(&bytes, DEFAULT_MAX_IMAGE_PIXELS, &mut scratch, &rows).unwrap();
            assert_eq!(got_image, image);
            let mut got = vec![0u8; options.image_bytes()];
            render(&options, image, crop, &mut scratch, &mut got).unwrap();
            assert!(
                got == expected,
                "layout {i} row {row}: crop {crop:?} stopped: {stopped:?}"
            );
            assert_ne!(stopped, Stopped::Retried, "layout {i} row {row}");
            partial += usize::from(stopped == Stopped::Early);
            assert!(!(progressive && stopped == Stopped::Early));
        }
        if !progressive {
            assert!(
                partial >= 5,
                "layout {i}: {partial} of 20 crops stopped early"
            );
        }
        // Truncated (no end-of-image marker): decoded whole, so refused
        // whatever the crop.
        let cut = &bytes[..bytes.len() * 2 / 3];
        for row in 0..5 {
            let k = key(11, 0, row);
            let rows = |d: Decoded| rows_read(&options, crop_box(&options, k, d), d);
            let err = decode_top(
                cut,
                DEFAULT_MAX_IMAGE_PIXELS,
                &mut Scratch::default(),
                &rows,
            );
            assert!(err.is_err(), "layout {i}: a truncated JPEG decoded");
        }
    }
}

/// The loader's byte source ([`input::Input`]) gives the decoder's
/// result through `ZCursor` for every layout, whole or cut anywhere.
#[test]
fn the_jpeg_input_decodes_as_zcursor_does() {
    use jpeg_encoder::SamplingFactor as S;
    use zune_core::colorspace::ColorSpace;
    use zune_core::options::DecoderOptions;
    let options = DecoderOptions::default().jpeg_set_out_colorspace(ColorSpace::RGB);
    let (w, h) = (157, 98);
    let rgb = photo(w, h, 9);
    let layouts = [
        (Some(S::R_4_2_0), None, false),
        (Some(S::R_4_4_0), Some(2), false),
        (None, None, false),
        (Some(S::R_4_2_2), None, true),
    ];
    let mut cuts = 0;
    for (sampling, restart, progressive) in layouts {
        let bytes = jpeg(&rgb, w, h, sampling, restart, progressive);
        let len = bytes.len();
        for end in [
            len,
            len - 1,
            len - 2,
            len * 9 / 10,
            len / 2,
            len / 5,
            30,
            2,
            0,
        ] {
            let cut = &bytes[..end];
            let ours = zune_jpeg::JpegDecoder::new_with_options(input::Input::new(cut), options)
                .decode()
                .map_err(|e| format!("{e:?}"));
            let theirs = zune_jpeg::JpegDecoder::new_with_options(
                zune_core::bytestream::ZCursor::new(cut),
                options,
            )
            .decode()
            .map_err(|e| format!("{e:?}"));
            assert!(ours == theirs, "{sampling:?} {progressive}, cut at {end}");
            cuts += usize::from(end < len && theirs.is_err());
        }
    }
    assert!(cuts > 10, "only {cuts} cut files failed");
}

/// Stopping with no margin falls short of the rows asked for where
/// upsampled rows lag (4:2:0 and 4:4:0): the image is then decoded again
/// whole, with the same pixels.
#[test]
fn an_early_stop_short_of_its_rows_decodes_the_image_again() {
    use jpeg_encoder::SamplingFactor as S;
    let (w, h) = (300, 260);
    let rgb = photo(w, h, 5);
    let mut retried = 0;
    for sampling in [S::R_4_2_0, S::R_4_4_0] {
        let bytes = jpeg(&rgb, w, h, Some(sampling), None, false);
        let mut whole = Scratch::default();
        let image = decode(&bytes, DEFAULT_MAX_IMAGE_PIXELS, &mut whole).unwrap();
        let len = (w * h * 3) as usize;
        for wanted in [16, 32, 100, 160] {
            let mut scratch = Scratch {
                rgb: vec![0x5A; len],
                ..Scratch::default()
            };
            let rows = |_: Decoded| wanted;
            let (got, _, stopped) =
                decode_jpeg(&bytes, DEFAULT_MAX_IMAGE_PIXELS, &mut scratch, &rows, 0).unwrap();
            assert_eq!(got, image);
            let top = wanted as usize * w as usize * 3;
            assert_eq!(scratch.rgb[..top], whole.rgb[..top], "{wanted} rows");
            if stopped == Stopped::Retried {
                retried += 1;
                assert_eq!(scratch.rgb[..len], whole.rgb[..len]);
            }
        }
    }
    assert!(retried > 0, "no stop fell short of its rows");
}

#[test]
fn random_crops_are_inside_the_image_and_a_function_of_the_row() {
    let options = ImageOptions {
        flip: true,
        ..ImageOptions::default()
    };
    let image = Decoded {
        width: 500,
        height: 375,
    };
    let mut flips = 0;
    for row in 0..2000 {
        let a = crop_box(&options, key(7, 1, row), image);
        assert_eq!(a, crop_box(&options, key(7, 1, row), image));
        assert!(a.left >= 0.0 && a.top >= 0.0 && a.width >= 1.0 && a.height >= 1.0);
        assert!(
            a.left + a.width <= 500.0 && a.top + a.height <= 375.0,
            "{a:?}"
        );
        let share = a.width * a.height / (500.0 * 375.0);
        assert!((0.07..=1.0).contains(&share), "{share}");
        flips += a.flip as u32;
    }
    assert!((900..1100).contains(&flips), "{flips} flips of 2000");
    assert_ne!(
        crop_box(&options, key(7, 1, 3), image),
        crop_box(&options, key(7, 2, 3), image)
    );
}

#[test]
fn crops_of_any_shape_fit_the_resizer() {
    let mut tools = Tools::default();
    let mut sizes = SplitMix64::new(3);
    for crop in [Crop::Center, Crop::RandomResized, Crop::Resize] {
        for i in 0..400 {
            let image = Decoded {
                width: 1 + sizes.below(1201) as u32,
                height: 1 + sizes.below(1201) as u32,
            };
            let (th, tw) = (1 + sizes.below(301) as u32, 1 + sizes.below(301) as u32);
            let options = ImageOptions {
                crop,
                height: th,
                width: tw,
                ..ImageOptions::default()
            };
            let c = crop_box(&options, key(1, 0, i), image);
            assert!(c.left >= 0.0 && c.top >= 0.0 && c.width > 0.0 && c.height > 0.0);
            assert!(c.left + c.width <= image.width as f64, "{c:?} {image:?}");
            assert!(c.top + c.height <= image.height as f64, "{c:?} {image:?}");
            if i % 40 == 0 {
                let src = vec![9u8; image.width as usize * image.height as usize * 3];
                let mut out = vec![0u8; tw as usize * th as usize * 3];
                place(image, c, &src, &mut tools, tw, th, &mut out).unwrap();
                assert!(out.iter().all(|&v| v == 9));
            }
        }
    }
}

#[test]
fn flipped_rows_are_mirrored_at_any_width() {
    for width in [1usize, 2, 3, 4, 5, 7, 8, 13, 224] {
        let rows = 3;
        let image: Vec<u8> = (0..width * rows * 3).map(|i| (i * 7 % 251) as u8).collect();
        let mut flipped = image.clone();
        flip_rows(&mut flipped, width, &mut Vec::new());
        for y in 0..rows {
            for x in 0..width {
                let a = (y * width + x) * 3;
                let b = (y * width + width - 1 - x) * 3;
                assert_eq!(flipped[a..a + 3], image[b..b + 3], "width {width}");
            }
        }
    }
}

#[test]
fn exif_orientation_is_read_in_both_byte_orders_and_bad_offsets_give_one() {
    let mut le = b"Exif\0\0II*\0\x08\0\0\0\x01\0\x12\x01\x03\0\x01\0\0\0\x06\0\0\0".to_vec();
    assert_eq!(exif_orientation(&le), 6);
    let be = b"MM\0*\0\0\0\x08\0\x01\x01\x12\0\x03\0\0\0\x01\0\x03\0\0".to_vec();
    assert_eq!(exif_orientation(&be), 3);
    le[10] = 0xff; // IFD offset far past the end
    assert_eq!(exif_orientation(&le), 1);
    assert_eq!(exif_orientation(b"II*\0\xff\xff\xff\xff"), 1);
    assert_eq!(exif_orientation(b""), 1);
}

#[test]
fn orientations_map_corners_like_exif_transpose() {
    // A 3x2 image whose pixels are their indices.
    let base: Vec<u8> = (0..6u8).flat_map(|i| [i, i, i]).collect();
    let expect: [(u16, [u8; 6]); 4] = [
        (2, [2, 1, 0, 5, 4, 3]),
        (3, [5, 4, 3, 2, 1, 0]),
        (6, [3, 0, 4, 1, 5, 2]),
        (8, [2, 5, 1, 4, 0, 3]),
    ];
    for (o, want) in expect {
        let mut s = Scratch {
            rgb: base.clone(),
            ..Scratch::default()
        };
        let d = orient(
            Decoded {
                width: 3,
                height: 2,
            },
            o,
            &mut s,
        );
        let got: Vec<u8> = s.rgb[..18].chunks(3).map(|p| p[0]).collect();
        assert_eq!(got, want, "orientation {o}");
        assert_eq!((d.width, d.height), if o >= 5 { (2, 3) } else { (3, 2) });
    }
}

fn png(width: u32, height: u32, rgb: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut e = png::Encoder::new(&mut out, width, height);
    e.set_color(png::ColorType::Rgb);
    e.set_depth(png::BitDepth::Eight);
    let mut w = e.write_header().unwrap();
    w.write_image_data(rgb).unwrap();
    w.finish().unwrap();
    out
}

#[test]
fn a_huge_image_decodes_and_its_buffers_are_released_after_it() {
    let (w, h) = (4200u32, 4200u32);
    let mut rgb = vec![0u8; (w * h * 3) as usize];
    rgb[3 * (w as usize * 2100 + 2100)] = 255;
    let bytes = png(w, h, &rgb);
    let options = ImageOptions {
        crop: Crop::Resize,
        height: 4,
        width: 4,
        ..ImageOptions::default()
    };
    let mut scratch = Scratch::default();
    let mut out = vec![0u8; 4 * 4 * 3];
    decode_into(&options, key(0, 0, 0), &bytes, &mut scratch, &mut out).unwrap();
    assert_eq!(scratch.rgb.capacity() + scratch.raw.capacity(), 0);
    // A small image keeps its buffers for the next one.
    let small = png(8, 8, &[7u8; 8 * 8 * 3]);
    decode_into(&options, key(0, 0, 1), &small, &mut scratch, &mut out).unwrap();
    assert!(scratch.rgb.capacity() >= 8 * 8 * 3);
    assert!(out.iter().all(|&v| v == 7), "{out:?}");
}

#[test]
fn garbage_empty_and_huge_headers_are_refused_by_name() {
    let mut s = Scratch::default();
    assert!(decode(b"", 100, &mut s).unwrap_err().contains("empty"));
    assert!(
        decode(b"GIF89a....", 100, &mut s)
            .unwrap_err()
            .contains("not a JPEG")
    );
    // A PNG header claiming 100000 x 100000 pixels.
    let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
    png.extend_from_slice(&100_000u32.to_be_bytes());
    png.extend_from_slice(&100_000u32.to_be_bytes());
    png.extend_from_slice(&[8, 2, 0, 0, 0]);
    let crc = crc32fast::hash(&png[12..]);
    png.extend_from_slice(&crc.to_be_bytes());
    let e = decode(&png, DEFAULT_MAX_IMAGE_PIXELS, &mut s).unwrap_err();
    assert!(e.contains("max_image_pixels") || e.contains("PNG"), "{e}");
    assert!(s.rgb.capacity() < 1 << 20);
}

/// Both sides are bounded, not only their product: 40,000,000 x 1 has
/// no more pixels than the default allows, but is refused before any
/// buffer is sized by its width.
#[test]
fn a_side_past_the_longest_allowed_is_refused() {
    for (w, h) in [(40_000_000u32, 1u32), (1, 40_000_000), (65_536, 2)] {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        png.extend_from_slice(&w.to_be_bytes());
        png.extend_from_slice(&h.to_be_bytes());
        png.extend_from_slice(&[8, 2, 0, 0, 0]);
        let crc = crc32fast::hash(&png[12..]);
        png.extend_from_slice(&crc.to_be_bytes());
        let mut s = Scratch::default();
        let e = decode(&png, DEFAULT_MAX_IMAGE_PIXELS, &mut s).unwrap_err();
        assert!(e.contains("side longer than 65535"), "{w}x{h}: {e}");
        assert_eq!(s.rgb.capacity() + s.raw.capacity(), 0);
    }
}

/// A bounded mutation test of the decoders (and the header probe):
/// JPEGs (baseline, progressive, with restarts), PNGs and WebPs with
/// bytes flipped, words patched to extremes, cut short or overwritten:
/// every decode ends in pixels or an error, never a panic.
/// `SHARDFEED_FUZZ_CASES` sets the mutations per image (default 300).
#[test]
fn mutated_images_decode_or_fail_without_a_panic() {
    let cases: u64 = std::env::var("SHARDFEED_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let (w, h) = (48u32, 32u32);
    let rgb = photo(w, h, 5);
    let mut webp = Vec::new();
    image_webp::WebPEncoder::new(&mut webp)
        .encode(&rgb, w, h, image_webp::ColorType::Rgb8)
        .unwrap();
    let images = [
        jpeg(
            &rgb,
            w,
            h,
            Some(jpeg_encoder::SamplingFactor::R_4_2_0),
            None,
            false,
        ),
        jpeg(
            &rgb,
            w,
            h,
            Some(jpeg_encoder::SamplingFactor::R_4_4_4),
            Some(2),
            false,
        ),
        jpeg(&rgb, w, h, None, None, true),
        png(w, h, &rgb),
        webp,
    ];
    let options = ImageOptions {
        height: 16,
        width: 16,
        ..ImageOptions::default()
    };
    let mut out = vec![0u8; 16 * 16 * 3];
    let mut scratch = Scratch::default();
    let mut g = SplitMix64::new(0xfa11);
    let mut outcomes = [0u64; 2];
    for image in &images {
        for case in 0..cases {
            let mut bytes = image.clone();
            let len = bytes.len() as u64;
            let at = g.below(len) as usize;
            match g.below(4) {
                0 => bytes[at] ^= 1 << g.below(8),
                1 => {
                    let at = at.min(bytes.len() - 4);
                    let v = [u32::MAX, 0x7fff_ffff, 0x0001_0000, 0][g.below(4) as usize];
                    bytes[at..at + 4].copy_from_slice(&v.to_be_bytes());
                }
                2 => bytes.truncate(at),
                _ => {
                    let end = (at + 1 + g.below(32) as usize).min(bytes.len());
                    for b in &mut bytes[at..end] {
                        *b = g.below(256) as u8;
                    }
                }
            }
            let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let _ = probe(&bytes);
                decode_into(
                    &options,
                    key(1, 0, case as u32),
                    &bytes,
                    &mut scratch,
                    &mut out,
                )
            }));
            match decoded {
                Ok(r) => outcomes[usize::from(r.is_err())] += 1,
                Err(_) => panic!(
                    "a decoder panicked on case {case} of a {}-byte image",
                    image.len()
                ),
            }
        }
    }
    assert!(outcomes[1] > 0, "no mutation was refused: {outcomes:?}");
}
