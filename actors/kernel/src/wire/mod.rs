//! The public routes' wire decoding: the bytes an SDK sends → JSON text.
//!
//! Capture and `/flags` receive the same encodings from the same SDKs, so they share this one
//! decoder (PostHog's capture pipeline in `PostHog/posthog:rust/capture`, whose decoding the
//! `/flags` service shares, `rust/feature-flags/src/handler/decoding.rs`): the payload is the query's `data` or the body;
//! optimistic base64; form decoding (`data=…`, `+` restored inside base64); the compression hint
//! (query → form → `Content-Encoding`); gzip (also by its magic bytes), LZ-string or base64
//! (percent-encoded or unpadded base64 accepted) under the decompressed limit; then a second
//! base64 pass when the text is still strict base64.
//!
//! Every step checks the limit while it produces output and stops at the first byte past it:
//! gzip inflates into a bounded buffer (and only counts past [`GZIP_KEEP`]), LZ-string is
//! measured before it is written ([`lz64`]), base64 that yields the final text is measured from
//! its length before it is decoded, and form and base64 decoding never produce more than they
//! read (the body's own limit bounds them).
//!
//! Pure: no I/O and no clock, so it is property-tested.

pub mod lz64;

use std::io::Read;

use base64::Engine;

/// What the decoder reads from one request.
#[derive(Debug, Clone, Copy, Default)]
pub struct WireInput<'a> {
    pub body: &'a [u8],
    /// The `data` query parameter (GET requests carry the payload there).
    pub query_data: Option<&'a str>,
    /// The `compression` query parameter.
    pub query_compression: Option<&'a str>,
    pub content_type: Option<&'a str>,
    pub content_encoding: Option<&'a str>,
}

/// Why a payload could not be turned into text.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WireError {
    #[error("request missing data payload")]
    EmptyPayload,
    #[error("failed to decode request: expected form data (data=…) in a form-encoded payload")]
    InvalidForm,
    #[error("failed to decode request: invalid base64 data")]
    InvalidBase64,
    #[error("failed to decode request: invalid gzip data: {0}")]
    InvalidGzip(String),
    #[error("failed to decode request: invalid lz64 (LZ-string base64) data")]
    InvalidLz64,
    #[error("failed to decode request: payload is not valid UTF-8")]
    NotUtf8,
    #[error(
        "maximum event size exceeded: the decompressed payload is over the limit of {limit} bytes"
    )]
    TooLarge { limit: usize },
}

/// Form fields that mark a body as form-encoded even without a form content type.
const FORM_PREFIXES: [&[u8]; 5] = [b"data=", b"ver=", b"_=", b"ip=", b"compression="];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compression {
    Gzip,
    Lz64,
    Base64,
}

fn parse_hint(value: &str) -> Option<Compression> {
    match value.trim().to_ascii_lowercase().as_str() {
        "gzip" | "gzip-js" => Some(Compression::Gzip),
        "lz64" | "lz-string" => Some(Compression::Lz64),
        "base64" | "b64" => Some(Compression::Base64),
        _ => None,
    }
}

