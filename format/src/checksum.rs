//! CRC-32 checksums (the IEEE polynomial, as zlib and `crc32fast` compute it).
//!
//! Three levels protect a dataset:
//! * each shard's whole-file CRC and byte size, in the manifest (used by `verify`);
//! * each shard's footer CRC, in the manifest (checked by the loader on the one
//!   footer range it reads);
//! * each column chunk's checksum, stored in the shard's own footer, so a reader
//!   that fetches only some column chunks of some row groups can check exactly
//!   the bytes it fetched: XXH3-64 under [`CHUNK_XXH3_KEY`] (what `shard`
//!   writes), or CRC-32 under [`CHUNK_CRC_KEY`] (shards written before; still
//!   read). The footer itself is covered by the manifest, so this chain is
//!   anchored in the manifest.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::FormatError;

/// Footer key-value entry holding a shard's column chunk CRC-32s (shards
/// written before [`CHUNK_XXH3_KEY`]).
pub const CHUNK_CRC_KEY: &str = "shardfeed.chunk_crc32";

/// Footer key-value entry holding a shard's column chunk XXH3-64 checksums.
pub const CHUNK_XXH3_KEY: &str = "shardfeed.chunk_xxh3";

/// A CRC-32 value, written as 8 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Crc32(pub u32);

impl Crc32 {
    /// Checksum of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Crc32(crc32fast::hash(bytes))
    }

    /// Checksum of the first `len` bytes of `file`, read in 1 MiB pieces
    /// (an error if the file is shorter).
    pub fn of_file(file: &std::fs::File, len: u64) -> std::io::Result<Self> {
        use std::os::unix::fs::FileExt;
        let mut hasher = crc32fast::Hasher::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0u64;
        while at < len {
            let n = (len - at).min(buf.len() as u64) as usize;
            file.read_exact_at(&mut buf[..n], at)?;
            hasher.update(&buf[..n]);
            at += n as u64;
        }
        Ok(Crc32(hasher.finalize()))
    }
}

impl fmt::Display for Crc32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}

impl fmt::Debug for Crc32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Crc32({self})")
    }
}

/// `s` as exactly `digits` hex digits (at most 16; no sign, which
/// `from_str_radix` would take).
fn parse_hex(s: &str, digits: usize) -> Option<u64> {
    if s.len() != digits || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

impl FromStr for Crc32 {
    type Err = FormatError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_hex(s, 8)
            .map(|v| Crc32(v as u32))
            .ok_or_else(|| FormatError::BadChecksum {
                input: s.to_string(),
                reason: "expected 8 hex digits",
            })
    }
}

impl Serialize for Crc32 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Crc32 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// How a shard's column chunks are checksummed: named by the footer key
/// their checksums are stored under.
///
/// XXH3-64 is what `shard` writes: on this project's machines it runs at
/// 30-40 GB/s against `crc32fast`'s 13-19 (one core, 256 KiB-2 MiB
/// chunks), and the loader checks every byte it reads (docs/performance-notes.md). Its
/// 64 bits let a random change go unnoticed with odds of 2^-64, against
/// 2^-32 for CRC-32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChunkHash {
    /// CRC-32 (IEEE), under [`CHUNK_CRC_KEY`].
    Crc32,
    /// XXH3-64 (seed 0), under [`CHUNK_XXH3_KEY`].
    Xxh3,
}

impl ChunkHash {
    /// The footer key its checksums are stored under.
    pub fn key(self) -> &'static str {
        match self {
            ChunkHash::Crc32 => CHUNK_CRC_KEY,
            ChunkHash::Xxh3 => CHUNK_XXH3_KEY,
        }
    }

    /// Hex digits of one checksum.
    fn digits(self) -> usize {
        match self {
            ChunkHash::Crc32 => 8,
            ChunkHash::Xxh3 => 16,
        }
    }

    /// The checksum of `bytes`.
    pub fn of(self, bytes: &[u8]) -> ChunkSum {
        let mut hasher = self.hasher();
        hasher.update(bytes);
        hasher.finish()
    }

    /// A hasher over no bytes yet.
    pub fn hasher(self) -> ChunkHasher {
        ChunkHasher(match self {
            ChunkHash::Crc32 => HasherState::Crc32(crc32fast::Hasher::new()),
            ChunkHash::Xxh3 => HasherState::Xxh3(Box::default()),
        })
    }
}

