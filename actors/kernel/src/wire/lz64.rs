//! LZ-string (`compressToBase64`) decoding within a limit, in time and memory linear in the
//! input plus the output it allows.
//!
//! LZ-string is LZW over UTF-16 units. The `lz-str` crate keeps every dictionary entry as a
//! vector of its own, and an entry is the previous one plus a unit: a 70 KB stream whose codes
//! each name the newest entry makes entries of length 1, 2, …, 30 000 — gigabytes — before the
//! output can be measured. Here decoding runs in two passes:
//!
//! 1. **Measure.** Each code is read and turned into an *emission*: a literal unit, or a copy of
//!    `len` units from an earlier position of the output (an entry `w + c` is, by construction,
//!    the output at the place `w` was emitted, one unit longer). Entries are kept as such
//!    spans, never as strings, and the output's UTF-8 size is added up as the codes come. The
//!    first code that would take it past the limit stops decoding: nothing of the output has
//!    been allocated yet, and everything held is proportional to the input read so far.
//! 2. **Write.** Only a stream within the limit is written out, into a buffer of its exact size:
//!    UTF-8 bytes directly when the stream has no surrogate (astral) characters, since each
//!    entry is then also a span of the UTF-8 output (nearly every payload, and it costs no more
//!    than the limit); otherwise UTF-16 units, converted at the end.
//!
//! Results equal `lz_str::decompress_from_base64` on every stream it accepts (tested), except
//! that a stream past the limit is refused instead of decoded.

/// Why a stream was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lz64Error {
    /// Not an LZ-string base64 stream (bad character, truncated, unknown code, bad UTF-16).
    Invalid,
    /// The decoded text would be longer than the limit, in UTF-8 bytes.
    TooLarge,
}

/// `compressToBase64`'s alphabet; `=` (padding) reads as 64, whose bit no read reaches.
fn sextet(byte: u8) -> Result<u8, Lz64Error> {
    Ok(match byte {
        b'A'..=b'Z' => byte - b'A',
        b'a'..=b'z' => byte - b'a' + 26,
        b'0'..=b'9' => byte - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        b'=' => 64,
        _ => return Err(Lz64Error::Invalid),
    })
}

/// Reads the stream's bits, lowest first within each six-bit character.
struct Bits<'a> {
    input: &'a [u8],
    next: usize,
    value: u8,
    mask: u8,
}

/// The first bit read of each character (characters carry six bits).
const FIRST_MASK: u8 = 1 << 5;

impl<'a> Bits<'a> {
    fn new(input: &'a [u8]) -> Result<Option<Bits<'a>>, Lz64Error> {
        let Some(&first) = input.first() else {
            return Ok(None);
        };
        Ok(Some(Bits {
            input,
            next: 1,
            value: sextet(first)?,
            mask: FIRST_MASK,
        }))
    }

    /// One bit. As `lz-str` does, moving past the last character is an error even when no
    /// further bit is read.
    fn bit(&mut self) -> Result<bool, Lz64Error> {
        let set = self.value & self.mask != 0;
        self.mask >>= 1;
        if self.mask == 0 {
            self.mask = FIRST_MASK;
            let byte = *self.input.get(self.next).ok_or(Lz64Error::Invalid)?;
            self.value = sextet(byte)?;
            self.next += 1;
        }
        Ok(set)
    }

    /// `n` bits (at most 31) as a number, the first read being the lowest.
    fn read(&mut self, n: u32) -> Result<u32, Lz64Error> {
        let mut value = 0u32;
        for shift in 0..n {
            if self.bit()? {
                value |= 1 << shift;
            }
        }
        Ok(value)
    }
}

/// A dictionary entry: a span of the output, where it was first written.
#[derive(Clone, Copy)]
struct Entry {
    /// Position (in units) of the entry's first emission; for a literal not yet emitted, the
    /// position it is about to be emitted at.
    start: u32,
    /// The same position in UTF-8 bytes (meaningful when the stream has no surrogates).
    byte_start: u32,
    /// Length in UTF-16 units.
    len: u32,
    /// Length once encoded as UTF-8 (a surrogate counts two: a pair makes four bytes).
    bytes: u32,
    /// The first unit (entries are extended by another entry's first unit).
    first: u16,
}

/// What one code writes: a literal, or a copy of an earlier span (in units and in bytes).
#[derive(Clone, Copy)]
enum Emission {
    Unit(u16),
    Copy {
        start: u32,
        len: u32,
        byte_start: u32,
        bytes: u32,
    },
}

const LITERAL_8: u32 = 0;
const LITERAL_16: u32 = 1;
const CLOSE: u32 = 2;
/// Code widths grow with the dictionary; past this the stream is not one a compressor wrote
/// within any limit this decoder accepts.
const MAX_CODE_BITS: u32 = 31;

fn utf8_len(unit: u16) -> u32 {
    match unit {
        0..=0x7f => 1,
        0x80..=0x7ff => 2,
        0xd800..=0xdfff => 2,
        _ => 3,
    }
}

/// The output measured so far and the codes that write it.
struct Plan {
    dictionary: Vec<Entry>,
    emissions: Vec<Emission>,
    units: u32,
    bytes: u32,
    limit: u32,
    /// A literal is half of a surrogate pair: entries may then split a character, and the
    /// output is written as units.
    surrogates: bool,
}

impl Plan {
    fn new(limit: usize) -> Plan {
        let placeholder = Entry {
            start: 0,
            byte_start: 0,
            len: 0,
            bytes: 0,
            first: 0,
        };
        Plan {
            // Codes 0, 1 and 2 are never looked up as strings: they are the control codes.
            dictionary: vec![placeholder; 3],
            emissions: Vec::new(),
            units: 0,
            bytes: 0,
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
            surrogates: false,
        }
    }

