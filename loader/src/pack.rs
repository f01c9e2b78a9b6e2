//! Sequence packing: a stream of documents (token lists) into rows of
//! exactly `length` tokens, for language-model training.
//!
//! Two modes ([`PackMode`]):
//! * **split** (the default): documents are concatenated, each followed by
//!   `eos_id` when one is set, and cut every `length` tokens; a document's
//!   tail continues at the start of the next row (its `position_ids` go on
//!   counting). No padding, except in the last row of an epoch.
//! * **fit**: no document shorter than a row crosses one. The next
//!   `window` documents are drawn, documents longer than a row are cut into
//!   full rows plus a tail, and the pieces are placed best-fit (longest
//!   first, each into the open row with the least room that holds it and has
//!   fewer than `max_segments` pieces); the rest of a row is `pad_id`.
//!
//! Each packed batch has, for `B` rows of `L` tokens (all `int32`):
//! `input_ids` `[B, L]`; `position_ids` `[B, L]`, the token's offset in its
//! document (0 at every document start, 0 on padding); `segment_ids`
//! `[B, L]`, 1, 2, ... for the documents of a row and 0 on padding;
//! `cu_seqlens` `[S + 1]`, the boundaries of the batch's `S` segments in the
//! flattened `B * L` tokens (each piece of a document within a row is a
//! segment, and so is each row's padding, so the last value is `B * L`), as
//! variable-length attention kernels take them; and `source` `[S]`, the
//! mixture source of each segment (-1 for padding).
//!
//! The packer is written against `Docs`, so that the mixture feeds it from
//! decoded batches without copying documents (split mode), and property
//! tests feed it from vectors.

use crate::error::{LoaderError, Result};

/// How documents are packed into rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PackMode {
    /// Concatenate and cut at the row length: no padding; a document's tail
    /// continues in the next row.
    #[default]
    Split,
    /// Place whole documents best-fit within a window of documents; pad the
    /// rest of each row. Documents longer than a row are split.
    Fit,
}

impl std::str::FromStr for PackMode {
    type Err = LoaderError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "split" => Ok(PackMode::Split),
            "fit" => Ok(PackMode::Fit),
            other => Err(LoaderError::BadOption {
                option: "pack_mode",
                reason: format!("{other:?} is not one of split, fit"),
            }),
        }
    }
}

/// Default documents per best-fit window of [`PackMode::Fit`].
pub const DEFAULT_PACK_WINDOW: usize = 1000;

/// How to pack: see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PackOptions {
    /// Tokens per row (`pack_to`).
    pub length: usize,
    /// Split or fit.
    pub mode: PackMode,
    /// Appended after every document when set.
    pub eos_id: Option<i32>,
    /// Fills the rest of a row in fit mode (and the last row of an epoch).
    pub pad_id: i32,
    /// Documents per best-fit window (fit mode).
    pub window: usize,
    /// The most documents in a row (fit mode); `None`: no limit.
    pub max_segments: Option<usize>,
}

impl PackOptions {
    /// Split mode, rows of `length` tokens, no eos, pad 0.
    pub fn new(length: usize) -> Self {
        PackOptions {
            length,
            mode: PackMode::Split,
            eos_id: None,
            pad_id: 0,
            window: DEFAULT_PACK_WINDOW,
            max_segments: None,
        }
    }

    pub(crate) fn check(&self) -> Result<()> {
        let bad = |option, reason: &str| {
            Err(LoaderError::BadOption {
                option,
                reason: reason.into(),
            })
        };
        if self.length == 0 || self.length > i32::MAX as usize / 4 {
            return bad("pack_to", "must be between 1 and 2^29 tokens");
        }
        if self.window == 0 {
            return bad("pack_window", "must be greater than 0");
        }
        if self.max_segments == Some(0) {
            return bad("max_segments", "must be greater than 0");
        }
        Ok(())
    }
}