/// Decodes a payload to UTF-8 text (normally JSON) of at most `max_decompressed` bytes.
pub fn decode_text(input: WireInput<'_>, max_decompressed: usize) -> Result<String, WireError> {
    let mut bytes: Vec<u8> = match input.query_data {
        Some(data) if !data.is_empty() => data.as_bytes().to_vec(),
        _ => input.body.to_vec(),
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(WireError::EmptyPayload);
    }
    let query_hint = input
        .query_compression
        .filter(|c| !c.trim().is_empty())
        .and_then(parse_hint);
    let is_form_like = FORM_PREFIXES.iter().any(|p| bytes.starts_with(p));
    // LZ-string output is itself base64 text: an explicit lz64 hint must keep it intact.
    let lz64_hinted = query_hint == Some(Compression::Lz64)
        || input.content_encoding.and_then(parse_hint) == Some(Compression::Lz64);
    if !is_form_like && !lz64_hinted {
        if let Some(decoded) = optimistic_base64(&bytes) {
            bytes = decoded;
        }
    }
    let mut form_hint = None;
    let is_form_content = input
        .content_type
        .and_then(|ct| ct.split(';').next())
        .is_some_and(|ct| {
            ct.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        });
    let from_query = input.query_data.is_some_and(|d| !d.is_empty());
    // A JSON body under a form content type (e.g. `curl -d '{…}'`) is read as JSON. Form fields
    // without a form content type (a beacon's Blob may lose it) are read as a form too.
    if (is_form_content || is_form_like) && !from_query && !looks_like_json(&bytes) {
        if !is_form_like {
            return Err(WireError::InvalidForm);
        }
        let mut data = None;
        for (k, v) in form_urlencoded_pairs(&bytes) {
            match k.as_str() {
                "data" => data = Some(v),
                "compression" => form_hint = parse_hint(&v),
                _ => {}
            }
        }
        let Some(mut data) = data else {
            return Err(WireError::InvalidForm);
        };
        // URL-decoding turned base64's `+` into spaces; put them back.
        if data.contains(' ') && looks_like_base64(&data.replace(' ', "+").into_bytes()) {
            data = data.replace(' ', "+");
        }
        bytes = data.into_bytes();
    }
    let hint = query_hint.or(form_hint).or_else(|| {
        input.content_encoding.and_then(|ce| match ce {
            "gzip" | "gzip-js" | "lz64" | "lz-string" | "base64" | "b64" => parse_hint(ce),
            _ => None,
        })
    });
    let is_gzip_magic = bytes.starts_with(&[0x1f, 0x8b]);
    let text = if hint == Some(Compression::Gzip) || is_gzip_magic {
        gunzip(&bytes, max_decompressed)?
    } else if hint == Some(Compression::Lz64) {
        lz64(&bytes, max_decompressed)?
    } else {
        if hint == Some(Compression::Base64) && !looks_like_json(&bytes) {
            bytes = lenient_base64(&bytes, max_decompressed)?;
        }
        if bytes.len() > max_decompressed {
            return Err(WireError::TooLarge {
                limit: max_decompressed,
            });
        }
        String::from_utf8(bytes).map_err(|_| WireError::NotUtf8)?
    };
    // PostHog does this second pass on legacy routes only; JSON never looks like strict base64,
    // so doing it everywhere accepts more clients (form `data=<base64>` on /batch) and breaks none.
    if looks_like_base64(text.as_bytes()) {
        if let Ok(inner) = base64::engine::general_purpose::STANDARD.decode(text.trim()) {
            return String::from_utf8(inner).map_err(|_| WireError::NotUtf8);
        }
    }
    Ok(text)
}

fn trim_ascii(bytes: &[u8]) -> &[u8] {
    bytes.trim_ascii()
}

fn looks_like_json(bytes: &[u8]) -> bool {
    matches!(trim_ascii(bytes).first(), Some(b'{') | Some(b'['))
}

fn is_base64_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'='
}

/// Strict base64 shape: alphabet only (checked on the first 128 bytes, as PostHog does) and a
/// length that is a multiple of 4.
fn looks_like_base64(bytes: &[u8]) -> bool {
    let bytes = trim_ascii(bytes);
    !bytes.is_empty() && bytes.len() % 4 == 0 && bytes.iter().take(128).all(|b| is_base64_byte(*b))
}

/// Refuses base64 text whose decoded form is the final text and would be longer than `limit`,
/// before decoding it (three bytes per four characters, less padding).
fn check_base64_len(text: &[u8], limit: usize) -> Result<(), WireError> {
    if text.len() / 4 * 3 > limit.saturating_add(2) {
        return Err(WireError::TooLarge { limit });
    }
    Ok(())
}

/// Base64 that may hold compressed bytes (which may be a little longer than the text they
/// inflate to): it is never longer than its input, and the limit is checked on the final text.
fn optimistic_base64(bytes: &[u8]) -> Option<Vec<u8>> {
    if !looks_like_base64(bytes) {
        return None;
    }
    base64::engine::general_purpose::STANDARD
        .decode(trim_ascii(bytes))
        .ok()
}

