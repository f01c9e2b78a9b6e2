//! Images decoded, cropped, resized and flipped on the loader's threads,
//! straight into a batch's slab.
//!
//! A column named in [`ImageOptions::columns`] holds encoded images (JPEG,
//! PNG or WebP, told apart by their first bytes); it collates to `uint8`
//! `[batch, height, width, 3]` (or `[batch, 3, height, width]`).
//!
//! * **Decoders**: `zune-jpeg` (baseline and progressive; grayscale and
//!   CMYK become RGB; a sequential JPEG stops decoding below the rows its
//!   crop reads), `png` (8 and 16 bits, palettes; 16-bit samples keep
//!   their high byte), `image-webp` (lossy and lossless). Alpha is dropped,
//!   not composited (Pillow's `convert("RGB")` does the same). EXIF
//!   orientation (JPEG APP1, PNG eXIf, WebP EXIF) is applied before cropping,
//!   as Pillow's `ImageOps.exif_transpose` does.
//! * **Resizing**: `fast_image_resize`'s convolution with the bilinear filter
//!   (Pillow's `BILINEAR`, which torchvision uses for PIL images), with the
//!   crop given in fractional source pixels so a crop and a resize are one
//!   pass.
//! * **Crops are a pure function** of (seed, epoch, shard, row group, row,
//!   column): the same pixels with any thread count, on any rank, after a
//!   resume.
//! * **Untrusted sizes**: an image larger than
//!   [`ImageOptions::max_pixels`] is refused before its pixels are
//!   allocated; every decoder is told the limit too.

mod input;

use std::io::Cursor;

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use shardfeed_format::permute::{SplitMix64, hash_words};

/// How an image becomes the output size.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum Crop {
    /// torchvision's `RandomResizedCrop`: a random area (a share in
    /// [`ImageOptions::scale`]) of random aspect ratio (in
    /// [`ImageOptions::ratio`]), resized to the output size.
    #[default]
    RandomResized,
    /// Scale so the image covers the output size, then cut its centre (for
    /// a square output of side `S`, torchvision's `Resize(S)` then
    /// `CenterCrop(S)`; torchvision pads a non-square crop, this never does).
    Center,
    /// Resize the whole image to the output size (the aspect ratio is not
    /// kept); an image already of that size is copied unchanged.
    Resize,
}

impl std::str::FromStr for Crop {
    type Err = crate::error::LoaderError;
    fn from_str(s: &str) -> crate::error::Result<Self> {
        match s {
            "random_resized" => Ok(Crop::RandomResized),
            "center" => Ok(Crop::Center),
            "resize" => Ok(Crop::Resize),
            other => Err(crate::error::LoaderError::BadOption {
                option: "crop",
                reason: format!("{other:?} is not one of random_resized, center, resize"),
            }),
        }
    }
}

/// Default for [`ImageOptions::max_pixels`]: 40 million pixels (about 120 MB
/// decoded, per decoding thread at most).
pub const DEFAULT_MAX_IMAGE_PIXELS: u64 = 40_000_000;

/// Image decoding for some columns of a loader.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageOptions {
    /// Columns holding encoded images (binary).
    pub columns: Vec<String>,
    /// Output height in pixels.
    pub height: u32,
    /// Output width in pixels.
    pub width: u32,
    /// How an image becomes `height x width`.
    pub crop: Crop,
    /// `RandomResized`: the range of the crop's share of the image's area.
    pub scale: (f64, f64),
    /// `RandomResized`: the range of the crop's aspect ratio (width / height).
    pub ratio: (f64, f64),
    /// Flip each image horizontally with probability 1/2.
    pub flip: bool,
    /// `[3, height, width]` per row instead of `[height, width, 3]`.
    pub channels_first: bool,
    /// Images with more pixels than this are refused (a named error, or a
    /// counted skip under `on_error="skip"`).
    pub max_pixels: u64,
}

impl Default for ImageOptions {
    fn default() -> Self {
        ImageOptions {
            columns: Vec::new(),
            height: 224,
            width: 224,
            crop: Crop::RandomResized,
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
            flip: false,
            channels_first: false,
            max_pixels: DEFAULT_MAX_IMAGE_PIXELS,
        }
    }
}

