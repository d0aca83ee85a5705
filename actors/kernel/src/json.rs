//! Reading JSON text without building it: the property scanner the segment writer (ingest)
//! and the query functions share. A leaf: it depends on nothing else in the crate.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;

/// One step of a JSON path: an object key or an array index (ClickHouse indexes from 1;
/// negative counts from the end).
#[derive(Debug, Clone, PartialEq)]
pub enum PathStep<'a> {
    Key(Cow<'a, str>),
    Index(i64),
}

/// The raw JSON text at `path` inside `json`, or `None` when absent or not valid JSON.
pub fn json_path<'j>(json: &'j str, path: &[PathStep<'_>]) -> Option<&'j str> {
    let mut current: &'j str = json;
    for step in path {
        let mut de = serde_json::Deserializer::from_str(current);
        let found: Option<&'j RawValue> = match step {
            PathStep::Key(key) => de.deserialize_any(FindKey { key }).ok()?,
            PathStep::Index(i) => de.deserialize_any(FindIndex { index: *i }).ok()?,
        };
        current = found?.get();
    }
    Some(current)
}

/// Reads an object key (or any string) borrowed from the JSON text unless it holds escapes.
/// `Cow<str>`'s own `Deserialize` always allocates a `String`.
pub struct BorrowedKey;

impl<'de> DeserializeSeed<'de> for BorrowedKey {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Cow<'de, str>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Cow::Borrowed(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Cow::Owned(v.to_string()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Cow::Owned(v))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// The text of a JSON string literal that holds no escape, without its quotes; `None` for any
/// other text (which then needs a real parse).
fn plain_string(raw: &str) -> Option<&str> {
    raw.strip_prefix('"')?
        .strip_suffix('"')
        .filter(|s| !needs_parsing(s.as_bytes()))
}

/// Whether `bytes` (a string literal's inside) hold a quote, a backslash or a control
/// character, eight bytes at a time: a materialized column's values (URLs, paths) are read
/// through this for every row a segment writes.
fn needs_parsing(bytes: &[u8]) -> bool {
    let special = |b: u8| b == b'\\' || b == b'"' || b < 0x20;
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let Ok(word) = <[u8; 8]>::try_from(word).map(u64::from_le_bytes) else {
            return word.iter().any(|&b| special(b));
        };
        if bytes_equal_to(word, b'"') | bytes_equal_to(word, b'\\') | bytes_below(word, 0x20) != 0 {
            return true;
        }
    }
    words.remainder().iter().any(|&b| special(b))
}

/// `text`, the text of one JSON value, parsed as `serde_json` parses it into a [`Value`]; a
/// string literal without escapes or control characters (most values capture reads: names,
/// ids, times) is taken without a parser. `None` when it does not parse.
///
/// `true`, `false`, `null` and integers of at most 15 characters (ages, counts, ids) are taken
/// without a parser too; other numbers go to `serde_json`, whose float reading decides them.
pub fn parse_value(text: &str) -> Option<Value> {
    if let Some(plain) = plain_string(text) {
        return Some(Value::String(plain.to_owned()));
    }
    match text {
        "true" => Some(Value::Bool(true)),
        "false" => Some(Value::Bool(false)),
        "null" => Some(Value::Null),
        _ => short_integer(text).or_else(|| serde_json::from_str(text).ok()),
    }
}

/// The value of a scalar [`members_with_scalars_checked`] gave as checked (`plain`): a string
/// it found without escapes or control characters is taken between its quotes without being
/// looked over again; numbers and literals are read as [`parse_value`] reads them. Only for
/// values the walk marked plain: an escape in a string given here would be kept as it is.
pub fn checked_scalar_value(value: &str) -> Option<Value> {
    match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(inside) => Some(Value::String(inside.to_owned())),
        None => parse_value(value),
    }
}

/// A JSON integer of at most 15 characters as `serde_json` reads it: never out of `i64`'s
/// range. `-0` is left out: `serde_json` reads it as the float `-0.0`.
fn short_integer(text: &str) -> Option<Value> {
    let bytes = text.as_bytes();
    if text == "-0" || bytes.contains(&b'.') || !is_short_decimal(bytes) {
        return None;
    }
    text.parse::<i64>().ok().map(Value::from)
}

/// Whether `value` may nest near `serde_json`'s recursion limit (128). Parsed on
/// its own, a value has more room below that limit than inside the objects around it, so a
/// reader that parses a member's value alone leaves one that may nest near the limit (more
/// than 64 brackets in its text) to the parse of the whole text.
pub fn may_nest_deeply(value: &str) -> bool {
    const OPENERS_TRUSTED: usize = 64;
    value
        .bytes()
        .filter(|b| matches!(b, b'{' | b'['))
        .nth(OPENERS_TRUSTED)
        .is_some()
}

/// Appends `text` to `out` as the JSON string literal `serde_json` writes for it. Text with no
/// quote, backslash or control character (ids, event names, addresses) is copied between quotes
/// as it is, found eight bytes at a time; `serde_json`'s writer looks up every byte. The rest is
/// escaped by `serde_json`.
pub fn write_string_literal(out: &mut Vec<u8>, text: &str) {
    if needs_parsing(text.as_bytes()) {
        // Writing a `str` into a `Vec` cannot fail.
        let _ = serde_json::to_writer(&mut *out, text);
        return;
    }
    out.reserve(text.len() + 2);
    out.push(b'"');
    out.extend_from_slice(text.as_bytes());
    out.push(b'"');
}

/// A JSON string literal's text, borrowed when it holds no escape.
fn string_literal(raw: &str) -> Option<Cow<'_, str>> {
    match plain_string(raw) {
        Some(plain) => Some(Cow::Borrowed(plain)),
        None => serde_json::from_str::<Cow<'_, str>>(raw).ok(),
    }
}

