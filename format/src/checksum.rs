//! CRC-32 checksums (the IEEE polynomial, as zlib and `crc32fast` compute it).
//!
//! Three levels protect a dataset:
//! * each shard's whole-file CRC and byte size, in the manifest (used by `verify`);
//! * each shard's footer CRC, in the manifest (checked by the loader on the one
//!   footer range it reads);
//! * each column chunk's CRC, stored in the shard's own footer under the key
//!   [`CHUNK_CRC_KEY`], so a reader that fetches only some column chunks of some
//!   row groups can check exactly the bytes it fetched. The footer itself is
//!   covered by the manifest, so this chain is anchored in the manifest.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::FormatError;

/// Footer key-value entry holding the per column chunk checksums of a shard.
pub const CHUNK_CRC_KEY: &str = "shardfeed.chunk_crc32";

/// A CRC-32 value, written as 8 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Crc32(pub u32);

impl Crc32 {
    /// Checksum of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Crc32(crc32fast::hash(bytes))
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

impl FromStr for Crc32 {
    type Err = FormatError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 8 {
            return Err(FormatError::BadChecksum {
                input: s.to_string(),
                reason: "expected 8 hex digits",
            });
        }
        u32::from_str_radix(s, 16)
            .map(Crc32)
            .map_err(|_| FormatError::BadChecksum {
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

/// Column chunk checksums of one shard: `[row_group][leaf_column]`.
///
/// Encoded in the footer as row groups separated by `;`, columns by `,`,
/// each a [`Crc32`] in hex, e.g. `"0a1b2c3d,00000001;deadbeef,12345678"`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChunkChecksums(pub Vec<Vec<Crc32>>);

impl ChunkChecksums {
    /// The footer value for these checksums.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(self.0.iter().map(|r| r.len() * 9).sum());
        for (i, row_group) in self.0.iter().enumerate() {
            if i > 0 {
                out.push(';');
            }
            for (j, crc) in row_group.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                out.push_str(&crc.to_string());
            }
        }
        out
    }

    /// Parse a footer value written by [`ChunkChecksums::encode`].
    pub fn decode(s: &str) -> Result<Self, FormatError> {
        if s.is_empty() {
            return Ok(ChunkChecksums(Vec::new()));
        }
        s.split(';')
            .map(|rg| rg.split(',').map(str::parse).collect())
            .collect::<Result<_, _>>()
            .map(ChunkChecksums)
    }

    /// The checksum of column chunk `column` in row group `row_group`.
    pub fn get(&self, row_group: usize, column: usize) -> Option<Crc32> {
        self.0.get(row_group)?.get(column).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_matches_zlib_reference() {
        // The standard check value for CRC-32/ISO-HDLC.
        assert_eq!(Crc32::of(b"123456789"), Crc32(0xcbf4_3926));
        assert_eq!(Crc32(0xcbf4_3926).to_string(), "cbf43926");
        assert_eq!("cbf43926".parse::<Crc32>().unwrap(), Crc32(0xcbf4_3926));
        assert!("xyz".parse::<Crc32>().is_err());
    }

    #[test]
    fn chunk_checksums_round_trip() {
        let c = ChunkChecksums(vec![
            vec![Crc32(1), Crc32(2)],
            vec![Crc32(0xffff_ffff), Crc32(0)],
        ]);
        let s = c.encode();
        assert_eq!(s, "00000001,00000002;ffffffff,00000000");
        assert_eq!(ChunkChecksums::decode(&s).unwrap(), c);
        assert_eq!(c.get(1, 0), Some(Crc32(0xffff_ffff)));
        assert_eq!(c.get(2, 0), None);
        assert!(ChunkChecksums::decode("0000001").is_err());
    }
}