impl ImageOptions {
    /// Refuse options that cannot make an image.
    pub(crate) fn check(&self) -> crate::error::Result<()> {
        let bad = |option: &'static str, reason: String| {
            Err(crate::error::LoaderError::BadOption { option, reason })
        };
        if self.height == 0 || self.width == 0 || self.height > 16384 || self.width > 16384 {
            return bad(
                "image_size",
                format!(
                    "{}x{} must be between 1 and 16384 on each side",
                    self.height, self.width
                ),
            );
        }
        let (s0, s1) = self.scale;
        if !(s0.is_finite() && s1.is_finite() && 0.0 < s0 && s0 <= s1 && s1 <= 1.0) {
            return bad(
                "scale",
                format!("({s0}, {s1}) must satisfy 0 < min <= max <= 1"),
            );
        }
        let (r0, r1) = self.ratio;
        if !(r0.is_finite() && r1.is_finite() && 0.0 < r0 && r0 <= r1) {
            return bad("ratio", format!("({r0}, {r1}) must satisfy 0 < min <= max"));
        }
        if self.max_pixels == 0 {
            return bad("max_image_pixels", "must be greater than 0".into());
        }
        Ok(())
    }

    /// Bytes of one output image.
    pub(crate) fn image_bytes(&self) -> usize {
        self.height as usize * self.width as usize * 3
    }
}

/// Where a row comes from (its crop is a function of it, and errors name
/// it): see [`crate::LoaderBuilder::row_ids`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowId {
    /// The shard's index in the manifest.
    pub shard: u32,
    /// The row group within the shard.
    pub row_group: u32,
    /// The row within the row group.
    pub row: u32,
}

/// The formats told apart by their first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    Jpeg,
    Png,
    WebP,
}

impl Format {
    pub(crate) fn sniff(bytes: &[u8]) -> Option<Format> {
        if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(Format::Jpeg)
        } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(Format::Png)
        } else if bytes.len() >= 12 && &bytes[0..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
            Some(Format::WebP)
        } else {
            None
        }
    }

    /// The format's name, for reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Format::Jpeg => "jpeg",
            Format::Png => "png",
            Format::WebP => "webp",
        }
    }
}

/// What an image's header says, read without decoding its pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageHeader {
    /// `jpeg`, `png` or `webp`.
    pub format: &'static str,
    /// Width in pixels, as stored (before EXIF orientation).
    pub width: u32,
    /// Height in pixels, as stored.
    pub height: u32,
}

/// Read the format and size of an encoded image (for `shardfeed inspect
/// --images`); an error says why the bytes are not a readable image header.
pub fn probe(bytes: &[u8]) -> Result<ImageHeader, String> {
    if bytes.is_empty() {
        return Err("empty value (zero bytes)".into());
    }
    let format = Format::sniff(bytes).ok_or("not a JPEG, PNG or WebP image")?;
    let (width, height) = match format {
        Format::Jpeg => {
            let mut d = zune_jpeg::JpegDecoder::new(input::Input::new(bytes));
            d.decode_headers().map_err(|e| format!("JPEG: {e}"))?;
            let info = d.info().ok_or("JPEG: no frame header")?;
            (info.width as u32, info.height as u32)
        }
        Format::Png => {
            let mut decoder = png::Decoder::new(Cursor::new(bytes));
            decoder.set_ignore_iccp_chunk(true);
            decoder.set_ignore_text_chunk(true);
            let reader = decoder.read_info().map_err(|e| format!("PNG: {e}"))?;
            (reader.info().width, reader.info().height)
        }
        Format::WebP => image_webp::WebPDecoder::new(Cursor::new(bytes))
            .map_err(|e| format!("WebP: {e}"))?
            .dimensions(),
    };
    Ok(ImageHeader {
        format: format.name(),
        width,
        height,
    })
}

/// The loader's image decoder on its own (format sniffing, EXIF
/// orientation, RGB output), for measuring its ceiling: `shardfeed bench
/// --decode-only`.
pub struct ImageDecoder {
    scratch: Scratch,
    max_pixels: u64,
}

impl ImageDecoder {
    /// A decoder refusing images of more than `max_pixels` pixels.
    pub fn new(max_pixels: u64) -> Self {
        ImageDecoder {
            scratch: Scratch::default(),
            max_pixels,
        }
    }