/// A document's tokens, as stored.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Tokens<'a> {
    I32(&'a [i32]),
    U32(&'a [u32]),
    I64(&'a [i64]),
    U16(&'a [u16]),
    I16(&'a [i16]),
    U8(&'a [u8]),
}

impl Tokens<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Tokens::I32(t) => t.len(),
            Tokens::U32(t) => t.len(),
            Tokens::I64(t) => t.len(),
            Tokens::U16(t) => t.len(),
            Tokens::I16(t) => t.len(),
            Tokens::U8(t) => t.len(),
        }
    }

    /// Copy `self[from..from + out.len()]` into `out` as `i32`; a value that
    /// does not fit is returned as the error.
    pub(crate) fn copy_to(&self, from: usize, out: &mut [i32]) -> std::result::Result<(), i64> {
        let to = from + out.len();
        fn convert<T: Copy>(
            src: &[T],
            out: &mut [i32],
            f: impl Fn(T) -> Option<i32>,
            wide: impl Fn(T) -> i64,
        ) -> std::result::Result<(), i64> {
            for (o, &v) in out.iter_mut().zip(src) {
                *o = f(v).ok_or_else(|| wide(v))?;
            }
            Ok(())
        }
        match self {
            Tokens::I32(t) => {
                out.copy_from_slice(&t[from..to]);
                Ok(())
            }
            Tokens::U32(t) => convert(&t[from..to], out, |v| i32::try_from(v).ok(), i64::from),
            Tokens::I64(t) => convert(&t[from..to], out, |v| i32::try_from(v).ok(), |v| v),
            Tokens::U16(t) => convert(&t[from..to], out, |v| Some(i32::from(v)), i64::from),
            Tokens::I16(t) => convert(&t[from..to], out, |v| Some(i32::from(v)), i64::from),
            Tokens::U8(t) => convert(&t[from..to], out, |v| Some(i32::from(v)), i64::from),
        }
    }
}

/// Where documents come from: the mixture, or a test's vectors.
pub(crate) trait Docs {
    /// Draw the next document; `None` at the end of the (mixture) epoch.
    /// Returns the document's source.
    fn draw(&mut self) -> Result<Option<usize>>;
    /// The tokens of the document last drawn from `source`.
    fn tokens(&self, source: usize) -> Result<Tokens<'_>>;
    /// An error for a token of `source`'s last document that does not fit
    /// `int32`.
    fn bad_token(&self, source: usize, value: i64) -> LoaderError;
    /// Fit mode: a pack window is about to be drawn (the mixture notes where
    /// from, for its state).
    fn window_start(&mut self) {}
    /// Tokens of `source`'s last document emitted before an elastic resume
    /// (split mode leaves them out).
    fn skip(&self, _source: usize) -> usize {
        0
    }
}

/// The packed batch's buffers (capacities: `rows * length` each, and one
/// more for `cu_seqlens`).
pub(crate) struct Out<'a> {
    pub input_ids: &'a mut [i32],
    pub position_ids: &'a mut [i32],
    pub segment_ids: &'a mut [i32],
    pub cu_seqlens: &'a mut [i32],
    pub source: &'a mut [i32],
    /// Segments written so far.
    pub segments: usize,
}

impl Out<'_> {
    /// Close a segment of `len` tokens ending at flat offset `end`.
    fn segment(&mut self, end: usize, source: i32) {
        self.segments += 1;
        self.cu_seqlens[self.segments] = end as i32;
        self.source[self.segments - 1] = source;
    }

    /// Pad `[from, to)` of the flat buffers, as one segment.
    fn pad(&mut self, from: usize, to: usize, pad_id: i32) {
        if from == to {
            return;
        }
        self.input_ids[from..to].fill(pad_id);
        self.position_ids[from..to].fill(0);
        self.segment_ids[from..to].fill(0);
        self.segment(to, -1);
    }
}

/// `out[i] = first + i`, in 32-bit lanes (a 64-bit counter would halve the
/// vector width).
fn iota(out: &mut [i32], first: i32) {
    let mut v = first;
    for p in out {
        *p = v;
        v = v.wrapping_add(1);
    }
}

/// The document being emitted in split mode: its tail continues in the
/// next row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Carry {
    /// The mixture source of the document.
    pub source: usize,
    /// Tokens of it (eos included) already emitted.
    pub offset: usize,
}

/// A document of a fit-mode window, its tokens copied out.
#[derive(Clone, Copy, Debug)]
struct FitDoc {
    /// Its tokens (eos included) in the window's buffer.
    start: usize,
    len: usize,
    source: usize,
    /// Deferred from the previous window (it is not deferred again).
    carried: bool,
    /// Its draw index within its own window.
    index: u32,
}

