//! [`LoaderOptions`]: every option of a loader or a mixture by the name the
//! CLI (`--kebab-case`) and the Python binding (`snake_case`) give it, with
//! its default, translated into a [`FeedBuilder`] in one place. Both faces
//! fill this structure from what their users typed and call
//! [`LoaderOptions::feed_builder`]; the options that only make sense
//! together (image size without images, packing options without `pack_to`,
//! `mix_stop` on one plain dataset) are refused here, naming the option, so
//! the messages are the same wherever an option was given.
//!
//! Options whose values are names (`pinning`, `on_error`, `crop`,
//! `pack_mode`, `mix_stop`) are kept as text and parsed here, by the types'
//! own `FromStr`, whose errors name the option.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use shardfeed_format::fault::FaultConfig;

use crate::config::{DEFAULT_BATCH_SIZE, DEFAULT_BYTE_BUDGET, DEFAULT_MAX_SKIPPED, LoaderBuilder};
use crate::error::{LoaderError, Result};
use crate::feed::FeedBuilder;
use crate::image::{Crop, DEFAULT_MAX_IMAGE_PIXELS, ImageOptions};
use crate::loader::Loader;
use crate::mix::MixStop;
use crate::pack::{PackMode, PackOptions};

/// Every option of a loader or a mixture: see the module documentation.
/// `Default` holds each option's default.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoaderOptions {
    /// The datasets and their weights: one for a plain loader.
    pub sources: Vec<(String, f64)>,
    /// A mixture even of one source (Python's dict of datasets).
    pub mixture: bool,
    /// Rows per batch.
    pub batch_size: usize,
    /// Columns to read (default: all): a struct's field by its path
    /// (`image.bytes`), a struct named whole as all its fields.
    pub columns: Option<Vec<String>>,
    /// Shuffle rows (windows of row groups, then rows within them).
    pub shuffle: bool,
    /// The order's seed.
    pub seed: u64,
    /// The epoch to start at.
    pub epoch: u64,
    /// This process's rank (default: from the environment, else 0).
    pub rank: Option<u64>,
    /// Ranks in the job (default: from the environment, else 1).
    pub world_size: Option<u64>,
    /// Drop each rank's last partial batch.
    pub drop_last: bool,
    /// Pad list columns to this length (a dense `[rows, pad_to]` array).
    pub pad_to: Option<usize>,
    /// The value padding is filled with.
    pub pad_value: f64,
    /// Batches collated ahead (default: by bytes, 2 to 16).
    pub prefetch: Option<usize>,
    /// Slabs the pool holds beyond the pipeline's, for a user transform's
    /// outputs (`LoaderBuilder::transform_slabs`; 0 without a transform).
    #[serde(default)]
    pub transform_slabs: usize,
    /// Decode threads (0: one per core).
    pub threads: usize,
    /// Object store options (credentials, endpoints).
    pub storage_options: Vec<(String, String)>,
    /// A local folder caching remote shards.
    pub cache_dir: Option<PathBuf>,
    /// The most bytes the cache folder holds.
    pub cache_limit: Option<u64>,
    /// Row groups per shuffle window (default: from the budget).
    pub window: Option<usize>,
    /// Bytes of row groups fetched or decoded ahead and held.
    pub byte_budget: u64,
    /// How slabs are allocated: `auto`, `cuda`, `page-aligned`.
    pub pinning: String,
    /// Requests in flight.
    pub io_concurrency: Option<usize>,
    /// Latency added to every read (fault injection), in milliseconds.
    pub inject_latency_ms: Option<f64>,
    /// Share of reads that fail with a transient error (fault injection).
    pub inject_failure_rate: Option<f64>,
    /// What a damaged row group does: `fail` or `skip`.
    pub on_error: String,
    /// Row groups (and images) skipped at most under `on_error = "skip"`.
    pub max_skipped: u64,
    /// A Chrome trace file to write.
    pub trace: Option<PathBuf>,
    /// Warn when the consumer waited more than this fraction of the time
    /// over this many batches; `None`: never.
    pub slow_warning: Option<(f64, u64)>,
    /// Read local shards through mappings (else `pread` copies).
    pub mapped_reads: bool,
    /// Niceness of the decode threads.
    pub decode_niceness: Option<u8>,
    /// Image columns to decode.
    pub decode_images: Option<Vec<String>>,
    /// Decoded images' (height, width) (default 224 x 224).
    pub image_size: Option<(u32, u32)>,
    /// How decoded images are cropped: `random_resized`, `center`, ...
    pub crop: String,
    /// A random crop's share of the image's area.
    pub scale: (f64, f64),
    /// A random crop's aspect ratio range.
    pub ratio: (f64, f64),
    /// Flip images horizontally with probability 1/2.
    pub flip: bool,
    /// `[3, height, width]` per row instead of `[height, width, 3]`.
    pub channels_first: bool,
    /// Refuse images of more pixels.
    pub max_image_pixels: Option<u64>,
    /// When a mixture's epoch ends: `first_exhausted`, `all_exhausted`, `never`.
    pub mix_stop: String,
    /// Rows a mixture's source reads at a time.
    pub read_batch: Option<usize>,
    /// Pack a token column into rows of exactly this many tokens.
    pub pack_to: Option<usize>,
    /// How documents are packed: `split` or `fit`.
    pub pack_mode: String,
    /// The list column to pack (default: the only one).
    pub pack_column: Option<String>,
    /// A token appended to every document when packing.
    pub eos_id: Option<i32>,
    /// The token padding packed rows.
    pub pad_id: i32,
    /// Documents a fit-mode window holds.
    pub pack_window: Option<usize>,
    /// The most documents (segments) in a packed row.
    pub max_segments: Option<usize>,
}