    /// Decode `bytes` to RGB8: the pixels (row major), width and height.
    pub fn decode(&mut self, bytes: &[u8]) -> Result<(&[u8], u32, u32), String> {
        let d = decode(bytes, self.max_pixels, &mut self.scratch)?;
        let len = d.width as usize * d.height as usize * 3;
        Ok((&self.scratch.rgb[..len], d.width, d.height))
    }
}

/// A decoding thread's buffers, kept from one image (and batch) to the next
/// so the steady state allocates nothing.
#[derive(Default)]
pub(crate) struct Scratch {
    /// The decoded image, RGB8, `width * height * 3` bytes in use.
    rgb: Vec<u8>,
    /// A decoder's own output (RGBA, grey, 16-bit...) before conversion,
    /// and the oriented or channels-first copies.
    raw: Vec<u8>,
    tools: Tools,
}

/// What cropping, resizing and flipping keep between images.
#[derive(Default)]
struct Tools {
    resizer: Resizer,
    /// A copy of one output row, for flips.
    row: Vec<u8>,
}

/// Buffers larger than this are released after the image that grew them,
/// so one huge image does not keep a thread's memory high.
const KEEP_SCRATCH_BYTES: usize = 48 << 20;

impl Scratch {
    fn trim(&mut self) {
        for buf in [&mut self.rgb, &mut self.raw] {
            if buf.capacity() > KEEP_SCRATCH_BYTES {
                *buf = Vec::new();
            }
        }
    }
}

/// A decoded RGB8 image in a [`Scratch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Decoded {
    pub width: u32,
    pub height: u32,
}

/// The longest side an image may have, whatever `max_image_pixels` allows
/// (JPEG's own limit): a 40,000,000 x 1 image has few pixels but sizes the
/// decoder's and resizer's row buffers by its width.
pub const MAX_IMAGE_SIDE: u64 = 65_535;

fn too_large(width: u64, height: u64, max_pixels: u64) -> Result<(), String> {
    match width.checked_mul(height) {
        Some(0) => Err(format!("{width}x{height} image has no pixels")),
        Some(p) if p <= max_pixels => {
            if width > MAX_IMAGE_SIDE || height > MAX_IMAGE_SIDE {
                return Err(format!(
                    "{width}x{height} image has a side longer than {MAX_IMAGE_SIDE} pixels"
                ));
            }
            Ok(())
        }
        _ => Err(format!(
            "{width}x{height} image is larger than max_image_pixels ({max_pixels})"
        )),
    }
}

/// `buf` resized to `len` bytes without keeping (or zeroing twice) its old
/// content when it must grow.
fn sized(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buf.len() < len {
        buf.clear();
    }
    buf.resize(len, 0);
    &mut buf[..len]
}

/// Decode `bytes` into `scratch.rgb` as RGB8, orientation applied.
pub(crate) fn decode(
    bytes: &[u8],
    max_pixels: u64,
    scratch: &mut Scratch,
) -> Result<Decoded, String> {
    decode_top(bytes, max_pixels, scratch, &|image| image.height).map(|(d, _)| d)
}

/// How much of an image [`decode_top`] decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// All of it.
    No,
    /// The rows asked for (and a few more).
    Early,
    /// All of it, after an early stop fell short of the rows asked for.
    Retried,
}

/// [`decode`], where only the top `rows(image)` rows of the (oriented)
/// image need to be right: a baseline JPEG stored upright stops decoding
/// after them (the rows below hold whatever the buffer held). Also says
/// whether it stopped early.
pub(crate) fn decode_top(
    bytes: &[u8],
    max_pixels: u64,
    scratch: &mut Scratch,
    rows: &dyn Fn(Decoded) -> u32,
) -> Result<(Decoded, Stopped), String> {
    if bytes.is_empty() {
        return Err("empty value (zero bytes)".into());
    }
    let format = Format::sniff(bytes).ok_or_else(|| {
        let head: Vec<String> = bytes.iter().take(4).map(|b| format!("{b:02x}")).collect();
        format!(
            "not a JPEG, PNG or WebP image (first bytes {})",
            head.join(" ")
        )
    })?;
    let (decoded, orientation, stopped) = match format {
        Format::Jpeg => decode_jpeg(bytes, max_pixels, scratch, rows, STOP_MARGIN_ROWS)?,
        Format::Png => with_all_rows(decode_png(bytes, max_pixels, scratch)?),
        Format::WebP => with_all_rows(decode_webp(bytes, max_pixels, scratch)?),
    };
    if orientation > 1 {
        return Ok((orient(decoded, orientation, scratch), stopped));
    }
    Ok((decoded, stopped))
}

