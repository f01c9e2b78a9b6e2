//! The RLE / bit-packed hybrid encoding: dictionary keys (any bit width up
//! to 32) into a [`KeySink`], and bit width 1 level streams as runs and bytes
//! ([`walk_bits`]).
//!
//! Run lengths and group counts are untrusted: a run is clipped to the
//! values asked for, a group count is multiplied with checked arithmetic
//! before it sizes a slice, and every slice is taken with `get`.

use arrow_buffer::ArrowNativeType;

use super::bitpack::unpack;

pub(super) fn dictionary_keys(
    values: &[u8],
    count: usize,
    sink: &mut impl KeySink,
) -> std::result::Result<(), String> {
    let (&bit_width, data) = values
        .split_first()
        .ok_or_else(|| "an empty data page".to_string())?;
    decode_hybrid_into(data, bit_width, count, sink)
}

/// Look the `count` keys of a dictionary-encoded page's values up in
/// `dictionary` (none yet: an error), appending the values to `out`.
pub(super) fn gather_dictionary<T: Copy + Default>(
    values: &[u8],
    count: usize,
    dictionary: Option<&[T]>,
    out: &mut Vec<T>,
) -> std::result::Result<(), String> {
    let dictionary = dictionary
        .ok_or_else(|| "a dictionary-encoded page without a dictionary page".to_string())?;
    let mut sink = Gather {
        dictionary,
        out,
        bad: None,
    };
    dictionary_keys(values, count, &mut sink)?;
    match sink.bad {
        Some(key) => Err(format!(
            "key {key} is outside the dictionary of {} values",
            dictionary.len()
        )),
        None => Ok(()),
    }
}

/// A byte with its `valid` (1 to 8) low bits set.
pub(super) fn low_bits(valid: usize) -> u8 {
    ((1u16 << valid) - 1) as u8
}

/// A stretch of a bit width 1 level stream.
#[derive(Clone, Copy)]
pub(super) enum Bits {
    /// `len` levels of `value` from level `first` on.
    Run { first: usize, len: usize, value: u8 },
    /// Levels `first..first + valid` packed in `byte`, least significant bit first.
    Byte {
        first: usize,
        byte: u8,
        valid: usize,
    },
}

/// Visit the stretches of a bit width 1 RLE / bit-packed hybrid level stream
/// of `count` levels.
pub(super) fn walk_bits(
    data: &[u8],
    count: usize,
    mut visit: impl FnMut(Bits),
) -> std::result::Result<(), String> {
    let mut at = 0usize;
    let mut level = 0usize;
    while level < count {
        let header = uleb128(data, &mut at, "a run header")?;
        if header & 1 == 0 {
            let run = usize::try_from(header >> 1)
                .unwrap_or(usize::MAX)
                .min(count - level);
            let value = *data
                .get(at)
                .ok_or_else(|| "a run value overruns the page".to_string())?;
            at += 1;
            if run == 0 || value > 1 {
                return Err(format!("a level run of {run} levels of value {value}"));
            }
            visit(Bits::Run {
                first: level,
                len: run,
                value,
            });
            level += run;
        } else {
            let packed_bytes = usize::try_from(header >> 1)
                .ok()
                .and_then(|bytes| at.checked_add(bytes))
                .and_then(|end| data.get(at..end))
                .ok_or_else(|| "bit-packed levels overrun the page".to_string())?;
            at += packed_bytes.len();
            for &b in packed_bytes {
                if level >= count {
                    break;
                }
                let valid = (count - level).min(8);
                visit(Bits::Byte {
                    first: level,
                    byte: b,
                    valid,
                });
                level += valid;
            }
        }
    }
    Ok(())
}