/// Fit mode's window: documents copied out, and the rows they pack into.
#[derive(Default)]
struct Chunk {
    tokens: Vec<i32>,
    docs: Vec<FitDoc>,
    /// Rows: pieces (document, first token within it, tokens).
    rows: Vec<Vec<(usize, usize, usize)>>,
    /// Documents drawn for this window.
    drawn: usize,
    /// The epoch ended while it was drawn (it is the epoch's last).
    ended: bool,
    /// Documents (indices into `docs`) deferred to the next window.
    deferred: Vec<usize>,
}

/// Where fit mode is, for the mixture's state: the window before the
/// current one (documents drawn, and which of them were deferred into the
/// current one), and the current window's rows already emitted.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FitState {
    /// Documents drawn for the previous window (0: the current window did
    /// not take any from it, and the state's draw position is the current
    /// window's start).
    pub previous: usize,
    /// Draw indices (within the previous window) of its deferred documents.
    pub deferred: Vec<u32>,
    /// Rows of the current window already emitted.
    pub emitted: usize,
}

/// The packer's carry-over between batches.
pub(crate) struct Packer {
    pub options: PackOptions,
    /// Split mode: the document partly emitted.
    pub carry: Option<Carry>,
    /// Fit mode: the current window and how many of its rows were emitted.
    chunk: Chunk,
    pub chunk_emitted: usize,
    /// Fit mode: whether `chunk` holds a drawn window.
    pub chunk_live: bool,
    /// Fit mode: the previous window's draws and its deferred documents'
    /// draw indices (for the state).
    previous: usize,
    previous_deferred: Vec<u32>,
    /// Tokens emitted, and padding among them.
    pub tokens: u64,
    pub padding: u64,
    pub documents: u64,
}

impl Packer {
    pub(crate) fn new(options: PackOptions) -> Self {
        Packer {
            options,
            carry: None,
            chunk: Chunk::default(),
            chunk_emitted: 0,
            chunk_live: false,
            previous: 0,
            previous_deferred: Vec::new(),
            tokens: 0,
            padding: 0,
            documents: 0,
        }
    }

    /// Forget the windows and the carry (a new epoch).
    pub(crate) fn reset(&mut self) {
        self.carry = None;
        self.chunk_live = false;
        self.chunk = Chunk::default();
        self.previous = 0;
        self.previous_deferred.clear();
    }

    /// Fill up to `rows` rows; returns the rows filled (fewer only at the end
    /// of the epoch, where the last row is padded). `Out.segments` must be 0
    /// and `cu_seqlens[0]` is set here.
    pub(crate) fn fill(
        &mut self,
        docs: &mut impl Docs,
        rows: usize,
        out: &mut Out,
    ) -> Result<usize> {
        out.cu_seqlens[0] = 0;
        out.segments = 0;
        let filled = match self.options.mode {
            PackMode::Split => self.fill_split(docs, rows, out)?,
            PackMode::Fit => self.fill_fit(docs, rows, out)?,
        };
        let l = self.options.length;
        self.tokens += (filled * l) as u64;
        Ok(filled)
    }

    fn fill_split(&mut self, docs: &mut impl Docs, rows: usize, out: &mut Out) -> Result<usize> {
        let l = self.options.length;
        let eos = self.options.eos_id;
        for row in 0..rows {
            let row_start = row * l;
            let mut col = 0;
            let mut segment = 0;
            while col < l {
                let carry = match self.carry {
                    Some(c) => c,
                    None => match docs.draw()? {
                        Some(source) => {
                            self.documents += 1;
                            Carry {
                                source,
                                offset: docs.skip(source),
                            }
                        }
                        None => {
                            if col == 0 {
                                return Ok(row);
                            }
                            out.pad(row_start + col, row_start + l, self.options.pad_id);
                            self.padding += (l - col) as u64;
                            return Ok(row + 1);
                        }
                    },
                };
                let tokens = docs.tokens(carry.source)?;
                let len = tokens.len() + usize::from(eos.is_some());
                if len <= carry.offset {
                    // An empty document without eos (or one emitted whole).
                    self.carry = None;
                    continue;
                }
                let take = (len - carry.offset).min(l - col);
                let at = row_start + col;
                // The document's own tokens, then its eos.
                let own = tokens.len().saturating_sub(carry.offset).min(take);
                tokens
                    .copy_to(carry.offset, &mut out.input_ids[at..at + own])
                    .map_err(|v| docs.bad_token(carry.source, v))?;
                if own < take {
                    out.input_ids[at + own] = eos.expect("only eos is past the tokens");
                }
                segment += 1;
                iota(&mut out.position_ids[at..at + take], carry.offset as i32);
                out.segment_ids[at..at + take].fill(segment);
                out.segment(at + take, carry.source as i32);
                col += take;
                self.carry = if carry.offset + take == len {
                    None
                } else {
                    Some(Carry {
                        source: carry.source,
                        offset: carry.offset + take,
                    })
                };
            }
        }
        Ok(rows)
    }