/// Base64 as clients really send it under an explicit hint: possibly percent-encoded
/// (`%3D` padding, `%2B`), with whitespace, and without padding.
fn lenient_base64(bytes: &[u8], limit: usize) -> Result<Vec<u8>, WireError> {
    let decoded;
    let bytes = if bytes.contains(&b'%') {
        decoded = percent_decode_keep_plus(bytes);
        &decoded
    } else {
        bytes
    };
    let mut text: Vec<u8> = bytes
        .iter()
        .copied()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    while text.len() % 4 != 0 {
        text.push(b'=');
    }
    check_base64_len(&text, limit)?;
    base64::engine::general_purpose::STANDARD
        .decode(&text)
        .map_err(|_| WireError::InvalidBase64)
}

/// The pairs of a form body. Percent-decoding never makes a value longer than it was, so form
/// decoding is bounded by the body's own limit; the decoded limit is checked on the final text.
fn form_urlencoded_pairs(bytes: &[u8]) -> Vec<(String, String)> {
    bytes
        .split(|b| *b == b'&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let mut it = pair.splitn(2, |b| *b == b'=');
            let k = percent_decode(it.next().unwrap_or_default());
            let v = percent_decode(it.next().unwrap_or_default());
            (k, v)
        })
        .collect()
}

/// application/x-www-form-urlencoded decoding (`+` is a space, `%XX` a byte).
fn percent_decode(input: &[u8]) -> String {
    String::from_utf8_lossy(&unescape(input, true)).into_owned()
}

/// `%XX` decoding that leaves `+` alone (it is a base64 character, not a space).
fn percent_decode_keep_plus(input: &[u8]) -> Vec<u8> {
    unescape(input, false)
}