/// A column chunk's checksum, by [`ChunkHash`] (a CRC-32 in its low 32 bits).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChunkSum {
    /// How it was computed.
    pub hash: ChunkHash,
    /// The value.
    pub value: u64,
}

impl fmt::Display for ChunkSum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:0width$x}", self.value, width = self.hash.digits())
    }
}

impl fmt::Debug for ChunkSum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}({self})", self.hash)
    }
}

/// A column chunk checksum computed piece by piece ([`ChunkHash::hasher`]).
pub struct ChunkHasher(HasherState);

enum HasherState {
    Crc32(crc32fast::Hasher),
    // Boxed: its state is 500-some bytes.
    Xxh3(Box<twox_hash::XxHash3_64>),
}

impl ChunkHasher {
    /// Add `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        match &mut self.0 {
            HasherState::Crc32(h) => h.update(bytes),
            HasherState::Xxh3(h) => std::hash::Hasher::write(h.as_mut(), bytes),
        }
    }

    /// The checksum of every byte added.
    pub fn finish(self) -> ChunkSum {
        match self.0 {
            HasherState::Crc32(h) => ChunkSum {
                hash: ChunkHash::Crc32,
                value: u64::from(h.finalize()),
            },
            HasherState::Xxh3(h) => ChunkSum {
                hash: ChunkHash::Xxh3,
                value: std::hash::Hasher::finish(h.as_ref()),
            },
        }
    }
}

/// Column chunk checksums of one shard: `sums[row_group][leaf_column]`.
///
/// Encoded in the footer (under `hash.key()`) as row groups separated by
/// `;`, columns by `,`, each a checksum in hex (8 digits for CRC-32, 16 for
/// XXH3-64), e.g. `"0a1b2c3d,00000001;deadbeef,12345678"`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkChecksums {
    /// How the chunks were checksummed.
    pub hash: ChunkHash,
    /// The checksums, by row group and leaf column.
    pub sums: Vec<Vec<u64>>,
}

impl ChunkChecksums {
    /// The footer value for these checksums.
    pub fn encode(&self) -> String {
        let digits = self.hash.digits();
        let mut out = String::with_capacity(self.sums.iter().map(|r| r.len() * (digits + 1)).sum());
        for (i, row_group) in self.sums.iter().enumerate() {
            if i > 0 {
                out.push(';');
            }
            for (j, &value) in row_group.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                out.push_str(
                    &ChunkSum {
                        hash: self.hash,
                        value,
                    }
                    .to_string(),
                );
            }
        }
        out
    }

    /// Parse a footer value written by [`ChunkChecksums::encode`] for `hash`.
    pub fn decode(hash: ChunkHash, s: &str) -> Result<Self, FormatError> {
        let bad = |input: &str| FormatError::BadChecksum {
            input: input.to_string(),
            reason: match hash {
                ChunkHash::Crc32 => "expected 8 hex digits",
                ChunkHash::Xxh3 => "expected 16 hex digits",
            },
        };
        let sums = if s.is_empty() {
            Vec::new()
        } else {
            s.split(';')
                .map(|rg| {
                    rg.split(',')
                        .map(|v| parse_hex(v, hash.digits()).ok_or_else(|| bad(v)))
                        .collect()
                })
                .collect::<Result<_, _>>()?
        };
        Ok(ChunkChecksums { hash, sums })
    }

    /// The checksum of column chunk `column` in row group `row_group`.
    pub fn get(&self, row_group: usize, column: usize) -> Option<ChunkSum> {
        let value = *self.sums.get(row_group)?.get(column)?;
        Some(ChunkSum {
            hash: self.hash,
            value,
        })
    }
}