impl std::fmt::Debug for LoaderOptions {
    /// Sources with passwords hidden, storage options by key only (their
    /// values may be credentials); the other options as they are.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sources = crate::mix::redacted(&self.sources);
        let keys: Vec<&str> = self
            .storage_options
            .iter()
            .map(|(k, _)| k.as_str())
            .collect();
        f.debug_struct("LoaderOptions")
            .field("sources", &sources)
            .field("mixture", &self.mixture)
            .field("storage_option_keys", &keys)
            .field("batch_size", &self.batch_size)
            .field("columns", &self.columns)
            .field("shuffle", &self.shuffle)
            .field("seed", &self.seed)
            .field("byte_budget", &self.byte_budget)
            .field("pack_to", &self.pack_to)
            .field("decode_images", &self.decode_images)
            .finish_non_exhaustive()
    }
}

impl Default for LoaderOptions {
    fn default() -> Self {
        let images = ImageOptions::default();
        LoaderOptions {
            sources: Vec::new(),
            mixture: false,
            batch_size: DEFAULT_BATCH_SIZE,
            columns: None,
            shuffle: true,
            seed: 0,
            epoch: 0,
            rank: None,
            world_size: None,
            drop_last: true,
            pad_to: None,
            pad_value: 0.0,
            prefetch: None,
            transform_slabs: 0,
            threads: 0,
            storage_options: Vec::new(),
            cache_dir: None,
            cache_limit: None,
            window: None,
            byte_budget: DEFAULT_BYTE_BUDGET,
            pinning: "auto".into(),
            io_concurrency: None,
            inject_latency_ms: None,
            inject_failure_rate: None,
            on_error: "fail".into(),
            max_skipped: DEFAULT_MAX_SKIPPED,
            trace: None,
            slow_warning: Some(crate::config::DEFAULT_SLOW_WARNING),
            mapped_reads: true,
            decode_niceness: None,
            decode_images: None,
            image_size: None,
            crop: "random_resized".into(),
            scale: images.scale,
            ratio: images.ratio,
            flip: false,
            channels_first: false,
            max_image_pixels: None,
            mix_stop: "first_exhausted".into(),
            read_batch: None,
            pack_to: None,
            pack_mode: "split".into(),
            pack_column: None,
            eos_id: None,
            pad_id: 0,
            pack_window: None,
            max_segments: None,
        }
    }
}

fn bad<T>(option: &'static str, reason: &str) -> Result<T> {
    Err(LoaderError::BadOption {
        option,
        reason: reason.into(),
    })
}

impl LoaderOptions {
    /// The defaults, for the dataset at `url`.
    pub fn new(url: impl Into<String>) -> Self {
        LoaderOptions {
            sources: vec![(url.into(), 1.0)],
            ..LoaderOptions::default()
        }
    }