/// Read an unsigned LEB128 varint (at most 10 bytes, 64 bits) from `data`
/// at `*at`; `what` names it in errors.
pub(super) fn uleb128(data: &[u8], at: &mut usize, what: &str) -> std::result::Result<u64, String> {
    let mut value = 0u64;
    for i in 0..10 {
        let byte = *data
            .get(*at)
            .ok_or_else(|| format!("{what} overruns the page"))?;
        *at += 1;
        let bits = u64::from(byte & 0x7f);
        if i == 9 && bits > 1 {
            break;
        }
        value |= bits << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(format!("{what} overflows 64 bits"))
}

/// Where decoded keys go.
pub(super) trait KeySink {
    /// `len` copies of `key`.
    fn run(&mut self, key: i32, len: usize);
    /// Keys in order.
    fn keys(&mut self, keys: &[i32]);
}

/// A dictionary key type: `i32`, or `u16` for dictionaries of at most 2^16
/// values (the caller checks every key against the dictionary's length).
pub(super) trait Key: ArrowNativeType {
    /// The key `k` (checked to fit by the caller).
    fn of(k: i32) -> Self;
}

impl Key for i32 {
    fn of(k: i32) -> Self {
        k
    }
}

impl Key for u16 {
    fn of(k: i32) -> Self {
        k as u16
    }
}

/// Collects keys, remembering the largest (as unsigned: a key over 2^31 - 1
/// is out of any dictionary's range too).
pub(super) struct Keys<'a, K> {
    pub out: &'a mut Vec<K>,
    pub max: u32,
}

impl<K: Key> KeySink for Keys<'_, K> {
    fn run(&mut self, key: i32, len: usize) {
        self.max = self.max.max(key as u32);
        self.out.extend(std::iter::repeat_n(K::of(key), len));
    }
    fn keys(&mut self, keys: &[i32]) {
        self.max = keys.iter().fold(self.max, |m, &k| m.max(k as u32));
        self.out.extend(keys.iter().map(|&k| K::of(k)));
    }
}

/// Looks keys up in a dictionary; a key outside it is remembered (and a
/// default value written).
pub(super) struct Gather<'a, T> {
    pub dictionary: &'a [T],
    pub out: &'a mut Vec<T>,
    pub bad: Option<i32>,
}

impl<T: Copy + Default> KeySink for Gather<'_, T> {
    fn run(&mut self, key: i32, len: usize) {
        let value = match self.dictionary.get(key as usize) {
            Some(v) => *v,
            None => {
                self.bad = Some(key);
                T::default()
            }
        };
        self.out.extend(std::iter::repeat_n(value, len));
    }
    fn keys(&mut self, keys: &[i32]) {
        let dictionary = self.dictionary;
        let mut bad = false;
        self.out
            .extend(keys.iter().map(|&k| match dictionary.get(k as usize) {
                Some(v) => *v,
                None => {
                    bad = true;
                    T::default()
                }
            }));
        if bad {
            self.bad = keys
                .iter()
                .copied()
                .find(|&k| k as usize >= dictionary.len());
        }
    }
}