/// Page checksums of an indexed file's column chunks of more than one page
/// (`index --checksums`): for each, every page's length (header included) and
/// the low 32 bits of its bytes' XXH3-64, in file order from the chunk's
/// start. A loader that reads a chunk in parts (some of its pages) checks
/// the pages it read against them; a chunk read whole is checked against its
/// [`ChunkChecksums`].
///
/// Encoded as chunks separated by `;`, each `ROW_GROUP.COLUMN:` then 16 hex
/// digits a page (8 of length, 8 of checksum), e.g.
/// `"0.1:00001000deadbeef00000800cafef00d"`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageChecksums {
    /// `(row group, column, pages)`.
    pub chunks: Vec<(u32, u32, Pages)>,
}

/// A column chunk's pages as `(length, checksum)`, in file order.
pub type Pages = Vec<(u32, u32)>;

impl PageChecksums {
    /// The checksum of one page's bytes.
    pub fn of(page: &[u8]) -> u32 {
        let mut hasher = ChunkHash::Xxh3.hasher();
        hasher.update(page);
        hasher.finish().value as u32
    }

    /// The manifest's value for these checksums.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        for (k, (row_group, column, pages)) in self.chunks.iter().enumerate() {
            if k > 0 {
                out.push(';');
            }
            out.push_str(&format!("{row_group}.{column}:"));
            for (len, sum) in pages {
                out.push_str(&format!("{len:08x}{sum:08x}"));
            }
        }
        out
    }

    /// The pages of column `column` of row group `row_group`; `None` when it
    /// has none (a chunk of one page).
    pub fn get(&self, row_group: usize, column: usize) -> Option<&[(u32, u32)]> {
        let key = (u32::try_from(row_group).ok()?, u32::try_from(column).ok()?);
        let at = self
            .chunks
            .binary_search_by_key(&key, |(rg, col, _)| (*rg, *col))
            .ok()?;
        Some(&self.chunks[at].2)
    }
}

impl FromStr for PageChecksums {
    type Err = FormatError;

    /// Parse a value written by [`PageChecksums::encode`] (an error for one
    /// that is not), chunks kept in row group and column order.
    fn from_str(s: &str) -> Result<Self, FormatError> {
        let bad = |input: &str, reason: &'static str| FormatError::BadChecksum {
            input: input.chars().take(64).collect(),
            reason,
        };
        let mut chunks = Vec::new();
        for chunk in s.split(';').filter(|c| !c.is_empty()) {
            let (key, pages) = chunk
                .split_once(':')
                .ok_or_else(|| bad(chunk, "expected ROW_GROUP.COLUMN: and pages"))?;
            let (rg, col) = key
                .split_once('.')
                .and_then(|(rg, col)| Some((rg.parse::<u32>().ok()?, col.parse::<u32>().ok()?)))
                .ok_or_else(|| bad(chunk, "expected ROW_GROUP.COLUMN: and pages"))?;
            if pages.is_empty() || pages.len() % 16 != 0 {
                return Err(bad(chunk, "expected 16 hex digits a page"));
            }
            let pages = pages
                .as_bytes()
                .chunks(16)
                .map(|page| {
                    let digits = std::str::from_utf8(page).ok();
                    let field = |r: std::ops::Range<usize>| {
                        digits.and_then(|d| parse_hex(&d[r], 8)).map(|v| v as u32)
                    };
                    match (field(0..8), field(8..16)) {
                        (Some(len), Some(sum)) => Ok((len, sum)),
                        _ => Err(bad(chunk, "expected 16 hex digits a page")),
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            chunks.push((rg, col, pages));
        }
        chunks.sort_by_key(|(rg, col, _)| (*rg, *col));
        Ok(PageChecksums { chunks })
    }
}

impl Serialize for PageChecksums {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.encode())
    }
}