    /// Copy the next `count` documents drawn into `tokens` and `docs`, or
    /// fewer once `cap` tokens were added; returns the documents drawn and
    /// whether the epoch ended.
    fn draw_into(
        &mut self,
        docs: &mut impl Docs,
        count: usize,
        cap: usize,
        tokens: &mut Vec<i32>,
        out: &mut Vec<FitDoc>,
    ) -> Result<(usize, bool)> {
        let eos = self.options.eos_id;
        let base = tokens.len();
        let mut drawn = 0;
        while drawn < count && tokens.len() - base < cap {
            let Some(source) = docs.draw()? else {
                return Ok((drawn, true));
            };
            let t = docs.tokens(source)?;
            let start = tokens.len();
            tokens.resize(start + t.len(), 0);
            t.copy_to(0, &mut tokens[start..])
                .map_err(|v| docs.bad_token(source, v))?;
            if let Some(e) = eos {
                tokens.push(e);
            }
            out.push(FitDoc {
                start,
                len: tokens.len() - start,
                source,
                carried: false,
                index: drawn as u32,
            });
            drawn += 1;
        }
        Ok((drawn, false))
    }

    /// The next window: the documents deferred from the current one, then
    /// `window` new ones (or fewer, once they hold `window` rows' worth of
    /// tokens: memory stays bounded whatever the documents' lengths), placed
    /// into rows best-fit. Unless the epoch ended
    /// within it, rows more than a quarter empty made only of its own whole
    /// documents are deferred to the next window (once), where more
    /// documents can fill them: only the epoch's last window pads its tail.
    fn next_window(&mut self, docs: &mut impl Docs) -> Result<()> {
        let l = self.options.length;
        let old = std::mem::take(&mut self.chunk);
        let mut tokens = Vec::with_capacity(old.tokens.len());
        let mut entries = Vec::with_capacity(self.options.window + old.deferred.len());
        for &d in &old.deferred {
            let doc = old.docs[d];
            let start = tokens.len();
            tokens.extend_from_slice(&old.tokens[doc.start..doc.start + doc.len]);
            entries.push(FitDoc {
                start,
                carried: true,
                ..doc
            });
        }
        self.previous = if old.deferred.is_empty() {
            0
        } else {
            old.drawn
        };
        self.previous_deferred = old.deferred.iter().map(|&d| old.docs[d].index).collect();
        docs.window_start();
        let cap = self.options.window.saturating_mul(l);
        let (drawn, ended) =
            self.draw_into(docs, self.options.window, cap, &mut tokens, &mut entries)?;
        self.documents += drawn as u64;
        let mut chunk = Chunk {
            tokens,
            docs: entries,
            rows: Vec::new(),
            drawn,
            ended,
            deferred: Vec::new(),
        };
        // Pieces: full rows of long documents first, then the tails
        // best-fit, longest first (ties in window order).
        let mut tails = Vec::with_capacity(chunk.docs.len());
        let mut split = vec![false; chunk.docs.len()];
        for (d, doc) in chunk.docs.iter().enumerate() {
            let full = doc.len / l;
            split[d] = full > 0 && doc.len % l > 0;
            for k in 0..full {
                chunk.rows.push(vec![(d, k * l, l)]);
            }
            if doc.len % l > 0 {
                tails.push((d, full * l, doc.len % l));
            }
        }
        tails.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
        let max_segments = self.options.max_segments.unwrap_or(usize::MAX);
        // Room left in each open row, as (room, row), for best fit.
        let mut open: std::collections::BTreeSet<(usize, usize)> = Default::default();
        let mut rooms = vec![0usize; chunk.rows.len()];
        for piece in tails {
            match open.range((piece.2, 0)..).next().copied() {
                Some((room, row)) => {
                    open.remove(&(room, row));
                    let r = &mut chunk.rows[row];
                    r.push(piece);
                    rooms[row] = room - piece.2;
                    if rooms[row] > 0 && r.len() < max_segments {
                        open.insert((rooms[row], row));
                    }
                }
                None => {
                    let row = chunk.rows.len();
                    chunk.rows.push(vec![piece]);
                    rooms.push(l - piece.2);
                    if piece.2 < l && max_segments > 1 {
                        open.insert((l - piece.2, row));
                    }
                }
            }
        }
        if !ended {
            let mut kept = Vec::with_capacity(chunk.rows.len());
            for (row, pieces) in std::mem::take(&mut chunk.rows).into_iter().enumerate() {
                let deferrable = rooms[row] * 4 > l
                    && pieces
                        .iter()
                        .all(|&(d, _, _)| !chunk.docs[d].carried && !split[d]);
                if deferrable {
                    chunk.deferred.extend(pieces.iter().map(|p| p.0));
                } else {
                    kept.push(pieces);
                }
            }
            chunk.rows = kept;
        }
        self.chunk = chunk;
        self.chunk_emitted = 0;
        self.chunk_live = true;
        Ok(())
    }

