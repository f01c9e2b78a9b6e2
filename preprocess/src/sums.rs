//! What the shard writer records of a column chunk's bytes: the file's
//! CRC-32 over them and the chunk's checksum, taken where the chunk is
//! encoded.

use bytes::Bytes;
use shardfeed_format::ChunkHash;

/// How shards' column chunks are checksummed (the loader checks every byte
/// it reads against them; see [`ChunkHash`]).
pub(crate) const CHUNK_HASH: ChunkHash = ChunkHash::Xxh3;

/// The sums of a chunk encoded here, taken on the encoder's thread as the
/// chunk is made: the file's CRC-32 over its bytes and its [`CHUNK_HASH`]
/// checksum. The shard writer, one thread, only combines them: summing every
/// byte there made it the one busy thread of a shuffle's gather phase, where
/// every row group is written after the scatter.
pub(crate) struct ChunkSums {
    pub crc: crc32fast::Hasher,
    pub chunk: u64,
}

impl ChunkSums {
    /// The sums of `parts`, one after another (each block of them read by
    /// both hashers while it is in the cache).
    pub(crate) fn of(parts: &[Bytes]) -> ChunkSums {
        let mut crc = crc32fast::Hasher::new();
        let mut chunk = CHUNK_HASH.hasher();
        for block in parts.iter().flat_map(|p| p.chunks(64 << 10)) {
            crc.update(block);
            chunk.update(block);
        }
        ChunkSums {
            crc,
            chunk: chunk.finish().value,
        }
    }
}