fn with_all_rows((d, o): (Decoded, u16)) -> (Decoded, u16, Stopped) {
    (d, o, Stopped::No)
}

/// Rows decoded past those asked for before a JPEG stops: upsampled rows
/// lag the decoded ones by a row or two.
const STOP_MARGIN_ROWS: u32 = 8;

/// Decode a JPEG; where [`early_stop`] allows, stop `margin` rows past the
/// top `rows(image)`.
fn decode_jpeg(
    bytes: &[u8],
    max_pixels: u64,
    scratch: &mut Scratch,
    rows: &dyn Fn(Decoded) -> u32,
    margin: u32,
) -> Result<(Decoded, u16, Stopped), String> {
    use zune_core::colorspace::ColorSpace;
    use zune_core::options::DecoderOptions;
    use zune_jpeg::errors::DecodeErrors;
    let side = max_pixels.min(u16::MAX as u64) as usize;
    let options = DecoderOptions::default()
        .jpeg_set_out_colorspace(ColorSpace::RGB)
        .set_max_width(side)
        .set_max_height(side)
        .set_strict_mode(true);
    let new_decoder = || {
        let mut decoder =
            zune_jpeg::JpegDecoder::new_with_options(input::Input::new(bytes), options);
        decoder
            .decode_headers()
            .map_err(|e| format!("JPEG: {e}"))
            .map(|()| decoder)
    };
    let mut decoder = new_decoder()?;
    let info = decoder.info().ok_or("JPEG: no frame header")?;
    let (width, height) = (info.width as u32, info.height as u32);
    too_large(width as u64, height as u64, max_pixels)?;
    let orientation = decoder.exif().map_or(1, |e| exif_orientation(e));
    let len = decoder
        .output_buffer_size()
        .ok_or("JPEG: output size overflows")?;
    if len != width as usize * height as usize * 3 {
        return Err(format!(
            "JPEG: decoder wants {len} bytes for a {width}x{height} RGB image"
        ));
    }
    let image = Decoded { width, height };
    let out = sized(&mut scratch.rgb, len);
    let mut decoded = Stopped::No;
    let wanted = rows(image);
    if let Some(stop) = early_stop(&mut decoder, &info, orientation, bytes, wanted, margin) {
        // The decoder polls the check twice before each MCU row; cancelling
        // at the first poll of row `stop.mcu_rows` leaves the rows above it
        // decoded (the count is checked, not assumed).
        let seen = std::sync::atomic::AtomicU32::new(0);
        let cancel_at = stop.mcu_rows.saturating_mul(2).saturating_add(1);
        decoder.set_cancel(move || {
            seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 >= cancel_at
        });
        decoder.set_cancel_interval(1);
        match decoder.decode_into(out) {
            Ok(()) => return Ok((image, orientation, Stopped::No)),
            Err(DecodeErrors::Cancelled)
                if decoder.decoded_scanlines().unwrap_or(0) >= stop.rows as usize =>
            {
                return Ok((image, orientation, Stopped::Early));
            }
            // Stopped before the rows were out (a layout this estimate does
            // not fit): decoded whole below, with a fresh decoder.
            Err(DecodeErrors::Cancelled) => {
                decoder = new_decoder()?;
                decoded = Stopped::Retried;
            }
            Err(e) => return Err(format!("JPEG: {e}")),
        }
    }
    decoder.decode_into(out).map_err(|e| format!("JPEG: {e}"))?;
    Ok((image, orientation, decoded))
}

/// Where a partial JPEG decode stops: after `mcu_rows` MCU rows, which
/// hold the first `rows` rows of pixels.
struct EarlyStop {
    rows: u32,
    mcu_rows: u32,
}