    fn fill_fit(&mut self, docs: &mut impl Docs, rows: usize, out: &mut Out) -> Result<usize> {
        let l = self.options.length;
        for row in 0..rows {
            while !self.chunk_live || self.chunk_emitted == self.chunk.rows.len() {
                let more = !self.chunk_live || !self.chunk.deferred.is_empty() || !self.chunk.ended;
                if !more {
                    return Ok(row);
                }
                self.next_window(docs)?;
                if self.chunk.rows.is_empty() && self.chunk.drawn == 0 {
                    return Ok(row);
                }
            }
            let row_start = row * l;
            let mut col = 0;
            let pieces = std::mem::take(&mut self.chunk.rows[self.chunk_emitted]);
            for (segment, &(d, first, len)) in pieces.iter().enumerate() {
                let at = row_start + col;
                let doc = self.chunk.docs[d];
                let from = doc.start + first;
                out.input_ids[at..at + len].copy_from_slice(&self.chunk.tokens[from..from + len]);
                iota(&mut out.position_ids[at..at + len], first as i32);
                out.segment_ids[at..at + len].fill(segment as i32 + 1);
                out.segment(at + len, doc.source as i32);
                col += len;
            }
            self.chunk.rows[self.chunk_emitted] = pieces;
            out.pad(row_start + col, row_start + l, self.options.pad_id);
            self.padding += (l - col) as u64;
            self.chunk_emitted += 1;
        }
        Ok(rows)
    }

    /// Fit mode: whether the state must name the current window: it has
    /// rows not yet emitted, or documents deferred to the next window (which
    /// a resume recovers by drawing it again).
    pub(crate) fn window_pending(&self) -> bool {
        self.chunk_live
            && (self.chunk_emitted < self.chunk.rows.len() || !self.chunk.deferred.is_empty())
    }

    /// Fit mode: where the packer is (see [`FitState`]).
    pub(crate) fn fit_state(&self) -> FitState {
        FitState {
            previous: self.previous,
            deferred: self.previous_deferred.clone(),
            emitted: self.chunk_emitted,
        }
    }

    /// Fit mode, after a resume at the state's draw position: draw the
    /// previous window again, keeping its deferred documents (nothing when
    /// the state has no previous window).
    pub(crate) fn redraw_previous(&mut self, docs: &mut impl Docs, state: &FitState) -> Result<()> {
        self.reset();
        if state.previous == 0 {
            return Ok(());
        }
        let documents = self.documents;
        docs.window_start();
        let (mut tokens, mut entries) = (Vec::new(), Vec::new());
        let (drawn, _) =
            self.draw_into(docs, state.previous, usize::MAX, &mut tokens, &mut entries)?;
        self.documents = documents;
        let deferred: Vec<usize> = entries
            .iter()
            .enumerate()
            .filter(|(_, d)| state.deferred.contains(&d.index))
            .map(|(i, _)| i)
            .collect();
        if drawn != state.previous || deferred.len() != state.deferred.len() {
            return Err(LoaderError::BadState {
                reason: "the previous pack window cannot be drawn again: the data changed".into(),
            });
        }
        self.chunk = Chunk {
            tokens,
            docs: entries,
            rows: Vec::new(),
            drawn,
            ended: false,
            deferred,
        };
        self.chunk_live = true;
        Ok(())
    }