/// A path step into a scalar finds nothing.
macro_rules! scalars_find_nothing {
    () => {
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    };
}

struct FindKey<'k> {
    key: &'k str,
}

impl<'de> Visitor<'de> for FindKey<'_> {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(key) = map.next_key_seed(BorrowedKey)? {
            if found.is_none() && key == self.key {
                found = Some(map.next_value::<&'de RawValue>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    scalars_find_nothing!();
}

/// The raw JSON text of each of `keys` at the top level of `json`, in one pass: what
/// [`json_path`] finds for each key alone (the first occurrence; nothing when `json` is not a
/// valid object). Segment writers fill every property column of a row from one scan of its
/// JSON instead of one scan per column.
pub fn top_level_values<'j>(json: &'j str, keys: &[&str]) -> Vec<Option<&'j str>> {
    let mut de = serde_json::Deserializer::from_str(json);
    match de.deserialize_any(FindKeys { keys }) {
        Ok(Some(found)) => found.into_iter().map(|v| v.map(RawValue::get)).collect(),
        _ => vec![None; keys.len()],
    }
}

struct FindKeys<'k> {
    keys: &'k [&'k str],
}

impl<'de> Visitor<'de> for FindKeys<'_> {
    /// `None` when the value is not an object.
    type Value = Option<Vec<Option<&'de RawValue>>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = vec![None; self.keys.len()];
        while let Some(key) = map.next_key_seed(BorrowedKey)? {
            match self.keys.iter().position(|k| *k == key) {
                Some(i) if found[i].is_none() => {
                    found[i] = Some(map.next_value::<&'de RawValue>()?);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Some(found))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    scalars_find_nothing!();
}

/// The keys a caller reads from many JSON objects with [`WantedKeys::values_of_checked`]: the
/// segment writer reads each row's materialized columns with it.
#[derive(Debug)]
pub struct WantedKeys<'k> {
    keys: &'k [&'k str],
    /// Per key, its length and its first eight bytes (zero-padded): a member's key is compared
    /// as two integers, and as text only when both match.
    heads: Vec<(usize, u64)>,
    /// One bit per key length (see [`length_bit`]): most members' keys are not wanted, and
    /// their length alone tells.
    lengths: u64,
    /// An open-addressed table from a key's length and head to its place in `keys` plus one
    /// (zero: empty), probed linearly: a member whose length is wanted costs one probe or two,
    /// not a comparison with every wanted key (a segment materializes up to twenty).
    slots: Vec<u32>,
}

impl<'k> WantedKeys<'k> {
    pub fn new(keys: &'k [&'k str]) -> WantedKeys<'k> {
        let heads: Vec<(usize, u64)> = keys
            .iter()
            .map(|k| (k.len(), head_word(k.as_bytes())))
            .collect();
        // At most half full, so a probe for an unwanted key meets an empty slot soon (and an
        // empty slot always exists: every probe ends).
        let mut slots = vec![0u32; (keys.len() * 2).next_power_of_two().max(8)];
        let mask = slots.len() - 1;
        // Keys go in in order, so a key given twice is met at its first place first, as a
        // search in order finds it.
        for (i, &(len, head)) in heads.iter().enumerate() {
            let mut at = slot_of(len, head) & mask;
            while slots.get(at).is_some_and(|&taken| taken != 0) {
                at = (at + 1) & mask;
            }
            if let (Some(slot), Ok(place)) = (slots.get_mut(at), u32::try_from(i + 1)) {
                *slot = place;
            }
        }
        WantedKeys {
            keys,
            heads,
            lengths: keys.iter().fold(0u64, |mask, k| mask | length_bit(k.len())),
            slots,
        }
    }

    /// [`top_level_values`] for text that is already known to be JSON: the properties text
    /// that capture checked, or that a segment holds. A byte walk finds the ends of strings
    /// and brackets without checking escapes, numbers or UTF-8 again, and it fills `found` (one
    /// slot per key) in place, so a caller can reuse one buffer for every row.
    ///
    /// On text that is valid JSON it finds exactly what [`top_level_values`] finds. It leaves
    /// `None` for every key when the walk does not find a well-formed object. It never panics
    /// or loops, on any input.
    pub fn values_of_checked<'j>(&self, json: &'j str, found: &mut [Option<&'j str>]) {
        found.iter_mut().for_each(|f| *f = None);
        // The direct walk gives up on a key with escapes (compared only once unescaped) and on
        // text that is not a well-formed object; the member walk then decides.
        if self.walk_plain_keys(json, found).is_none() {
            self.walk_members(json, found);
        }
    }

    /// The wanted key `key` is, compared as sent (without unescaping). `head` is the key's
    /// first eight bytes, zero-padded ([`head_word`]).
    fn position(&self, key: &[u8], head: u64) -> Option<usize> {
        let mask = self.slots.len() - 1;
        let mut at = slot_of(key.len(), head) & mask;
        loop {
            let place = (*self.slots.get(at)? as usize).checked_sub(1)?;
            let (len, h) = *self.heads.get(place)?;
            if len == key.len() && h == head && self.keys.get(place)?.as_bytes() == key {
                return Some(place);
            }
            at = (at + 1) & mask;
        }
    }

    /// The walk over an object whose keys hold no escape. `None` (with `found` partly filled)
    /// at an escaped key or at anything but a well-formed object.
    fn walk_plain_keys<'j>(&self, json: &'j str, found: &mut [Option<&'j str>]) -> Option<()> {
        let bytes = json.as_bytes();
        let mut walk = Walk { text: json, at: 0 };
        walk.expect(b'{')?;
        if walk.peek()? == b'}' {
            return Some(());
        }
        loop {
            if walk.peek()? != b'"' {
                return None;
            }
            let (end, escaped) = string_end(bytes, walk.at)?;
            if escaped {
                return None;
            }
            let key_start = walk.at + 1;
            let key = bytes.get(key_start..end.checked_sub(1)?)?;
            walk.at = end;
            walk.expect(b':')?;
            let first = walk.peek()?;
            let value_start = walk.at;
            // Most values are strings: their end is found here, without a call to look at the
            // first byte again and to check the slice's ends.
            if first == b'"' {
                walk.at = string_end(bytes, value_start)?.0;
            } else {
                walk.value()?;
            }
            if self.lengths & length_bit(key.len()) != 0 {
                let head = head_word_at(bytes, key_start, key.len());
                if let Some(slot) = self.position(key, head).and_then(|i| found.get_mut(i)) {
                    slot.get_or_insert(json.get(value_start..walk.at)?);
                }
            }
            match walk.next()? {
                b',' => {}
                b'}' => return Some(()),
                _ => return None,
            }
        }
    }

    /// The walk over every member, keys unescaped.
    fn walk_members<'j>(&self, json: &'j str, found: &mut [Option<&'j str>]) {
        found.iter_mut().for_each(|f| *f = None);
        let walked = members_of_checked(json, |key, value| {
            if self.lengths & length_bit(key.len()) != 0 {
                if let Some(i) = self.keys.iter().position(|k| *k == key) {
                    found.get_mut(i)?.get_or_insert(value);
                }
            }
            Some(())
        });
        if walked.is_none() {
            found.iter_mut().for_each(|f| *f = None);
        }
    }
}