    /// Whether these options make a mixture: several sources, one given as
    /// a mixture, or packing.
    pub fn is_mixture(&self) -> bool {
        self.mixture || self.sources.len() > 1 || self.pack_to.is_some()
    }

    /// The builder of the loader (or mixture) these options describe,
    /// refusing options that do not go together.
    pub fn feed_builder(&self) -> Result<FeedBuilder> {
        let first = self.sources.first().map_or("", |s| s.0.as_str());
        let template = self.loader_builder(first)?;
        if !self.is_mixture() {
            if self.mix_stop != "first_exhausted" || self.read_batch.is_some() {
                return bad(
                    "mix_stop",
                    "mix_stop and read_batch apply to mixtures (a dict of datasets) and packing",
                );
            }
            return Ok(FeedBuilder::Loader(template));
        }
        let mut m = Loader::builder_mixture(self.sources.clone())
            .configure(|_| template)
            .mix_stop(self.mix_stop.parse::<MixStop>()?);
        if let Some(n) = self.read_batch {
            m = m.read_batch(n);
        }
        match self.pack_to {
            Some(length) => {
                let mut pack = PackOptions::new(length);
                pack.mode = self.pack_mode.parse::<PackMode>()?;
                pack.eos_id = self.eos_id;
                pack.pad_id = self.pad_id;
                if let Some(w) = self.pack_window {
                    pack.window = w;
                }
                pack.max_segments = self.max_segments;
                m = m.pack(pack);
                if let Some(c) = &self.pack_column {
                    m = m.pack_column(c.clone());
                }
            }
            None if self.pack_column.is_some()
                || self.eos_id.is_some()
                || self.pack_window.is_some() =>
            {
                return bad(
                    "pack_to",
                    "pack_column, eos_id and pack_window need pack_to",
                );
            }
            None => {}
        }
        Ok(FeedBuilder::Mixture(m))
    }