/// Whether the JPEG whose headers `decoder` read can stop after its top
/// `rows` rows (and `margin` more), and where. Only a sequential (baseline)
/// JPEG stored upright (EXIF orientation 1, or 2: mirrored, same rows) whose
/// data ends with its end-of-image marker: a truncated file is decoded
/// whole, so it fails as it would without a crop, whatever the crop.
fn early_stop<T: zune_core::bytestream::ZByteReaderTrait>(
    decoder: &mut zune_jpeg::JpegDecoder<T>,
    info: &zune_jpeg::ImageInfo,
    orientation: u16,
    bytes: &[u8],
    rows: u32,
    margin: u32,
) -> Option<EarlyStop> {
    if !info.sof.is_sequential_dct() || orientation > 2 || !bytes.ends_with(&[0xFF, 0xD9]) {
        return None;
    }
    // An MCU row is 8 pixel rows times the largest vertical sampling factor
    // (a single-component image: 8).
    let layout = decoder.raw_output().layout()?;
    let components = usize::from(info.components).min(layout.len());
    let v_max = match components {
        1 => 1,
        _ => layout[..components]
            .iter()
            .map(|p| p.vertical_sampling_factor)
            .max()?,
    };
    let mcu_height = u32::try_from(v_max.checked_mul(8)?).ok()?;
    let total = u32::from(info.height).div_ceil(mcu_height);
    let mcu_rows = rows.checked_add(margin)?.div_ceil(mcu_height);
    (mcu_rows < total).then_some(EarlyStop { rows, mcu_rows })
}

fn decode_png(
    bytes: &[u8],
    max_pixels: u64,
    scratch: &mut Scratch,
) -> Result<(Decoded, u16), String> {
    use png::{BitDepth, ColorType, Transformations};
    let mut decoder = png::Decoder::new_with_limits(
        Cursor::new(bytes),
        png::Limits {
            bytes: usize::try_from(max_pixels.saturating_mul(8)).unwrap_or(usize::MAX),
        },
    );
    decoder.set_transformations(Transformations::EXPAND | Transformations::STRIP_16);
    // Ancillary chunks the loader does not use are skipped, not inflated: a
    // compressed colour profile (iCCP) or text chunk can inflate to hundreds
    // of MB inside the byte limit above.
    decoder.set_ignore_iccp_chunk(true);
    decoder.set_ignore_text_chunk(true);
    // The size is checked from the header alone, before the decoder sizes
    // its row buffers by it.
    let header = decoder
        .read_header_info()
        .map_err(|e| format!("PNG: {e}"))?;
    too_large(header.width as u64, header.height as u64, max_pixels)?;
    let mut reader = decoder.read_info().map_err(|e| format!("PNG: {e}"))?;
    let (width, height, orientation) = {
        let info = reader.info();
        let orientation = info.exif_metadata.as_deref().map_or(1, exif_orientation);
        (info.width, info.height, orientation)
    };
    too_large(width as u64, height as u64, max_pixels)?;
    let (color, depth) = reader.output_color_type();
    if depth != BitDepth::Eight {
        return Err(format!("PNG: {depth:?} samples after expansion"));
    }
    let len = reader
        .output_buffer_size()
        .ok_or("PNG: output size overflows")?;
    let raw = sized(&mut scratch.raw, len);
    let frame = reader.next_frame(raw).map_err(|e| format!("PNG: {e}"))?;
    let pixels = width as usize * height as usize;
    let line = frame.line_size;
    let channels = match color {
        ColorType::Grayscale => 1,
        ColorType::GrayscaleAlpha => 2,
        ColorType::Rgb => 3,
        ColorType::Rgba => 4,
        ColorType::Indexed => return Err("PNG: palette left unexpanded".into()),
    };
    if line < width as usize * channels || frame.buffer_size() > raw.len() {
        return Err("PNG: frame smaller than its header says".into());
    }
    let rgb = sized(&mut scratch.rgb, pixels * 3);
    for (y, out) in rgb.chunks_exact_mut(width as usize * 3).enumerate() {
        let src = &raw[y * line..y * line + width as usize * channels];
        to_rgb(src, channels, out);
    }
    Ok((Decoded { width, height }, orientation))
}

fn decode_webp(
    bytes: &[u8],
    max_pixels: u64,
    scratch: &mut Scratch,
) -> Result<(Decoded, u16), String> {
    let mut decoder =
        image_webp::WebPDecoder::new(Cursor::new(bytes)).map_err(|e| format!("WebP: {e}"))?;
    let (width, height) = decoder.dimensions();
    too_large(width as u64, height as u64, max_pixels)?;
    let orientation = match decoder.exif_metadata() {
        Ok(Some(e)) => exif_orientation(&e),
        _ => 1,
    };
    let channels = if decoder.has_alpha() { 4 } else { 3 };
    let len = decoder
        .output_buffer_size()
        .ok_or("WebP: output size overflows")?;
    let pixels = width as usize * height as usize;
    if len != pixels * channels {
        return Err(format!(
            "WebP: decoder wants {len} bytes for a {width}x{height} image"
        ));
    }
    if channels == 3 {
        let out = sized(&mut scratch.rgb, len);
        decoder.read_image(out).map_err(|e| format!("WebP: {e}"))?;
    } else {
        let raw = sized(&mut scratch.raw, len);
        decoder.read_image(raw).map_err(|e| format!("WebP: {e}"))?;
        let rgb = sized(&mut scratch.rgb, pixels * 3);
        to_rgb(raw, 4, rgb);
    }
    Ok((Decoded { width, height }, orientation))
}