/// The first eight bytes of `bytes`, zero-padded, as one integer.
fn head_word(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    for (w, b) in word.iter_mut().zip(bytes) {
        *w = *b;
    }
    u64::from_le_bytes(word)
}

/// [`head_word`] of the `len` bytes of `text` at `start`, read as one load where eight bytes
/// follow `start` (a member's key is followed by at least its quote, a colon and a value).
fn head_word_at(text: &[u8], start: usize, len: usize) -> u64 {
    match text.get(start..start + 8).map(<[u8; 8]>::try_from) {
        Some(Ok(word)) if len >= 8 => u64::from_le_bytes(word),
        Some(Ok(word)) => u64::from_le_bytes(word) & ((1u64 << (8 * len)) - 1),
        _ => head_word(text.get(start..start + len).unwrap_or_default()),
    }
}

/// Where a key of `len` bytes whose first eight are `head` starts probing [`WantedKeys`]'s
/// table (before masking to its size): a multiplicative hash, its high bits folded down.
fn slot_of(len: usize, head: u64) -> usize {
    let mixed = (head ^ (len as u64).rotate_left(56)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed >> 40) as usize
}

/// A bit for a key length: lengths from 63 on share the last one.
fn length_bit(len: usize) -> u64 {
    1 << len.min(63)
}

/// Calls `member` with each member of the JSON object `json` in order: the key's text
/// (unescaped) and the value's text. Like [`WantedKeys::values_of_checked`] it walks text that
/// is already known to be JSON without checking it again. `None` when the walk does not find
/// a well-formed object, when a key's escapes do not decode, or when `member` returns `None`
/// (which stops the walk); it never panics or loops, on any input.
///
/// On success it returns the index just past the object's closing brace.
pub fn members_of_checked<'j>(
    json: &'j str,
    mut member: impl FnMut(Cow<'j, str>, &'j str) -> Option<()>,
) -> Option<usize> {
    // The text is JSON already: its keys need no second look for control characters.
    walk_members(json, false, |key, rest| {
        let len = value_len_checked(rest)?;
        member(key, rest.get(..len)?)?;
        Some(len)
    })
}

/// [`members_of_checked`] where `member` reads each value itself: it is given the key and the
/// text from the value's first byte to the end of `json`, and returns how many bytes the value
/// takes (or `None`, which stops the walk). Capture reads an event's properties with its own
/// parse this way, so the largest member is gone over once, not twice. A length past the end
/// of the text ends the walk with `None`. Keys are checked as a parse checks them (escapes
/// decoded, no control character), so on text nobody checked before, the walk and readers
/// that check every value take only JSON.
pub fn members_read_by<'j>(
    json: &'j str,
    member: impl FnMut(Cow<'j, str>, &'j str) -> Option<usize>,
) -> Option<usize> {
    walk_members(json, true, member)
}

/// The walk of [`members_read_by`]; `check_keys` says whether an unescaped key is looked over
/// for control characters (text nobody checked) or taken as it is (text known to be JSON).
fn walk_members<'j>(
    json: &'j str,
    check_keys: bool,
    mut member: impl FnMut(Cow<'j, str>, &'j str) -> Option<usize>,
) -> Option<usize> {
    let mut walk = Walk { text: json, at: 0 };
    walk.expect(b'{')?;
    if walk.peek()? == b'}' {
        return Some(walk.at + 1);
    }
    loop {
        let (literal, escaped) = walk.string()?;
        let key = if escaped {
            Cow::Owned(serde_json::from_str::<String>(literal).ok()?)
        } else {
            // JSON text holds no control character in a string: text that does is not JSON.
            let plain = literal.get(1..literal.len().saturating_sub(1))?;
            if check_keys && plain.bytes().any(|b| b < 0x20) {
                return None;
            }
            Cow::Borrowed(plain)
        };
        walk.expect(b':')?;
        walk.peek()?;
        let len = member(key, json.get(walk.at..)?)?;
        walk.at = walk.at.checked_add(len).filter(|end| *end <= json.len())?;
        match walk.next()? {
            b',' => {}
            b'}' => return Some(walk.at),
            _ => return None,
        }
    }
}