impl<'de> Deserialize<'de> for PageChecksums {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_checksums_round_trip_and_refuse_what_is_not_one() {
        let sums = PageChecksums {
            chunks: vec![
                (0, 1, vec![(4096, 0xdead_beef), (2048, 7)]),
                (3, 0, vec![(1, u32::MAX)]),
            ],
        };
        let parsed: PageChecksums = sums.encode().parse().unwrap();
        assert_eq!(parsed, sums);
        assert_eq!(
            parsed.get(0, 1),
            Some(&[(4096, 0xdead_beef), (2048, 7)][..])
        );
        assert_eq!(parsed.get(3, 0), Some(&[(1, u32::MAX)][..]));
        assert_eq!(parsed.get(0, 0), None);
        assert_eq!("".parse::<PageChecksums>().unwrap().get(0, 0), None);
        let json = serde_json::to_string(&sums).unwrap();
        assert_eq!(json, format!("\"{}\"", sums.encode()));
        assert_eq!(serde_json::from_str::<PageChecksums>(&json).unwrap(), sums);
        for bad in [
            "0.1:0000100",
            "0.1:zz00100000000007",
            "garbage",
            "0.1:",
            "x.1:0000000100000001",
        ] {
            assert!(bad.parse::<PageChecksums>().is_err(), "{bad}");
        }
    }

    #[test]
    fn crc_matches_zlib_reference() {
        // The standard check value for CRC-32/ISO-HDLC.
        assert_eq!(Crc32::of(b"123456789"), Crc32(0xcbf4_3926));
        assert_eq!(Crc32(0xcbf4_3926).to_string(), "cbf43926");
        assert_eq!("cbf43926".parse::<Crc32>().unwrap(), Crc32(0xcbf4_3926));
        assert!("xyz".parse::<Crc32>().is_err());
        assert!("+bf43926".parse::<Crc32>().is_err());
    }

    #[test]
    fn chunk_checksums_round_trip() {
        let c = ChunkChecksums {
            hash: ChunkHash::Crc32,
            sums: vec![vec![1, 2], vec![0xffff_ffff, 0]],
        };
        let s = c.encode();
        assert_eq!(s, "00000001,00000002;ffffffff,00000000");
        assert_eq!(ChunkChecksums::decode(ChunkHash::Crc32, &s).unwrap(), c);
        assert_eq!(c.get(1, 0).map(|c| c.value), Some(0xffff_ffff));
        assert_eq!(c.get(2, 0), None);
        assert!(ChunkChecksums::decode(ChunkHash::Crc32, "0000001").is_err());
        // The 16 digits of XXH3-64; an 8-digit value is refused for it.
        let x = ChunkChecksums {
            hash: ChunkHash::Xxh3,
            sums: vec![vec![u64::MAX, 7]],
        };
        assert_eq!(x.encode(), "ffffffffffffffff,0000000000000007");
        assert_eq!(
            ChunkChecksums::decode(ChunkHash::Xxh3, &x.encode()).unwrap(),
            x
        );
        assert!(ChunkChecksums::decode(ChunkHash::Xxh3, "00000001").is_err());
        assert!(ChunkChecksums::decode(ChunkHash::Xxh3, "-fffffffffffffff").is_err());
        assert!(ChunkChecksums::decode(ChunkHash::Xxh3, "+fffffffffffffff").is_err());
        assert!(ChunkChecksums::decode(ChunkHash::Crc32, "+0000001").is_err());
    }

    #[test]
    fn chunk_hashes_match_their_references_whole_and_in_pieces() {
        // CRC-32/ISO-HDLC's and XXH3-64's published values for "123456789"
        // and for no bytes.
        assert_eq!(ChunkHash::Crc32.of(b"123456789").value, 0xcbf4_3926);
        assert_eq!(ChunkHash::Xxh3.of(b"").value, 0x2d06_8005_38d3_94c2);
        let bytes: Vec<u8> = (0..300_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        for hash in [ChunkHash::Crc32, ChunkHash::Xxh3] {
            let whole = hash.of(&bytes);
            let mut pieces = hash.hasher();
            for piece in bytes.chunks(256 << 10 | 17) {
                pieces.update(piece);
            }
            assert_eq!(pieces.finish(), whole, "{hash:?}");
            let mut changed = bytes.clone();
            changed[123_456] ^= 1;
            assert_ne!(hash.of(&changed), whole, "{hash:?}");
        }
        assert_eq!(
            ChunkHash::Xxh3.of(&bytes).value,
            twox_hash::XxHash3_64::oneshot(&bytes)
        );
    }
}