/// Convert 8-bit pixels of 1 (grey), 2 (grey + alpha), 3 or 4 (RGBA)
/// channels to RGB, dropping alpha.
fn to_rgb(src: &[u8], channels: usize, out: &mut [u8]) {
    match channels {
        1 => {
            for (o, &g) in out.chunks_exact_mut(3).zip(src) {
                o.fill(g);
            }
        }
        2 => {
            for (o, p) in out.chunks_exact_mut(3).zip(src.chunks_exact(2)) {
                o.fill(p[0]);
            }
        }
        3 => out.copy_from_slice(&src[..out.len()]),
        _ => {
            for (o, p) in out.chunks_exact_mut(3).zip(src.chunks_exact(4)) {
                o.copy_from_slice(&p[..3]);
            }
        }
    }
}

/// The EXIF orientation (1 to 8) of a TIFF structure (with or without the
/// `Exif\0\0` prefix); 1 when absent or unreadable. Every offset is checked.
pub(crate) fn exif_orientation(exif: &[u8]) -> u16 {
    let tiff = exif.strip_prefix(b"Exif\0\0").unwrap_or(exif);
    let little = match tiff.get(0..4) {
        Some(b"II*\0") => true,
        Some(b"MM\0*") => false,
        _ => return 1,
    };
    let u16_at = |at: usize| -> Option<u16> {
        let b: [u8; 2] = tiff.get(at..at.checked_add(2)?)?.try_into().ok()?;
        Some(if little {
            u16::from_le_bytes(b)
        } else {
            u16::from_be_bytes(b)
        })
    };
    let u32_at = |at: usize| -> Option<u32> {
        let b: [u8; 4] = tiff.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(if little {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    };
    let find = || -> Option<u16> {
        let ifd = u32_at(4)? as usize;
        let entries = u16_at(ifd)? as usize;
        for i in 0..entries.min(512) {
            let entry = ifd.checked_add(2)?.checked_add(i.checked_mul(12)?)?;
            if u16_at(entry)? == 0x0112 {
                return u16_at(entry.checked_add(8)?);
            }
        }
        None
    };
    find().filter(|o| (1..=8).contains(o)).unwrap_or(1)
}

/// Apply EXIF orientation `o` (2 to 8) to the decoded image.
fn orient(d: Decoded, o: u16, scratch: &mut Scratch) -> Decoded {
    let (w, h) = (d.width as usize, d.height as usize);
    let transposed = o >= 5;
    let (ow, oh) = if transposed { (h, w) } else { (w, h) };
    let src = &scratch.rgb[..w * h * 3];
    let out = sized(&mut scratch.raw, w * h * 3);
    for y in 0..oh {
        for x in 0..ow {
            // The source pixel shown at (x, y) of the oriented image.
            let (sx, sy) = match o {
                2 => (w - 1 - x, y),
                3 => (w - 1 - x, h - 1 - y),
                4 => (x, h - 1 - y),
                5 => (y, x),
                6 => (y, h - 1 - x),
                7 => (w - 1 - y, h - 1 - x),
                _ => (w - 1 - y, x),
            };
            let s = (sy * w + sx) * 3;
            let t = (y * ow + x) * 3;
            out[t..t + 3].copy_from_slice(&src[s..s + 3]);
        }
    }
    std::mem::swap(&mut scratch.rgb, &mut scratch.raw);
    Decoded {
        width: ow as u32,
        height: oh as u32,
    }
}

/// A crop in source pixels (fractional), and whether to flip.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct CropBox {
    pub left: f64,
    pub top: f64,
    pub width: f64,
    pub height: f64,
    pub flip: bool,
}

/// Uniform in [0, 1).
fn unit(rng: &mut SplitMix64) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// What a row's crop and flip are a function of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CropKey {
    pub seed: u64,
    pub epoch: u64,
    pub id: RowId,
    /// The image column's index among the loaded columns.
    pub column: usize,
}