/// Walks the JSON object at the start of `json`, text nobody checked, giving `member` each key
/// (unescaped), the value's text, and whether the walk checked that value as a parse would: a
/// string without escapes or control characters, a decimal of at most 15 characters, `true`,
/// `false` or `null` (see [`is_plain_scalar`]). Any other value (`false`) is for the caller to
/// check with a parse. Keys are checked as a parse checks them. Each string is looked at once,
/// eight bytes at a time, for both its end and whether it is plain: an SDK's properties are
/// mostly short strings, and finding the end and then checking the text went over each twice.
///
/// Returns the index just past the closing brace; `None` when the walk does not find a
/// well-formed object, a key does not decode, or `member` returns `None`. Never panics or loops.
pub fn members_with_scalars_checked<'j>(
    json: &'j str,
    mut member: impl FnMut(Cow<'j, str>, &'j str, bool) -> Option<()>,
) -> Option<usize> {
    let bytes = json.as_bytes();
    let mut walk = Walk { text: json, at: 0 };
    walk.expect(b'{')?;
    if walk.peek()? == b'}' {
        return Some(walk.at + 1);
    }
    loop {
        if walk.peek()? != b'"' {
            return None;
        }
        let start = walk.at;
        let (end, plain) = checked_string_end(bytes, start)?;
        let key = if plain {
            Cow::Borrowed(json.get(start + 1..end - 1)?)
        } else {
            Cow::Owned(serde_json::from_str::<String>(json.get(start..end)?).ok()?)
        };
        walk.at = end;
        walk.expect(b':')?;
        let (value, plain) = match walk.peek()? {
            b'"' => {
                let start = walk.at;
                let (end, plain) = checked_string_end(bytes, start)?;
                walk.at = end;
                (json.get(start..end)?, plain)
            }
            b'{' | b'[' => (walk.value()?, false),
            _ => {
                let value = walk.value()?;
                (value, is_plain_scalar(value))
            }
        };
        member(key, value, plain)?;
        match walk.next()? {
            b',' => {}
            b'}' => return Some(walk.at),
            _ => return None,
        }
    }
}

/// [`string_end`] for text nobody checked: the index just past the closing quote of the string
/// literal whose opening quote is at `start`, and whether the literal is plain (no escape, no
/// control character). The first quote, backslash or control character is found eight bytes
/// at a time; a literal that is not plain is walked again by [`string_end`]. Inlined into
/// the member walk, which calls it for every key and most values.
#[inline(always)]
fn checked_string_end(bytes: &[u8], start: usize) -> Option<(usize, bool)> {
    let mut at = start + 1;
    while let Some(word) = bytes.get(at..at + 8) {
        let word = u64::from_le_bytes(word.try_into().ok()?);
        let found =
            bytes_equal_to(word, b'"') | bytes_equal_to(word, b'\\') | bytes_below(word, 0x20);
        if found != 0 {
            at += (found.trailing_zeros() / 8) as usize;
            break;
        }
        at += 8;
    }
    loop {
        match *bytes.get(at)? {
            b'"' => return Some((at + 1, true)),
            b'\\' | 0..=0x1f => return Some((string_end(bytes, start)?.0, false)),
            _ => at += 1,
        }
    }
}

/// The length of the JSON value at the start of `text` (already known to be JSON): a string,
/// an object or array with everything in it, or a number or literal up to the next delimiter.
/// `None` when no well-formed value starts there.
pub fn value_len_checked(text: &str) -> Option<usize> {
    let mut walk = Walk { text, at: 0 };
    walk.value()?;
    Some(walk.at)
}

/// Whether `value`, one value's text, is a JSON string literal, number or literal name
/// that a parse would take as it is: a string without escapes or control characters, an
/// integer or a decimal fraction of at most 15 characters (always in range), `true`, `false`
/// or `null`. Anything else (escapes, exponents, long numbers, objects, arrays, invalid text)
/// needs a real parse to tell.
pub fn is_plain_scalar(value: &str) -> bool {
    let bytes = value.as_bytes();
    match bytes.first() {
        Some(b'"') => plain_string(value).is_some(),
        Some(b'-' | b'0'..=b'9') => is_short_decimal(bytes),
        _ => matches!(value, "true" | "false" | "null"),
    }
}

/// `-?(0|[1-9][0-9]*)(\.[0-9]+)?`, at most 15 characters.
fn is_short_decimal(bytes: &[u8]) -> bool {
    if bytes.len() > 15 {
        return false;
    }
    let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
    let (whole, fraction) = match digits.iter().position(|&b| b == b'.') {
        Some(dot) => (&digits[..dot], Some(&digits[dot + 1..])),
        None => (digits, None),
    };
    let whole_ok = match whole {
        [b'0'] => true,
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    whole_ok && fraction.is_none_or(|f| !f.is_empty() && f.iter().all(u8::is_ascii_digit))
}

/// Whether `byte` is white space between JSON tokens (not form feed, unlike ASCII's).
pub fn is_json_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\n' | b'\r' | b'\t')
}

/// A position in JSON text that is walked, not checked.
struct Walk<'j> {
    text: &'j str,
    at: usize,
}

impl<'j> Walk<'j> {
    fn skip_space(&mut self) {
        let bytes = self.text.as_bytes();
        while bytes.get(self.at).copied().is_some_and(is_json_space) {
            self.at += 1;
        }
    }

    /// The next byte that is not white space, left in place.
    fn peek(&mut self) -> Option<u8> {
        self.skip_space();
        self.text.as_bytes().get(self.at).copied()
    }