/// Percent-decoding; the output is never longer than the input.
fn unescape(input: &[u8], plus_is_space: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len());
    let mut rest = input;
    while let Some((&byte, tail)) = rest.split_first() {
        rest = tail;
        match byte {
            b'+' if plus_is_space => out.push(b' '),
            b'%' => {
                let decoded = tail
                    .get(..2)
                    .and_then(|hex| std::str::from_utf8(hex).ok())
                    .and_then(|hex| u8::from_str_radix(hex, 16).ok());
                match decoded {
                    Some(decoded) => {
                        out.push(decoded);
                        rest = tail.get(2..).unwrap_or_default();
                    }
                    None => out.push(b'%'),
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// Inflated bytes kept in memory on the first pass: a stream that inflates past this is only
/// counted from there on, and inflated again into a buffer of its exact size once it is known
/// to fit the limit. A bomb therefore costs at most this much memory, and payloads below it
/// (nearly all) are inflated once.
pub const GZIP_KEEP: usize = 4 << 20;

/// Inflates gzip, stopping at the first byte past `limit` (gzip-bomb safe).
fn gunzip(bytes: &[u8], limit: usize) -> Result<String, WireError> {
    // The trailer's ISIZE is the inflated size of a single-member stream: inflating into a
    // buffer of that size saves the grow-and-copy steps. It is only a hint (the client writes
    // it), so it is capped by a generous ratio of the compressed size and by what is kept.
    let keep = GZIP_KEEP.min(limit);
    let trailer_size = bytes
        .len()
        .checked_sub(4)
        .and_then(|at| bytes.get(at..))
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(|b| u32::from_le_bytes(b) as usize);
    let capacity = trailer_size
        .unwrap_or(0)
        .max(bytes.len().saturating_mul(4))
        .min(bytes.len().saturating_mul(64))
        .min(keep.saturating_add(1));
    let invalid = |e: std::io::Error| WireError::InvalidGzip(e.to_string());
    let mut out = Vec::with_capacity(capacity);
    let mut decoder = flate2::read::MultiGzDecoder::new(bytes);
    (&mut decoder)
        .take(keep as u64 + 1)
        .read_to_end(&mut out)
        .map_err(invalid)?;
    if out.len() > keep {
        // Past what is kept: count the rest, up to the first byte past the limit, without
        // keeping it.
        let room = (limit - keep) as u64;
        let rest = std::io::copy(&mut decoder.take(room), &mut std::io::sink()).map_err(invalid)?;
        if rest >= room {
            return Err(WireError::TooLarge { limit });
        }
        let total = keep as u64 + 1 + rest;
        drop(std::mem::take(&mut out));
        out.reserve_exact(total as usize);
        flate2::read::MultiGzDecoder::new(bytes)
            .take(total)
            .read_to_end(&mut out)
            .map_err(invalid)?;
    }
    String::from_utf8(out).map_err(|_| WireError::NotUtf8)
}

fn lz64(bytes: &[u8], limit: usize) -> Result<String, WireError> {
    let decoded =
        lz64::decompress_from_base64(trim_ascii(bytes), limit).map_err(|err| match err {
            lz64::Lz64Error::Invalid => WireError::InvalidLz64,
            lz64::Lz64Error::TooLarge => WireError::TooLarge { limit },
        })?;
    if decoded.trim().is_empty() {
        return Err(WireError::InvalidLz64);
    }
    Ok(decoded)
}

/// `encodeURIComponent`, as posthog-js applies it to the `data=` of form bodies. For tests
/// that send what the browser SDK sends.
#[cfg(any(test, feature = "test-support"))]
pub fn uri_component(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'!' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use proptest::prelude::*;

    use super::*;

    const LIMIT: usize = 1 << 20;

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(bytes).expect("gzip");
        gz.finish().expect("gzip")
    }

    fn decode(
        body: &[u8],
        compression: Option<&str>,
        ct: Option<&str>,
    ) -> Result<String, WireError> {
        decode_text(
            WireInput {
                body,
                query_compression: compression,
                content_type: ct,
                ..WireInput::default()
            },
            LIMIT,
        )
    }

    const JSON: &str = r#"{"token":"phc_x","distinct_id":"a+b c/d?","n":[1,2]}"#;

    #[test]
    fn every_encoding_the_sdks_send_decodes_to_the_same_text() {
        let form = |payload: &str| format!("data={}", uri_component(payload));
        type Case<'a> = (&'a str, Vec<u8>, Option<&'a str>, Option<&'a str>);
        let cases: Vec<Case> = vec![
            ("plain JSON", JSON.into(), None, Some("application/json")),
            (
                "gzip-js by hint",
                gzip(JSON.as_bytes()),
                Some("gzip-js"),
                Some("text/plain"),
            ),
            (
                "gzip by magic bytes",
                gzip(JSON.as_bytes()),
                None,
                Some("text/plain"),
            ),
            (
                "base64 form (posthog-js)",
                form(&b64(JSON.as_bytes())).into(),
                Some("base64"),
                Some("application/x-www-form-urlencoded"),
            ),
            (
                "base64 form with + as a space",
                format!("data={}", b64(JSON.as_bytes()))
                    .replace('+', " ")
                    .into(),
                Some("base64"),
                Some("application/x-www-form-urlencoded"),
            ),
            (
                "percent-encoded base64 without a form",
                uri_component(&b64(JSON.as_bytes())).into(),
                Some("base64"),
                None,
            ),
            (
                "unpadded base64",
                b64(JSON.as_bytes()).trim_end_matches('=').into(),
                Some("base64"),
                None,
            ),
            (
                "lz64 form",
                form(&lz_str::compress_to_base64(JSON)).into(),
                Some("lz64"),
                Some("application/x-www-form-urlencoded"),
            ),
            (
                "lz64 body",
                lz_str::compress_to_base64(JSON).into(),
                Some("lz64"),
                None,
            ),
            (
                "beacon form without content type",
                form(&b64(JSON.as_bytes())).into(),
                Some("base64"),
                None,
            ),
            (
                "JSON under a form content type",
                JSON.into(),
                None,
                Some("application/x-www-form-urlencoded"),
            ),
        ];
        for (what, body, compression, ct) in cases {
            let got = decode(&body, compression, ct).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(got, JSON, "{what}");
        }
    }

    #[test]
    fn the_query_data_parameter_wins_over_the_body() {
        let data = b64(JSON.as_bytes());
        let got = decode_text(
            WireInput {
                body: b"ignored",
                query_data: Some(&data),
                ..WireInput::default()
            },
            LIMIT,
        )
        .expect("data param");
        assert_eq!(got, JSON);
    }

    #[test]
    fn bad_payloads_name_their_problem() {
        assert_eq!(decode(b"  ", None, None), Err(WireError::EmptyPayload));
        assert!(matches!(
            decode(b"\x1f\x8b\x08junk", None, None),
            Err(WireError::InvalidGzip(_))
        ));
        assert_eq!(
            decode(b"!!!!", Some("base64"), None),
            Err(WireError::InvalidBase64)
        );
        assert_eq!(
            decode(b"%%%%", Some("lz64"), None),
            Err(WireError::InvalidLz64)
        );
        assert_eq!(
            decode(b"plain", None, Some("application/x-www-form-urlencoded")),
            Err(WireError::InvalidForm)
        );
        assert_eq!(decode(b"\xff\xfe", None, None), Err(WireError::NotUtf8));
        let big = gzip(&vec![b'x'; 4096]);
        assert_eq!(
            decode_text(
                WireInput {
                    body: &big,
                    ..WireInput::default()
                },
                1024
            ),
            Err(WireError::TooLarge { limit: 1024 })
        );
    }

    #[test]
    fn gzip_past_what_is_kept_is_measured_then_inflated_once_more() {
        let json = format!("{{\"pad\":\"{}\"}}", "x".repeat(GZIP_KEEP + 1000));
        let body = gzip(json.as_bytes());
        let decode = |limit| {
            decode_text(
                WireInput {
                    body: &body,
                    ..WireInput::default()
                },
                limit,
            )
        };
        assert_eq!(
            decode(json.len()).as_deref(),
            Ok(json.as_str()),
            "fits exactly"
        );
        assert_eq!(
            decode(json.len() - 1),
            Err(WireError::TooLarge {
                limit: json.len() - 1
            })
        );
        assert_eq!(
            decode(GZIP_KEEP),
            Err(WireError::TooLarge { limit: GZIP_KEEP })
        );
    }

    #[test]
    fn base64_and_form_payloads_are_held_to_the_limit() {
        let json = format!("{{\"pad\":\"{}\"}}", "y".repeat(3000));
        let encoded = b64(json.as_bytes());
        let form = format!("data={}", uri_component(&encoded));
        for (what, body, hint, ct) in [
            ("base64", encoded.as_bytes(), Some("base64"), None),
            (
                "form",
                form.as_bytes(),
                Some("base64"),
                Some("application/x-www-form-urlencoded"),
            ),
            ("plain", json.as_bytes(), None, None),
        ] {
            let decode = |limit| {
                decode_text(
                    WireInput {
                        body,
                        query_compression: hint,
                        content_type: ct,
                        ..WireInput::default()
                    },
                    limit,
                )
            };
            assert_eq!(decode(json.len()).as_deref(), Ok(json.as_str()), "{what}");
            assert_eq!(
                decode(1000),
                Err(WireError::TooLarge { limit: 1000 }),
                "{what}"
            );
        }
    }

    proptest! {
        #[test]
        fn any_text_survives_each_encoding(text in "\\PC{1,200}") {
            let json = serde_json::to_string(&serde_json::json!({"t": text})).expect("json");
            let form = format!("data={}", uri_component(&b64(json.as_bytes())));
            prop_assert_eq!(decode(form.as_bytes(), Some("base64"), Some("application/x-www-form-urlencoded")).expect("form"), json.clone());
            prop_assert_eq!(decode(&gzip(json.as_bytes()), None, None).expect("gzip"), json.clone());
            let lz = lz_str::compress_to_base64(json.as_str());
            prop_assert_eq!(decode(lz.as_bytes(), Some("lz64"), None).expect("lz64"), json);
        }

        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..300),
                                       hint in proptest::option::of("(gzip|base64|lz64|b64|x)")) {
            let _ = decode(&body, hint.as_deref(), Some("application/x-www-form-urlencoded"));
            let _ = decode(&body, hint.as_deref(), None);
        }
    }
}