/// The crop and flip of one row: a pure function of its arguments. The box
/// lies inside the image exactly (floating-point rounding included), as the
/// resizer requires.
pub(crate) fn crop_box(options: &ImageOptions, key: CropKey, image: Decoded) -> CropBox {
    let (w, h) = (image.width as f64, image.height as f64);
    let mut c = raw_crop_box(options, key, image);
    c.left = c.left.clamp(0.0, w - 1.0);
    c.top = c.top.clamp(0.0, h - 1.0);
    c.width = c.width.min(w - c.left).max(f64::MIN_POSITIVE);
    c.height = c.height.min(h - c.top).max(f64::MIN_POSITIVE);
    c
}

fn raw_crop_box(options: &ImageOptions, key: CropKey, image: Decoded) -> CropBox {
    let CropKey {
        seed,
        epoch,
        id,
        column,
    } = key;
    let mut rng = SplitMix64::new(hash_words(&[
        seed,
        epoch,
        id.shard as u64,
        id.row_group as u64,
        id.row as u64,
        column as u64,
    ]));
    let (w, h) = (image.width as f64, image.height as f64);
    let (tw, th) = (options.width as f64, options.height as f64);
    let flip = options.flip && rng.next_u64() >> 63 == 1;
    let whole = CropBox {
        left: 0.0,
        top: 0.0,
        width: w,
        height: h,
        flip,
    };
    match options.crop {
        Crop::Resize => whole,
        Crop::Center => {
            // Scale so the image covers the output (the other side
            // truncated, like torchvision's Resize), then centre it in output
            // pixels (rounded half to even, like its CenterCrop).
            let (rw, rh) = if tw / w >= th / h {
                (tw, (h * tw / w).floor().max(th))
            } else {
                ((w * th / h).floor().max(tw), th)
            };
            let left = ((rw - tw) / 2.0).round_ties_even();
            let top = ((rh - th) / 2.0).round_ties_even();
            let (sx, sy) = (w / rw, h / rh);
            CropBox {
                left: left * sx,
                top: top * sy,
                width: tw * sx,
                height: th * sy,
                flip,
            }
        }
        Crop::RandomResized => {
            // torchvision's RandomResizedCrop.get_params, with this row's stream.
            let area = w * h;
            let (lr0, lr1) = (options.ratio.0.ln(), options.ratio.1.ln());
            for _ in 0..10 {
                let target =
                    area * (options.scale.0 + unit(&mut rng) * (options.scale.1 - options.scale.0));
                let aspect = (lr0 + unit(&mut rng) * (lr1 - lr0)).exp();
                let cw = (target * aspect).sqrt().round();
                let ch = (target / aspect).sqrt().round();
                if 0.0 < cw && cw <= w && 0.0 < ch && ch <= h {
                    let top = rng.below((h - ch) as u64 + 1) as f64;
                    let left = rng.below((w - cw) as u64 + 1) as f64;
                    return CropBox {
                        left,
                        top,
                        width: cw,
                        height: ch,
                        flip,
                    };
                }
            }
            // Fallback: the centre, its ratio clamped to the range.
            let in_ratio = w / h;
            let (cw, ch) = if in_ratio < options.ratio.0 {
                (w, (w / options.ratio.0).round())
            } else if in_ratio > options.ratio.1 {
                ((h * options.ratio.1).round(), h)
            } else {
                (w, h)
            };
            CropBox {
                left: ((w - cw) / 2.0).floor().max(0.0),
                top: ((h - ch) / 2.0).floor().max(0.0),
                width: cw.clamp(1.0, w),
                height: ch.clamp(1.0, h),
                flip,
            }
        }
    }
}

/// How many of the image's top rows rendering `crop` reads: the crop's
/// bottom, plus the bilinear filter's reach below it (one source pixel, or
/// one output pixel's worth when shrinking), plus two rows of margin.
fn rows_read(options: &ImageOptions, crop: CropBox, image: Decoded) -> u32 {
    let reach = (crop.height / f64::from(options.height.max(1))).max(1.0);
    let bottom = (crop.top + crop.height + reach).ceil() + 2.0;
    if bottom >= f64::from(image.height) {
        image.height
    } else {
        bottom as u32
    }
}