    /// Adds a literal entry (it is emitted next, so its span starts where the output ends).
    fn literal(&mut self, unit: u16) -> usize {
        self.surrogates |= (0xd800..=0xdfff).contains(&unit);
        self.dictionary.push(Entry {
            start: self.units,
            byte_start: self.bytes,
            len: 1,
            bytes: utf8_len(unit),
            first: unit,
        });
        self.dictionary.len() - 1
    }

    /// Counts `entry` into the output, refusing it when it would pass the limit.
    fn emit(&mut self, index: usize) -> Result<Entry, Lz64Error> {
        let entry = *self.dictionary.get(index).ok_or(Lz64Error::Invalid)?;
        let bytes = self
            .bytes
            .checked_add(entry.bytes)
            .filter(|b| *b <= self.limit)
            .ok_or(Lz64Error::TooLarge)?;
        let units = self
            .units
            .checked_add(entry.len)
            .ok_or(Lz64Error::TooLarge)?;
        let emission = if entry.len == 1 && entry.start == self.units {
            Emission::Unit(entry.first)
        } else {
            Emission::Copy {
                start: entry.start,
                len: entry.len,
                byte_start: entry.byte_start,
                bytes: entry.bytes,
            }
        };
        self.emissions.push(emission);
        self.bytes = bytes;
        self.units = units;
        Ok(entry)
    }

    /// Adds `w + c`: the span of `w`'s emission at `w_start` (in units and bytes), one unit
    /// longer.
    fn extend(&mut self, w: Entry, w_start: (u32, u32), c: u16) -> Result<(), Lz64Error> {
        self.dictionary.push(Entry {
            start: w_start.0,
            byte_start: w_start.1,
            len: w.len.checked_add(1).ok_or(Lz64Error::TooLarge)?,
            bytes: w
                .bytes
                .checked_add(utf8_len(c))
                .ok_or(Lz64Error::TooLarge)?,
            first: w.first,
        });
        Ok(())
    }

    /// Writes the measured output as text.
    fn finish(&self) -> Result<String, Lz64Error> {
        if self.surrogates {
            String::from_utf16(&self.write_units()).map_err(|_| Lz64Error::Invalid)
        } else {
            String::from_utf8(self.write_utf8()).map_err(|_| Lz64Error::Invalid)
        }
    }

    /// The output as UTF-16 units.
    fn write_units(&self) -> Vec<u16> {
        let mut out: Vec<u16> = Vec::with_capacity(self.units as usize);
        for emission in &self.emissions {
            match *emission {
                Emission::Unit(unit) => out.push(unit),
                Emission::Copy { start, len, .. } => copy_within(&mut out, start, len),
            }
        }
        out
    }