    /// The next byte that is not white space, consumed.
    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.at += 1;
        Some(byte)
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.next()? == byte).then_some(())
    }

    /// The string literal starting at the next byte, quotes included, and whether it holds
    /// an escape.
    fn string(&mut self) -> Option<(&'j str, bool)> {
        if self.peek()? != b'"' {
            return None;
        }
        let start = self.at;
        let (end, escaped) = string_end(self.text.as_bytes(), start)?;
        self.at = end;
        Some((self.text.get(start..end)?, escaped))
    }

    /// The value starting at the next byte: a string, an object or array with everything in
    /// it, or a number or literal (up to the next delimiter).
    fn value(&mut self) -> Option<&'j str> {
        let bytes = self.text.as_bytes();
        let start = match self.peek()? {
            b'"' => return self.string().map(|(literal, _)| literal),
            b'{' | b'[' => self.at,
            _ => {
                let start = self.at;
                while !matches!(
                    bytes.get(self.at),
                    None | Some(b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t')
                ) {
                    self.at += 1;
                }
                return (self.at > start).then(|| self.text.get(start..self.at))?;
            }
        };
        let mut depth = 0usize;
        loop {
            match *bytes.get(self.at)? {
                b'"' => {
                    self.at = string_end(bytes, self.at)?.0;
                    continue;
                }
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        self.at += 1;
                        return self.text.get(start..self.at);
                    }
                }
                _ => {}
            }
            self.at += 1;
        }
    }
}

/// The index just past the closing quote of the string literal whose opening quote is at
/// `start`, and whether the literal holds an escape. Eight bytes are looked at a time, and the
/// walk lands straight on the first quote or backslash of a word that holds one: most keys are
/// shorter than a word, so that word is usually the first, and stepping through it a byte at a
/// time would test every byte again.
fn string_end(bytes: &[u8], start: usize) -> Option<(usize, bool)> {
    let mut at = start + 1;
    let mut escaped = false;
    loop {
        while let Some(word) = bytes.get(at..at + 8) {
            let word = u64::from_le_bytes(word.try_into().ok()?);
            let found = bytes_equal_to(word, b'"') | bytes_equal_to(word, b'\\');
            if found != 0 {
                at += (found.trailing_zeros() / 8) as usize;
                break;
            }
            at += 8;
        }
        match *bytes.get(at)? {
            b'"' => return Some((at + 1, escaped)),
            b'\\' => {
                escaped = true;
                at += 2;
            }
            _ => at += 1,
        }
    }
}

/// A one in each byte of a word, and each byte's high bit: the word-at-a-time byte tests.
const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each of the eight bytes of `word` that is `byte` (little-endian byte
/// order). A borrow may also mark a byte after the first match, never one before it: the
/// lowest set bit is always the first match, which is all [`string_end`] reads.
fn bytes_equal_to(word: u64, byte: u8) -> u64 {
    let zero_where_equal = word ^ (ONES * u64::from(byte));
    zero_where_equal.wrapping_sub(ONES) & !zero_where_equal & HIGHS
}

/// The high bit of each byte of `word` below `limit` (at most 128), with the same guarantee as
/// [`bytes_equal_to`]: nonzero exactly when some byte is below it.
fn bytes_below(word: u64, limit: u8) -> u64 {
    word.wrapping_sub(ONES * u64::from(limit)) & !word & HIGHS
}

struct FindIndex {
    index: i64,
}

impl<'de> Visitor<'de> for FindIndex {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items: Vec<&'de RawValue> = Vec::new();
        while let Some(item) = seq.next_element::<&'de RawValue>()? {
            items.push(item);
        }
        let len = items.len() as i64;
        let at = match self.index {
            i if i > 0 => i - 1,
            i if i < 0 => len + i,
            _ => return Ok(None),
        };
        Ok(usize::try_from(at).ok().and_then(|i| items.get(i).copied()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    scalars_find_nothing!();
}

/// The value of a property as HogQL shows it (see [`JsonKind::Property`]).
pub fn property_text(raw: &str) -> Option<Cow<'_, str>> {
    match raw.as_bytes().first()? {
        b'"' => string_literal(raw),
        b'n' => None,
        _ => Some(Cow::Borrowed(raw)),
    }
}

/// A property read as a number (see [`JsonKind::PropertyNumber`]).
pub fn property_number(raw: &str) -> Option<f64> {
    match raw.as_bytes().first()? {
        b'"' => string_literal(raw)?
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite()),
        b't' => Some(1.0),
        b'f' => Some(0.0),
        b'n' | b'{' | b'[' => None,
        _ => raw.parse::<f64>().ok(),
    }
}

/// Texts for tests of readers of unchecked JSON: `text` itself and, where `at` falls on a
/// character boundary, `text` cut there and `text` with `noise` inserted there.
#[cfg(any(test, feature = "test-support"))]
pub fn damaged_variants(text: &str, at: usize, noise: char) -> Vec<String> {
    let mut variants = vec![text.to_string()];
    if let Some(head) = text.get(..at) {
        variants.push(head.to_string());
        let mut changed = text.to_string();
        changed.insert(at, noise);
        variants.push(changed);
    }
    variants
}