    /// Then draw the current window again and skip the rows already emitted.
    pub(crate) fn redraw_current(&mut self, docs: &mut impl Docs, state: &FitState) -> Result<()> {
        let documents = self.documents;
        self.next_window(docs)?;
        self.documents = documents;
        if state.emitted > self.chunk.rows.len() {
            return Err(LoaderError::BadState {
                reason: format!(
                    "the state says {} rows of the current pack window were emitted, but the window packs into {} rows: the data changed",
                    state.emitted,
                    self.chunk.rows.len()
                ),
            });
        }
        self.chunk_emitted = state.emitted;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Documents from vectors; token `t` of document `d` is `d * 1000 + t`.
    struct VecDocs {
        docs: Vec<Vec<i32>>,
        next: usize,
        last: usize,
    }

    impl Docs for VecDocs {
        fn draw(&mut self) -> Result<Option<usize>> {
            if self.next == self.docs.len() {
                return Ok(None);
            }
            self.last = self.next;
            self.next += 1;
            Ok(Some(0))
        }
        fn tokens(&self, _: usize) -> Result<Tokens<'_>> {
            Ok(Tokens::I32(&self.docs[self.last]))
        }
        fn bad_token(&self, _: usize, value: i64) -> LoaderError {
            LoaderError::BadState {
                reason: value.to_string(),
            }
        }
    }

    fn docs(lengths: &[usize]) -> VecDocs {
        VecDocs {
            docs: lengths
                .iter()
                .enumerate()
                .map(|(d, &n)| (0..n as i32).map(|t| d as i32 * 100_000 + t + 1).collect())
                .collect(),
            next: 0,
            last: 0,
        }
    }

    struct Packed {
        ids: Vec<i32>,
        pos: Vec<i32>,
        seg: Vec<i32>,
        cu: Vec<i32>,
        src: Vec<i32>,
    }

    /// Pack everything in batches of `b` rows.
    fn pack_all(options: PackOptions, lengths: &[usize], b: usize) -> Vec<Packed> {
        let l = options.length;
        let mut d = docs(lengths);
        let mut p = Packer::new(options);
        let mut batches = vec![];
        loop {
            let (mut ids, mut pos, mut seg) = (vec![7; b * l], vec![7; b * l], vec![7; b * l]);
            let (mut cu, mut src) = (vec![0; b * l + 1], vec![0; b * l]);
            let mut out = Out {
                input_ids: &mut ids,
                position_ids: &mut pos,
                segment_ids: &mut seg,
                cu_seqlens: &mut cu,
                source: &mut src,
                segments: 0,
            };
            let rows = p.fill(&mut d, b, &mut out).unwrap();
            let s = out.segments;
            if rows == 0 {
                return batches;
            }
            let n = rows * l;
            batches.push(Packed {
                ids: ids[..n].to_vec(),
                pos: pos[..n].to_vec(),
                seg: seg[..n].to_vec(),
                cu: cu[..=s].to_vec(),
                src: src[..s].to_vec(),
            });
        }
    }

    /// `segment_ids`, `position_ids` and `cu_seqlens` describe the same
    /// segments; returns the (document, offset) tokens of each row, in order.
    fn check_consistent(b: &Packed, l: usize, pad: i32) {
        assert_eq!(*b.cu.last().unwrap() as usize, b.ids.len());
        for w in b.cu.windows(2) {
            let (a, z) = (w[0] as usize, w[1] as usize);
            assert!(a < z, "segments are not empty");
            assert_eq!(a / l, (z - 1) / l, "a segment stays in its row");
            let seg = b.seg[a];
            assert!(b.seg[a..z].iter().all(|&s| s == seg));
            if seg == 0 {
                assert!(b.ids[a..z].iter().all(|&t| t == pad));
            } else {
                // Positions count up within a segment.
                for i in a + 1..z {
                    assert_eq!(b.pos[i], b.pos[i - 1] + 1);
                }
                // Segment ids number a row's documents 1, 2, ...
                let prev = if a % l == 0 { 0 } else { b.seg[a - 1] };
                assert_eq!(seg, prev + 1);
            }
        }
        assert_eq!(b.src.len(), b.cu.len() - 1);
    }