    /// The output as UTF-8, for a stream without surrogates: every unit is a whole character,
    /// so every entry is also the byte span of its first emission.
    fn write_utf8(&self) -> Vec<u8> {
        let mut out: Vec<u8> = Vec::with_capacity(self.bytes as usize);
        for emission in &self.emissions {
            match *emission {
                Emission::Unit(unit) => {
                    let c = char::from_u32(u32::from(unit)).unwrap_or(char::REPLACEMENT_CHARACTER);
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                Emission::Copy {
                    byte_start, bytes, ..
                } => copy_within(&mut out, byte_start, bytes),
            }
        }
        out
    }
}

/// Appends `out[start..start + len]`; the span may run into what it appends (`w + w[0]`).
fn copy_within<T: Copy + Default>(out: &mut Vec<T>, start: u32, len: u32) {
    let (start, end) = (start as usize, start as usize + len as usize);
    if end <= out.len() {
        out.extend_from_within(start..end);
    } else {
        for i in start..end {
            let item = out.get(i).copied().unwrap_or_default();
            out.push(item);
        }
    }
}

/// Reads the literal a control code announces (8 or 16 bits).
fn literal_unit(bits: &mut Bits<'_>, code: u32) -> Result<u16, Lz64Error> {
    let width = if code == LITERAL_8 { 8 } else { 16 };
    u16::try_from(bits.read(width)?).map_err(|_| Lz64Error::Invalid)
}

/// Decodes an LZ-string base64 stream into text of at most `limit` UTF-8 bytes. An empty
/// stream decodes to empty text.
pub fn decompress_from_base64(input: &[u8], limit: usize) -> Result<String, Lz64Error> {
    let Some(mut bits) = Bits::new(input)? else {
        return Ok(String::new());
    };
    let mut plan = Plan::new(limit);
    let first = match bits.read(2)? {
        code @ (LITERAL_8 | LITERAL_16) => literal_unit(&mut bits, code)?,
        CLOSE => return Ok(String::new()),
        _ => return Err(Lz64Error::Invalid),
    };
    let index = plan.literal(first);
    let mut w_start = (plan.units, plan.bytes);
    let mut w = plan.emit(index)?;
    let mut code_bits = 3u32;
    let mut enlarge_in = 4u64;
    loop {
        let mut code = bits.read(code_bits)?;
        match code {
            LITERAL_8 | LITERAL_16 => {
                let unit = literal_unit(&mut bits, code)?;
                code = u32::try_from(plan.literal(unit)).map_err(|_| Lz64Error::TooLarge)?;
                enlarge_in -= 1;
            }
            CLOSE => break,
            _ => {}
        }
        if enlarge_in == 0 {
            enlarge_in = 1 << code_bits;
            code_bits += 1;
        }
        let code = code as usize;
        let start = (plan.units, plan.bytes);
        let entry = if code < plan.dictionary.len() {
            let entry = plan.emit(code)?;
            plan.extend(w, w_start, entry.first)?;
            entry
        } else if code == plan.dictionary.len() {
            // `w + w[0]`: the entry being defined is the one emitted.
            plan.extend(w, w_start, w.first)?;
            plan.emit(code)?
        } else {
            return Err(Lz64Error::Invalid);
        };
        enlarge_in -= 1;
        w = entry;
        w_start = start;
        if enlarge_in == 0 {
            enlarge_in = 1 << code_bits;
            code_bits += 1;
        }
        if code_bits > MAX_CODE_BITS {
            return Err(Lz64Error::Invalid);
        }
    }
    plan.finish()
}

/// A stream whose every code names the entry it is about to define (`w + w[0]`): `codes`
/// codes of `literal` decode to about `codes² / 2` characters. For tests of what a decoding
/// bomb costs.
#[cfg(any(test, feature = "test-support"))]
pub fn bomb(codes: usize, literal: u8) -> String {
    let mut bits: Vec<bool> = Vec::new();
    let mut push = |value: u32, width: u32| {
        for shift in 0..width {
            bits.push(value & (1 << shift) != 0);
        }
    };
    push(LITERAL_8, 2);
    push(u32::from(literal), 8);
    let (mut dict_len, mut code_bits, mut enlarge_in) = (4u32, 3u32, 4u64);
    for _ in 0..codes {
        push(dict_len, code_bits);
        enlarge_in -= 1;
        if enlarge_in == 0 {
            enlarge_in = 1 << code_bits;
            code_bits += 1;
        }
        dict_len += 1;
    }
    push(CLOSE, code_bits);
    bits.extend([false; 12]);
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    bits.chunks(6)
        .map(|chunk| {
            let value = chunk
                .iter()
                .enumerate()
                .fold(0usize, |v, (i, b)| v | (usize::from(*b) << (5 - i)));
            ALPHABET.get(value).copied().map_or('A', char::from)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn reference(text: &str) -> Option<String> {
        lz_str::decompress_from_base64(text).and_then(|units| String::from_utf16(&units).ok())
    }

    #[test]
    fn decodes_what_lz_string_encodes() {
        for text in [
            "",
            "a",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            r#"{"token":"phc_x","distinct_id":"ann","properties":{"$set":{"plan":"pro"}}}"#,
            "ünïcödé ☃ 😀 mixed with ascii ascii ascii 😀😀",
            "abababababababababababababababababababab",
        ] {
            let encoded = lz_str::compress_to_base64(text);
            assert_eq!(
                decompress_from_base64(encoded.as_bytes(), 1 << 20).as_deref(),
                Ok(text),
                "{text:?}"
            );
        }
    }

    #[test]
    fn the_limit_is_exact_in_utf8_bytes() {
        let text = "é".repeat(50); // 100 bytes
        let encoded = lz_str::compress_to_base64(&text);
        assert_eq!(
            decompress_from_base64(encoded.as_bytes(), 100).as_deref(),
            Ok(text.as_str())
        );
        assert_eq!(
            decompress_from_base64(encoded.as_bytes(), 99),
            Err(Lz64Error::TooLarge)
        );
    }

    #[test]
    fn a_bomb_is_refused_before_anything_is_written() {
        let small = bomb(20, b'a');
        let expected = "a".repeat((1..=21).sum::<usize>());
        assert_eq!(reference(&small).as_deref(), Some(expected.as_str()));
        assert_eq!(
            decompress_from_base64(small.as_bytes(), 1 << 20).as_deref(),
            Ok(expected.as_str())
        );
        // 30 000 codes would decode to 450 million units.
        let big = bomb(30_000, b'a');
        assert!(big.len() < 80_000, "{}", big.len());
        let started = std::time::Instant::now();
        assert_eq!(
            decompress_from_base64(big.as_bytes(), 100 << 20),
            Err(Lz64Error::TooLarge)
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn malformed_streams_are_invalid() {
        assert_eq!(
            decompress_from_base64(b"%%%%", 100),
            Err(Lz64Error::Invalid)
        );
        assert_eq!(decompress_from_base64(b"B", 100), Err(Lz64Error::Invalid));
        let valid = lz_str::compress_to_base64("hello hello hello");
        let cut = &valid.as_bytes()[..valid.len() / 2];
        assert_eq!(decompress_from_base64(cut, 100), Err(Lz64Error::Invalid));
    }

    proptest! {
        #[test]
        fn equals_lz_str_on_what_it_compresses(text in "\\PC{0,300}") {
            let encoded = lz_str::compress_to_base64(text.as_str());
            prop_assert_eq!(decompress_from_base64(encoded.as_bytes(), 1 << 20), Ok(text));
        }

        #[test]
        fn equals_lz_str_on_any_stream_within_the_limit(stream in "[A-Za-z0-9+/=]{0,200}") {
            let ours = decompress_from_base64(stream.as_bytes(), 1 << 16);
            match reference(&stream) {
                Some(text) if text.len() <= 1 << 16 => prop_assert_eq!(ours, Ok(text)),
                Some(_) => prop_assert_eq!(ours, Err(Lz64Error::TooLarge)),
                None => prop_assert!(ours.is_err()),
            }
        }
    }
}