/// JSON value texts for tests of readers of unchecked JSON: what a parse takes as it stands,
/// what needs a parse to tell (escapes, surrogate pairs, long and signed numbers, nested
/// brackets inside strings), and what a parse refuses (lone surrogates, control characters,
/// bad escapes, numbers out of range or malformed, broken literals and brackets).
#[cfg(any(test, feature = "test-support"))]
pub const TRICKY_JSON_VALUES: [&str; 22] = [
    r#""Chrome""#,
    r#""x\"y\\z\u00e9""#,
    r#""é\u00e9\n\"""#,
    r#""\ud83d\ude00""#,
    r#""\ud800""#,
    "\"a\u{1}b\"",
    "\"\u{1f}\"",
    r#""\x""#,
    "12.5",
    "-0",
    "01",
    "1.",
    "1e400",
    "-1e-400",
    "123456789012345678901234567890",
    "true",
    "null",
    "tru",
    r#"[1,{"a":"}"},[]]"#,
    r#"{"plan":"pro","n":[true,false]}"#,
    "[1,]",
    "{]",
];

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(k: &str) -> PathStep<'_> {
        PathStep::Key(Cow::Borrowed(k))
    }

    #[test]
    fn finds_nested_keys_and_indexes() {
        let json = r#"{"a": {"b": [10, 20, {"c": "x"}]}, "$browser": "Chrome", "n": null}"#;
        assert_eq!(json_path(json, &[key("$browser")]), Some(r#""Chrome""#));
        assert_eq!(
            json_path(json, &[key("a"), key("b"), PathStep::Index(1)]),
            Some("10")
        );
        assert_eq!(
            json_path(json, &[key("a"), key("b"), PathStep::Index(-1), key("c")]),
            Some(r#""x""#)
        );
        assert_eq!(json_path(json, &[key("missing")]), None);
        assert_eq!(json_path(json, &[key("$browser"), key("deeper")]), None);
        assert_eq!(json_path("not json", &[key("a")]), None);
        assert_eq!(json_path(json, &[key("n")]), Some("null"));
    }

    #[test]
    fn escaped_keys_match() {
        let json = r#"{"we\"ird": 1, "caf\u00e9": 2}"#;
        assert_eq!(json_path(json, &[key("we\"ird")]), Some("1"));
        assert_eq!(json_path(json, &[key("café")]), Some("2"));
    }

    #[test]
    fn one_pass_extraction_finds_what_json_path_finds() {
        let keys = ["$browser", "a", "nested", "n", "missing", "dup"];
        for json in [
            r#"{"$browser":"Chrome","a":1,"nested":{"a":2},"n":null,"dup":1,"dup":2}"#,
            r#"{"a":"x\"y","$browser":["Safari"],"esc\u0061pe":true}"#,
            r#"{"\u0061":"escaped key","a":"plain"}"#,
            r#"{}"#,
            r#"[{"a":1}]"#,
            r#""a""#,
            "12",
            r#"{"a":1,"#,
            r#"{"a":1} trailing"#,
            "",
        ] {
            let expected: Vec<Option<&str>> = keys
                .iter()
                .map(|k| json_path(json, &[PathStep::Key(Cow::Borrowed(k))]))
                .collect();
            assert_eq!(top_level_values(json, &keys), expected, "{json}");
        }
        assert_eq!(
            top_level_values(r#"{"dup":1,"dup":2}"#, &["dup"]),
            vec![Some("1")]
        );
    }

    #[test]
    fn the_walk_over_checked_text_finds_what_the_checked_scan_finds() {
        let keys = [
            "$browser", "a", "nested", "n", "missing", "dup", "we\"ird", "é",
        ];
        let mut texts: Vec<String> = [
            r#"{"$browser":"Chrome","a":1,"nested":{"a":2},"n":null,"dup":1,"dup":2}"#,
            r#"{"a":"x\"y\\","$browser":["Safari",{"a":"]}"}],"esc\u0061pe":true}"#,
            r#"{"\u0061":"escaped key","a":"plain","we\"ird":-1.5e3,"caf\u00e9":0}"#,
            r#" { "a" : [ ] , "nested" : { } , "n" : false , "\u00e9" : "\ud83d\ude00" } "#,
            "{\n\t\"a\":\r\n1\n}",
            r#"{}"#,
            r#"{"a":"\\"}"#,
        ]
        .iter()
        .map(|t| t.to_string())
        .collect();
        // Objects made of every kind of value, nested and escaped, in many orders.
        let values = [
            r#""s""#,
            r#""q\"\\\/\b""#,
            "12",
            "-0.5e-7",
            "true",
            "null",
            "[]",
            r#"[1,"]",{}]"#,
            r#"{"a":{"b":[{"c":"}"}]}}"#,
            r#""\u00e9\u0000""#,
            // Longer than the byte loop's reach, with escapes before and after it.
            r#""https://shop.example.com/products/12?ref=\"news\"&q=\\x\u00e9""#,
            r#""0123456789012345678901234567890\"{}[]""#,
        ];
        for i in 0..200usize {
            let members: Vec<String> = (0..(i % 7))
                .map(|j| {
                    let key = keys[(i * 3 + j * 5) % keys.len()];
                    let key = serde_json::to_string(key).expect("a key is text");
                    format!("{key}:{}", values[(i + j * 7) % values.len()])
                })
                .collect();
            texts.push(format!(
                "{{{}}}",
                members.join(if i % 2 == 0 { "," } else { " , " })
            ));
        }
        let mut found = vec![Some("stale"); keys.len()];
        for text in &texts {
            assert!(
                serde_json::from_str::<serde_json::Value>(text).is_ok(),
                "{text}"
            );
            WantedKeys::new(&keys).values_of_checked(text, &mut found);
            assert_eq!(found, top_level_values(text, &keys), "{text}");
        }
    }

    /// Text drawn from a small alphabet of the bytes the walk treats apart (quotes,
    /// backslashes, brackets, multi-byte characters), so strings end, escape and nest at every
    /// offset within a word.
    fn tricky_text() -> impl proptest::strategy::Strategy<Value = String> {
        proptest::collection::vec(
            proptest::sample::select(vec![
                'a', 'b', '"', '\\', '{', '}', '[', ']', ',', ':', 'é', ' ',
            ]),
            0..20,
        )
        .prop_map(|chars| chars.into_iter().collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The walk over checked text, its word-at-a-time string ends and its table of wanted
        /// keys find exactly what serde's scan finds, for up to 24 wanted keys (given twice,
        /// sharing lengths and first words, or absent) over objects of strings, numbers and
        /// nested values.
        #[test]
        fn the_walk_finds_what_serde_finds(
            members in proptest::collection::vec((tricky_text(), tricky_text(), 0u8..4), 0..24),
            extra in proptest::collection::vec(tricky_text(), 0..8),
            pick in proptest::collection::vec(any::<proptest::sample::Index>(), 0..16),
            pretty in any::<bool>(),
        ) {
            let mut object = serde_json::Map::new();
            for (key, text, kind) in &members {
                let value = match kind {
                    0 => serde_json::Value::String(text.clone()),
                    1 => serde_json::json!(text.len() as f64 / 3.0),
                    2 => serde_json::json!([text, {"k": text}]),
                    _ => serde_json::json!({ text.as_str(): [text.len()] }),
                };
                object.insert(key.clone(), value);
            }
            let text = if pretty {
                serde_json::to_string_pretty(&object)
            } else {
                serde_json::to_string(&object)
            }
            .expect("a map is text");
            let mut keys: Vec<&str> = pick
                .iter()
                .filter(|_| !members.is_empty())
                .map(|i| members[i.index(members.len())].0.as_str())
                .collect();
            keys.extend(extra.iter().map(String::as_str));
            let mut found = vec![Some("stale"); keys.len()];
            WantedKeys::new(&keys).values_of_checked(&text, &mut found);
            prop_assert_eq!(found, top_level_values(&text, &keys));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// The word-at-a-time test for a literal that needs parsing agrees with a byte loop,
        /// wherever the quote, backslash or control byte falls.
        #[test]
        fn needs_parsing_agrees_with_a_byte_loop(
            bytes in proptest::collection::vec(
                prop_oneof![1 => Just(b'"'), 1 => Just(b'\\'), 1 => 0u8..0x20, 60 => 0x20u8..=0xff],
                0..40,
            ),
        ) {
            let expected = bytes.iter().any(|&b| b == b'"' || b == b'\\' || b < 0x20);
            prop_assert_eq!(needs_parsing(&bytes), expected);
        }
    }

    /// An object's members as a parse reads them: each key (unescaped) and value text, in
    /// order, repeats kept.
    fn parsed_members(text: &str) -> Option<Vec<(String, String)>> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = Vec<(String, String)>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    let value: &RawValue = map.next_value()?;
                    members.push((key, value.get().to_string()));
                }
                Ok(members)
            }
        }
        let mut stream = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
        stream.next()?.ok()?;
        let end = stream.byte_offset();
        let mut de = serde_json::Deserializer::from_str(text.get(..end)?);
        serde::Deserializer::deserialize_map(&mut de, Members).ok()
    }

    fn json_piece() -> impl Strategy<Value = String> {
        prop_oneof![
            1 => "[a-z$]{0,12}".prop_map(|s| format!("\"{s}\"")),
            3 => proptest::sample::select(TRICKY_JSON_VALUES.to_vec()).prop_map(String::from),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// The walk over unchecked text takes a value as checked only when a parse takes it,
        /// finds the members a parse finds, and takes no object a parse refuses when every
        /// value it left is taken by a parse on its own.
        #[test]
        fn the_scalar_checking_walk_agrees_with_a_parse(
            members in proptest::collection::vec((json_piece(), json_piece()), 0..6),
            space in prop_oneof![Just(""), Just(" "), Just("\n\t"), Just("\u{c}")],
            tail in prop_oneof![Just(""), Just(","), Just(" ]")],
            cut in any::<proptest::sample::Index>(),
            noise in proptest::sample::select(vec!['"', '\\', '{', '}', ',', ':', ' ', '\u{1}', 'é']),
        ) {
            let body = members
                .iter()
                .map(|(k, v)| format!("{k}{space}:{space}{v}"))
                .collect::<Vec<_>>()
                .join(",");
            let object = format!("{{{space}{body}{space}}}{tail}");
            for text in damaged_variants(&object, cut.index(object.len() + 1), noise) {
                let mut walked = Vec::new();
                let mut others_parse = true;
                let end = members_with_scalars_checked(&text, |key, value, plain| {
                    if plain {
                        assert_eq!(
                            checked_scalar_value(value),
                            serde_json::from_str::<serde_json::Value>(value).ok(),
                            "{value}"
                        );
                    } else {
                        others_parse &= serde_json::from_str::<serde_json::Value>(value).is_ok();
                    }
                    walked.push((key.into_owned(), value.to_string()));
                    Some(())
                });
                if let (Some(end), true) = (end, others_parse) {
                    let parsed = parsed_members(&text);
                    prop_assert_eq!(Some(&walked), parsed.as_ref(), "{}", text);
                    prop_assert!(text[..end].ends_with('}'), "{}", text);
                }
            }
        }
    }

    #[test]
    fn values_parse_as_serde_parses_them() {
        for text in [
            r#""plain""#,
            r#""""#,
            r#""a\"b""#,
            r#""\u00e9""#,
            "\"a\u{1}b\"",
            r#""\ud800""#,
            "12.5",
            "1e400",
            r#"{"a":[1,null]}"#,
            "tru",
            r#""open"#,
            "true",
            "false",
            "null",
            "0",
            "-0",
            "-7",
            "42",
            "-123456789012345",
            "123456789012345",
            "1234567890123456789",
            "00",
            "-",
            "+1",
        ] {
            assert_eq!(
                parse_value(text),
                serde_json::from_str::<Value>(text).ok(),
                "{text}"
            );
        }
    }

    proptest! {
        /// Number texts, well-formed or not, read as `serde_json` reads them.
        #[test]
        fn numbers_parse_as_serde_parses_them(text in "-?[0-9]{0,18}(\\.[0-9]{0,3})?(e[0-9])?") {
            prop_assert_eq!(parse_value(&text), serde_json::from_str::<Value>(&text).ok());
        }

        /// A string literal written by the copying path is what `serde_json` writes.
        #[test]
        fn string_literals_are_written_as_serde_writes_them(
            text in "[a-z\"\\\\\u{0}-\u{1f}\u{7f}é😀 ]{0,40}",
        ) {
            let mut out = b"x".to_vec();
            write_string_literal(&mut out, &text);
            let expected = format!("x{}", serde_json::to_string(&text).expect("a string"));
            prop_assert_eq!(String::from_utf8(out).expect("UTF-8"), expected);
        }
    }

    #[test]
    fn wanted_keys_are_told_apart_from_keys_of_the_same_length_and_first_word() {
        let keys = ["$current_url", "$browser", "$session_id"];
        let wanted = WantedKeys::new(&keys);
        let mut found = vec![None; keys.len()];
        for (text, expected) in [
            (
                r#"{"$current_urx":1,"$browser_version":2,"$browsex":3,"$current_url":"u"}"#,
                [Some(r#""u""#), None, None],
            ),
            // An escaped key after the wanted ones: the member walk decides, first one wins.
            (
                r#"{"$browser":"a","$browser":"b","$session_id":"s"}"#,
                [None, Some(r#""a""#), Some(r#""s""#)],
            ),
            (
                r#"{"$browser":"b","$browser":"a"}"#,
                [None, Some(r#""b""#), None],
            ),
        ] {
            wanted.values_of_checked(text, &mut found);
            assert_eq!(found, expected.to_vec(), "{text}");
            assert_eq!(found, top_level_values(text, &keys), "{text}");
        }
    }

    #[test]
    fn the_walk_over_checked_text_finds_nothing_in_what_is_not_an_object() {
        let keys = ["a"];
        let mut found = vec![None; 1];
        for text in [
            "",
            "[1]",
            r#""a""#,
            "12",
            "{",
            r#"{"a""#,
            r#"{"a":"#,
            r#"{"a":1"#,
            r#"{"a":1,"#,
            r#"{"a":"unterminated}"#,
            r#"{"a":1 "b":2}"#,
            r#"{a:1}"#,
            r#"{"a":{"b":1}"#,
            r#"{"a":"x\"#,
            "{\"a\":[[[[",
            r#"{"\ud800":1}"#,
        ] {
            WantedKeys::new(&keys).values_of_checked(text, &mut found);
            assert_eq!(found, vec![None], "{text}");
        }
    }

    #[test]
    fn a_member_reader_takes_its_value_and_the_walk_goes_on_after_it() {
        let text = r#"{"a": {"x":"}"} ,"b":[1,"]"],"c":3}"#;
        let mut seen = Vec::new();
        let end = members_read_by(text, |key, rest| {
            let len = value_len_checked(rest)?;
            seen.push((key.into_owned(), &rest[..len]));
            Some(len)
        });
        assert_eq!(end, Some(text.len()));
        let expected = [("a", r#"{"x":"}"}"#), ("b", r#"[1,"]"]"#), ("c", "3")];
        assert_eq!(
            seen,
            expected.map(|(k, v)| (k.to_string(), v)).to_vec(),
            "{text}"
        );
        // A length that leaves the walk between members, or past the end, stops it.
        for len in [1, 10, 1000, usize::MAX] {
            assert_eq!(members_read_by(text, |_, _| Some(len)), None, "{len}");
        }
    }

    #[test]
    fn plain_scalars_are_taken_as_they_are() {
        for plain in [
            r#""x""#,
            r#""""#,
            "0",
            "-0",
            "12",
            "-3.25",
            "123456789012345",
            "true",
            "false",
            "null",
        ] {
            assert!(is_plain_scalar(plain), "{plain}");
            assert!(
                serde_json::from_str::<serde_json::Value>(plain).is_ok(),
                "{plain}"
            );
        }
        for other in [
            r#""a\"b""#,
            "1e3",
            "1234567890123456",
            "01",
            "1.",
            "-",
            "tru",
            "[]",
            "{}",
            "\"\t\"",
        ] {
            assert!(!is_plain_scalar(other), "{other}");
        }
    }

    #[test]
    fn property_text_and_numbers_follow_hogql() {
        assert_eq!(property_text(r#""a\"b""#).as_deref(), Some("a\"b"));
        assert!(matches!(
            property_text(r#""plain é""#),
            Some(Cow::Borrowed("plain é"))
        ));
        assert_eq!(property_text(r#""\u00e9\t""#).as_deref(), Some("é\t"));
        assert_eq!(property_text(r#""""#).as_deref(), Some(""));
        // Not a string literal: no text, however it starts.
        assert_eq!(property_text(r#""a"b""#), None);
        assert_eq!(property_text("\"tab\there\""), None);
        assert_eq!(property_text("12.5").as_deref(), Some("12.5"));
        assert_eq!(property_text("true").as_deref(), Some("true"));
        assert_eq!(property_text("null"), None);
        assert_eq!(property_number(r#"" 42 ""#), Some(42.0));
        assert_eq!(property_number("1e3"), Some(1000.0));
        assert_eq!(property_number(r#""abc""#), None);
        assert_eq!(property_number("[1]"), None);
    }
}