    proptest! {
        /// Split mode: every token of every document exactly once, in order,
        /// positions restarting at each document; the segments are consistent.
        #[test]
        fn split_keeps_every_token_in_order(
            l in 1usize..40,
            lengths_in_l in prop::collection::vec(0usize..=120, 0..40),
            b in 1usize..5,
            eos: bool,
        ) {
            let lengths: Vec<usize> = lengths_in_l.iter().map(|&x| (x * l / 40).max(1)).collect();
            let mut options = PackOptions::new(l);
            options.eos_id = eos.then_some(-5);
            let batches = pack_all(options, &lengths, b);
            let mut stream = vec![];
            let mut positions = vec![];
            for batch in &batches {
                check_consistent(batch, l, 0);
                for (i, &t) in batch.ids.iter().enumerate() {
                    if batch.seg[i] != 0 {
                        stream.push(t);
                        positions.push(batch.pos[i]);
                    }
                }
                // Only the epoch's last row has padding.
                let pads = batch.seg.iter().filter(|&&s| s == 0).count();
                prop_assert!(pads == 0 || std::ptr::eq(batch, batches.last().unwrap()));
            }
            let mut expected = vec![];
            let mut expected_pos = vec![];
            for (d, &n) in lengths.iter().enumerate() {
                for t in 0..n {
                    expected.push(d as i32 * 100_000 + t as i32 + 1);
                    expected_pos.push(t as i32);
                }
                if eos {
                    expected.push(-5);
                    expected_pos.push(n as i32);
                }
            }
            prop_assert_eq!(stream, expected);
            prop_assert_eq!(positions, expected_pos);
        }

        /// Fit mode: every token once; a document shorter than a row is never
        /// split; `max_segments` holds.
        #[test]
        fn fit_never_splits_short_documents(
            l in 4usize..64,
            lengths in prop::collection::vec(1usize..150, 0..60),
            window in 1usize..20,
            max_segments in prop::option::of(1usize..5),
        ) {
            let mut options = PackOptions::new(l);
            options.mode = PackMode::Fit;
            options.window = window;
            options.max_segments = max_segments;
            options.pad_id = -1;
            let batches = pack_all(options, &lengths, 3);
            let mut pieces: Vec<Vec<(i32, i32)>> = vec![vec![]; lengths.len()];
            for batch in &batches {
                check_consistent(batch, l, -1);
                for w in batch.cu.windows(2) {
                    let (a, z) = (w[0] as usize, w[1] as usize);
                    if batch.seg[a] == 0 {
                        continue;
                    }
                    if let Some(m) = max_segments {
                        prop_assert!(batch.seg[a] as usize <= m);
                    }
                    let d = (batch.ids[a] - 1) / 100_000;
                    pieces[d as usize].push((batch.pos[a], (z - a) as i32));
                    for i in a..z {
                        prop_assert_eq!(batch.ids[i], d * 100_000 + batch.pos[i] + 1);
                    }
                }
            }
            for (d, &n) in lengths.iter().enumerate() {
                let mut p = pieces[d].clone();
                p.sort();
                // The pieces tile the document.
                let mut at = 0;
                for (start, len) in &p {
                    prop_assert_eq!(*start, at);
                    at += len;
                }
                prop_assert_eq!(at as usize, n);
                if n <= l {
                    prop_assert_eq!(p.len(), 1, "document {} of {} tokens was split", d, n);
                }
            }
        }
    }

    #[test]
    fn bad_options_are_refused() {
        assert!(PackOptions::new(0).check().is_err());
        let mut o = PackOptions::new(8);
        o.window = 0;
        assert!(o.check().is_err());
        assert!("pad".parse::<PackMode>().is_err());
    }
}