    /// A plain loader's builder for `url` with these options (a mixture's
    /// template).
    fn loader_builder(&self, url: &str) -> Result<LoaderBuilder> {
        let mut b = Loader::builder(url)
            .batch_size(self.batch_size)
            .shuffle(self.shuffle)
            .seed(self.seed)
            .epoch(self.epoch)
            .drop_last(self.drop_last)
            .decode_threads(self.threads)
            .byte_budget(self.byte_budget)
            .pinning(self.pinning.parse()?)
            .on_error(self.on_error.parse()?)
            .max_skipped(self.max_skipped)
            .slow_warning(self.slow_warning)
            .mapped_reads(self.mapped_reads);
        for (k, v) in &self.storage_options {
            b = b.storage_option(k, v);
        }
        if let Some(columns) = &self.columns {
            b = b.columns(columns.clone());
        }
        if let Some(rank) = self.rank {
            b = b.rank(rank);
        }
        if let Some(world_size) = self.world_size {
            b = b.world_size(world_size);
        }
        if let Some(n) = self.pad_to {
            b = b.pad_to(n, self.pad_value);
        }
        if let Some(n) = self.prefetch {
            b = b.prefetch(n);
        }
        if self.transform_slabs > 0 {
            b = b.transform_slabs(self.transform_slabs);
        }
        if let Some(dir) = &self.cache_dir {
            b = b.cache_dir(dir);
        }
        if let Some(limit) = self.cache_limit {
            b = b.cache_limit(limit);
        }
        if let Some(n) = self.window {
            b = b.window(n);
        }
        if let Some(n) = self.io_concurrency {
            b = b.io_concurrency(n);
        }
        if let Some(n) = self.decode_niceness {
            b = b.decode_niceness(n);
        }
        if let Some(path) = &self.trace {
            b = b.trace(path);
        }
        if self.inject_latency_ms.is_some() || self.inject_failure_rate.is_some() {
            let ms = self.inject_latency_ms.unwrap_or(0.0);
            let latency = std::time::Duration::try_from_secs_f64(ms / 1000.0).map_err(|_| {
                LoaderError::BadOption {
                    option: "inject_latency_ms",
                    reason: format!("{ms}: must be a finite number of milliseconds, not negative"),
                }
            })?;
            let rate = self.inject_failure_rate.unwrap_or(0.0);
            if !(0.0..=1.0).contains(&rate) {
                return Err(LoaderError::BadOption {
                    option: "inject_failure_rate",
                    reason: format!("{rate}: must be a fraction of reads, 0 to 1"),
                });
            }
            b = b.inject_faults(FaultConfig {
                transient_rate: rate,
                latency,
                ..FaultConfig::default()
            });
        }
        match &self.decode_images {
            Some(columns) => {
                let (height, width) = self.image_size.unwrap_or((224, 224));
                b = b.images(ImageOptions {
                    columns: columns.clone(),
                    height,
                    width,
                    crop: self.crop.parse::<Crop>()?,
                    scale: self.scale,
                    ratio: self.ratio,
                    flip: self.flip,
                    channels_first: self.channels_first,
                    max_pixels: self.max_image_pixels.unwrap_or(DEFAULT_MAX_IMAGE_PIXELS),
                });
            }
            None if self.image_size.is_some()
                || self.flip
                || self.channels_first
                || self.crop != "random_resized" =>
            {
                return bad(
                    "decode_images",
                    "image_size, crop, flip and channels_first apply to the columns named in decode_images",
                );
            }
            None => {}
        }
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_that_go_together_are_refused_apart_naming_the_option() {
        let refused = |o: LoaderOptions| match o.feed_builder() {
            Err(LoaderError::BadOption { option, .. }) => option,
            other => panic!("{other:?}"),
        };
        let plain = LoaderOptions::new("/data");
        assert!(matches!(
            plain.feed_builder().unwrap(),
            FeedBuilder::Loader(_)
        ));
        for o in [
            LoaderOptions {
                flip: true,
                ..plain.clone()
            },
            LoaderOptions {
                image_size: Some((32, 32)),
                ..plain.clone()
            },
        ] {
            assert_eq!(refused(o), "decode_images");
        }
        assert_eq!(
            refused(LoaderOptions {
                read_batch: Some(8),
                ..plain.clone()
            }),
            "mix_stop"
        );
        assert_eq!(
            refused(LoaderOptions {
                mixture: true,
                eos_id: Some(2),
                ..plain.clone()
            }),
            "pack_to"
        );
        assert_eq!(
            refused(LoaderOptions {
                on_error: "ignore".into(),
                ..plain.clone()
            }),
            "on_error"
        );
        assert_eq!(
            refused(LoaderOptions {
                inject_latency_ms: Some(-1.0),
                ..plain.clone()
            }),
            "inject_latency_ms"
        );
        for rate in [-0.1, 1.5, f64::NAN] {
            assert_eq!(
                refused(LoaderOptions {
                    inject_failure_rate: Some(rate),
                    ..plain.clone()
                }),
                "inject_failure_rate"
            );
        }
        let packed = LoaderOptions {
            pack_to: Some(128),
            ..plain
        };
        assert!(packed.is_mixture());
        assert!(matches!(
            packed.feed_builder().unwrap(),
            FeedBuilder::Mixture(_)
        ));
    }

    #[test]
    fn options_read_from_json_take_the_defaults_and_refuse_unknown_names() {
        let o: LoaderOptions =
            serde_json::from_str(r#"{"sources": [["/data", 1.0]], "batch_size": 8}"#).unwrap();
        assert_eq!(
            o,
            LoaderOptions {
                batch_size: 8,
                ..LoaderOptions::new("/data")
            }
        );
        let err = serde_json::from_str::<LoaderOptions>(r#"{"batch_sise": 8}"#).unwrap_err();
        assert!(err.to_string().contains("batch_sise"), "{err}");
    }

    #[test]
    fn debug_output_keeps_credentials_out() {
        let o = LoaderOptions {
            storage_options: vec![("aws_secret_access_key".into(), "s3cr3t".into())],
            ..LoaderOptions::new("https://alice:pw123@example.com/ds")
        };
        let text = format!("{o:?}");
        assert!(
            !text.contains("s3cr3t") && !text.contains("pw123"),
            "{text}"
        );
        assert!(text.contains("aws_secret_access_key"), "{text}");
    }
}