/// Crop, resize and flip the decoded image in `scratch` into `out`
/// (`height * width * 3` bytes, channels last or first).
pub(crate) fn render(
    options: &ImageOptions,
    image: Decoded,
    crop: CropBox,
    scratch: &mut Scratch,
    out: &mut [u8],
) -> Result<(), String> {
    let (tw, th) = (options.width, options.height);
    let bytes = options.image_bytes();
    if out.len() != bytes {
        return Err(format!("output slot of {} bytes, not {bytes}", out.len()));
    }
    let Scratch {
        rgb, raw, tools, ..
    } = scratch;
    let src = &rgb[..image.width as usize * image.height as usize * 3];
    if options.channels_first {
        // Resized channels-last into `raw`, then transposed.
        let hwc = sized(raw, bytes);
        place(image, crop, src, tools, tw, th, hwc)?;
        let plane = tw as usize * th as usize;
        let (r, rest) = out.split_at_mut(plane);
        let (g, b) = rest.split_at_mut(plane);
        for (i, p) in hwc.chunks_exact(3).enumerate() {
            r[i] = p[0];
            g[i] = p[1];
            b[i] = p[2];
        }
        Ok(())
    } else {
        place(image, crop, src, tools, tw, th, out)
    }
}

/// Crop, resize and flip `src` into `hwc` (`th * tw` RGB pixels).
fn place(
    image: Decoded,
    crop: CropBox,
    src: &[u8],
    tools: &mut Tools,
    tw: u32,
    th: u32,
    hwc: &mut [u8],
) -> Result<(), String> {
    let whole = crop.left == 0.0
        && crop.top == 0.0
        && crop.width == image.width as f64
        && crop.height == image.height as f64;
    if whole && image.width == tw && image.height == th {
        hwc.copy_from_slice(src);
    } else {
        let src_image = ImageRef::new(image.width, image.height, src, PixelType::U8x3)
            .map_err(|e| format!("resize: {e}"))?;
        let mut dst = Image::from_slice_u8(tw, th, hwc, PixelType::U8x3)
            .map_err(|e| format!("resize: {e}"))?;
        let mut resize =
            ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
        if !whole {
            resize = resize.crop(crop.left, crop.top, crop.width, crop.height);
        }
        tools
            .resizer
            .resize(&src_image, &mut dst, &resize)
            .map_err(|e| format!("resize: {e}"))?;
    }
    if crop.flip {
        flip_rows(hwc, tw as usize, &mut tools.row);
    }
    Ok(())
}

/// Mirror each row of RGB pixels `width` wide. Four pixels (12 bytes) move
/// at a time from a copy of the row: three times faster than swapping
/// 3-byte pixels in place (25 us instead of 75 for 224 x 224 here).
fn flip_rows(hwc: &mut [u8], width: usize, copy: &mut Vec<u8>) {
    copy.resize(width * 3, 0);
    for row in hwc.chunks_exact_mut(width * 3) {
        copy.copy_from_slice(row);
        let mut x = 0;
        while x + 4 <= width {
            let s = (width - x - 4) * 3;
            let p: &[u8; 12] = copy[s..s + 12].try_into().expect("12 bytes");
            let reversed = [
                p[9], p[10], p[11], p[6], p[7], p[8], p[3], p[4], p[5], p[0], p[1], p[2],
            ];
            row[x * 3..x * 3 + 12].copy_from_slice(&reversed);
            x += 4;
        }
        while x < width {
            let s = (width - 1 - x) * 3;
            row[x * 3..x * 3 + 3].copy_from_slice(&copy[s..s + 3]);
            x += 1;
        }
    }
}

/// Decode one row's image into its output slot.
pub(crate) fn decode_into(
    options: &ImageOptions,
    key: CropKey,
    bytes: &[u8],
    scratch: &mut Scratch,
    out: &mut [u8],
) -> Result<(), String> {
    let rows = |image: Decoded| rows_read(options, crop_box(options, key, image), image);
    let image = decode_top(bytes, options.max_pixels, scratch, &rows);
    let rendered = image.and_then(|(image, _)| {
        let crop = crop_box(options, key, image);
        render(options, image, crop, scratch, out)
    });
    scratch.trim();
    rendered
}

#[cfg(test)]
mod tests;