/// Decode `count` values of the RLE / bit-packed hybrid encoding into `sink`.
pub(super) fn decode_hybrid_into(
    data: &[u8],
    bit_width: u8,
    count: usize,
    sink: &mut impl KeySink,
) -> std::result::Result<(), String> {
    if bit_width > 32 {
        return Err(format!("bit width {bit_width} is over 32"));
    }
    let width = bit_width as usize;
    let mut done = 0usize;
    let mut at = 0usize;
    while done < count {
        let header = uleb128(data, &mut at, "a run header")?;
        let remaining = count - done;
        if header & 1 == 0 {
            // A run of one repeated value, stored in ceil(width / 8) bytes.
            let run = usize::try_from(header >> 1).unwrap_or(usize::MAX);
            let raw = data
                .get(at..at + width.div_ceil(8))
                .ok_or_else(|| "a run value overruns the page".to_string())?;
            at += raw.len();
            let mut value = 0u32;
            for (i, b) in raw.iter().enumerate() {
                value |= u32::from(*b) << (8 * i);
            }
            if run == 0 {
                return Err("an empty run".into());
            }
            let n = run.min(remaining);
            sink.run(value as i32, n);
            done += n;
        } else {
            // Groups of 8 bit-packed values, least significant bits first.
            // Checked: a forged group count must not wrap into a short slice.
            let groups = usize::try_from(header >> 1).unwrap_or(usize::MAX);
            let packed = groups
                .checked_mul(width)
                .and_then(|bytes| at.checked_add(bytes))
                .and_then(|end| data.get(at..end))
                .ok_or_else(|| "bit-packed values overrun the page".to_string())?;
            at += packed.len();
            let n = groups.saturating_mul(8).min(remaining);
            unpack(packed, width, n, sink);
            done += n;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decode `count` hybrid-encoded values of `bit_width` bits into `out`.
    fn decode_hybrid(
        data: &[u8],
        bit_width: u8,
        count: usize,
        out: &mut Vec<i32>,
    ) -> std::result::Result<(), String> {
        let mut sink = Keys { out, max: 0 };
        decode_hybrid_into(data, bit_width, count, &mut sink)
    }

    /// Pack `values` LSB first with `width` bits each (groups of 8, zero padded).
    fn pack(values: &[u32], width: usize) -> Vec<u8> {
        let groups = values.len().div_ceil(8);
        let mut out = vec![0u8; groups * width];
        for (i, &v) in values.iter().enumerate() {
            for b in 0..width {
                if (v >> b) & 1 == 1 {
                    let bit = i * width + b;
                    out[bit / 8] |= 1 << (bit % 8);
                }
            }
        }
        out
    }

    #[test]
    fn hybrid_runs_and_bit_packed_groups_decode_for_every_width() {
        for width in 0..=32usize {
            let max = if width == 32 {
                u32::MAX
            } else {
                (1u32 << width).wrapping_sub(1)
            };
            let packed_values: Vec<u32> = (0..205u32)
                .map(|i| i.wrapping_mul(2_654_435_761) & max)
                .collect();
            let mut data = Vec::new();
            // A run of 5 copies of `max`, then 26 groups of bit-packed values
            // (208 slots, 205 used).
            data.push(5 << 1);
            data.extend_from_slice(&max.to_le_bytes()[..width.div_ceil(8)]);
            data.push((26 << 1) | 1);
            data.extend(pack(&packed_values, width));
            let mut out = vec![-1];
            decode_hybrid(&data, width as u8, 210, &mut out).unwrap();
            let mut expected = vec![
                -1, max as i32, max as i32, max as i32, max as i32, max as i32,
            ];
            expected.extend(packed_values.iter().map(|&v| v as i32));
            assert_eq!(out, expected, "width {width}");
        }
    }

    #[test]
    fn keys_outside_the_dictionary_are_caught() {
        let dictionary = [10, 20, 30];
        // Bit-packed keys 0..8 (width 4): keys 3..7 are outside.
        let data = [(1 << 1) | 1, 0x10, 0x32, 0x54, 0x76];
        let mut out = Vec::new();
        let mut sink = Gather {
            dictionary: &dictionary,
            out: &mut out,
            bad: None,
        };
        decode_hybrid_into(&data, 4, 8, &mut sink).unwrap();
        assert_eq!(sink.bad, Some(3));
        // A run of key 2^31 (negative as i32) is outside too, for both sinks.
        let data = [2 << 1, 0, 0, 0, 0x80];
        let mut out = Vec::new();
        let mut sink = Gather {
            dictionary: &dictionary,
            out: &mut out,
            bad: None,
        };
        decode_hybrid_into(&data, 32, 2, &mut sink).unwrap();
        assert_eq!(sink.bad, Some(i32::MIN));
        let mut keys: Vec<i32> = Vec::new();
        let mut sink = Keys {
            out: &mut keys,
            max: 0,
        };
        decode_hybrid_into(&data, 32, 2, &mut sink).unwrap();
        assert_eq!(sink.max, 1 << 31);
    }

    #[test]
    fn truncated_hybrid_data_is_an_error() {
        let mut out = Vec::new();
        assert!(decode_hybrid(&[(2 << 1) | 1, 0xff], 3, 16, &mut out).is_err());
        assert!(decode_hybrid(&[4 << 1], 8, 4, &mut out).is_err());
        assert!(decode_hybrid(&[], 8, 1, &mut out).is_err());
    }
}
