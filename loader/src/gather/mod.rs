//! Kernels apart from the stages that run them: the window permutation
//! (the shuffle stage's work) and the collator's row gathers, dictionary
//! lookups and streamed copies into slabs.
//!
//! The collator's lookups read dictionary values without bound checks. What
//! makes them sound lives here too: [`KeyBound`], made only by the
//! permutation when it has checked every key of a column against its
//! dictionary, or found by [`kernels::Fixed::of`] scanning the keys.

pub(crate) mod kernels;
mod permute;

pub(crate) use permute::{KeyBound, LOOK_UP_ABOVE, permute};

/// Where the rows of a batch come from: `(source batch, row)` per output row.
pub(crate) type RowRefs = [(u32, u32)];
