//! Bucketing hashes, bit-for-bit as PostHog's server and SDKs compute them
//! (`PostHog/posthog:rust/feature-flags/src/flags/flag_matching_utils.rs`, `calculate_hash`): SHA-1 of `prefix + identifier + salt`, first 15 hex
//! digits (60 bits) as an integer, divided by `0xFFFFFFFFFFFFFFF` in f64.

use sha1::digest::generic_array::GenericArray;
use sha1::{Digest, Sha1};

/// 2^60 − 1: the largest 15-hex-digit value.
const LONG_SCALE: f64 = 0xFFF_FFFF_FFFF_FFFF_u64 as f64;

/// `hash(prefix, identifier, salt)` in `[0, 1]`. An empty identifier hashes to 0 without
/// hashing, as the server does.
pub fn calculate_hash(prefix: &str, identifier: &str, salt: &str) -> f64 {
    if identifier.is_empty() {
        return 0.0;
    }
    hash_parts(&[prefix, identifier, salt])
}

/// The hash of the concatenation of `parts` (no intermediate string is built).
fn hash_parts(parts: &[&str]) -> f64 {
    (first_8_bytes(parts) >> 4) as f64 / LONG_SCALE
}

/// SHA-1's initial state (FIPS 180-4, 5.3.1).
const SHA1_INIT: [u32; 5] = [
    0x6745_2301,
    0xEFCD_AB89,
    0x98BA_DCFE,
    0x1032_5476,
    0xC3D2_E1F0,
];

/// Blocks a short message is padded into on the stack.
const SHORT_BLOCKS: usize = 3;

/// The first 8 bytes of SHA-1 over the concatenation of `parts`, big-endian. A message that
/// fits three blocks with its padding (flag key and id nearly always do) is joined and padded
/// on the stack and compressed block by block: the general hasher's buffering and
/// finalization cost as much as the compression itself, with one hash per flag and request.
fn first_8_bytes(parts: &[&str]) -> u64 {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    // The padding: one 0x80 byte, then zeros up to the last 8 bytes, which hold the
    // message's length in bits (FIPS 180-4, 5.1.1).
    let blocks = total.saturating_add(9).div_ceil(64);
    if blocks > SHORT_BLOCKS {
        let mut hasher = Sha1::new();
        for part in parts {
            hasher.update(part.as_bytes());
        }
        let digest = hasher.finalize();
        let mut first8 = [0u8; 8];
        first8.copy_from_slice(&digest[..8]);
        return u64::from_be_bytes(first8);
    }
    // In bounds: `total + 9 <= blocks * 64 <= message.len()`, so the parts, the 0x80 byte and
    // the length all fit, and `end >= 64`.
    let mut message = [0u8; SHORT_BLOCKS * 64];
    let mut len = 0;
    for part in parts {
        message[len..len + part.len()].copy_from_slice(part.as_bytes());
        len += part.len();
    }
    message[len] = 0x80;
    let end = blocks * 64;
    message[end - 8..end].copy_from_slice(&((total as u64) * 8).to_be_bytes());
    let mut state = SHA1_INIT;
    for block in message[..end].chunks_exact(64) {
        sha1::compress(&mut state, &[*GenericArray::from_slice(block)]);
    }
    (u64::from(state[0]) << 32) | u64::from(state[1])
}

/// Rollout bucket of `identifier` for flag `key`: `hash("<key>.", identifier, "")`.
pub fn rollout_hash(key: &str, identifier: &str) -> f64 {
    if identifier.is_empty() {
        return 0.0;
    }
    hash_parts(&[key, ".", identifier])
}

/// Variant bucket of `identifier` for flag `key`: `hash("<key>.", identifier, "variant")`.
pub fn variant_hash(key: &str, identifier: &str) -> f64 {
    if identifier.is_empty() {
        return 0.0;
    }
    hash_parts(&[key, ".", identifier, "variant"])
}

/// Holdout bucket: independent of the flag, so a user's holdout is the same across flags.
pub fn holdout_hash(identifier: &str) -> f64 {
    calculate_hash("holdout-", identifier, "")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Published in PostHog's `test_calculate_hash` (flag_matching_utils.rs) and the Django
    // `TestFeatureFlagCohortExpansion.test_calculate_hash`.
    #[test]
    fn short_and_long_inputs_hash_their_concatenation() {
        // Every length around the one-, two- and three-block boundaries and past them.
        for n in (0..=200).chain([400, 1000]) {
            let id = "d".repeat(n);
            let digest = Sha1::digest(format!("flag.{id}").as_bytes());
            let first8 = u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"));
            assert_eq!(
                first_8_bytes(&["flag", ".", &id]),
                first8,
                "length {}",
                n + 5
            );
            if !id.is_empty() {
                assert_eq!(rollout_hash("flag", &id), (first8 >> 4) as f64 / LONG_SCALE);
            }
        }
    }

    #[test]
    fn published_vectors() {
        for (id, expected) in [
            ("some_distinct_id", 0.7270002403585725),
            ("test-identifier", 0.4493881716040236),
            ("example_id", 0.9402003475831224),
            ("example_id2", 0.6292740389966519),
        ] {
            assert_eq!(holdout_hash(id), expected, "{id}");
        }
        assert_eq!(
            rollout_hash("simple-flag", "distinct_id_0"),
            0.7836963764220432
        );
        assert_eq!(
            rollout_hash("simple-flag", "distinct_id_1"),
            0.3397069926995401
        );
        assert_eq!(
            rollout_hash("beta-feature", "some-distinct-id"),
            0.3435078163984861
        );
        assert_eq!(
            variant_hash("beta-feature", "some-distinct-id"),
            0.9150298250696574
        );
        assert_eq!(
            rollout_hash("multivariate-flag", "distinct_id_0"),
            0.502037796130735
        );
        assert_eq!(
            variant_hash("multivariate-flag", "distinct_id_0"),
            0.6186454537930379
        );
        assert_eq!(rollout_hash("group-flag", "acme-inc"), 0.4429764195865406);
        assert_eq!(variant_hash("group-flag", "acme-inc"), 0.5736987109237227);
        let enabled: Vec<usize> = (0..20)
            .filter(|i| rollout_hash("my-flag", &format!("user_{i}")) <= 0.5)
            .collect();
        assert_eq!(enabled, vec![3, 5, 6, 10, 11, 12, 17, 19]);
    }

    // Vector 7: posthog-python's consistency suite, 45 % rollout over distinct_id_0..999.
    #[test]
    fn python_sdk_consistency_suite() {
        let enabled: Vec<usize> = (0..30)
            .filter(|i| rollout_hash("simple-flag", &format!("distinct_id_{i}")) <= 0.45)
            .collect();
        assert_eq!(
            enabled,
            vec![1, 2, 4, 7, 9, 11, 12, 14, 18, 19, 21, 24, 26, 27]
        );
        let total = (0..1000)
            .filter(|i| rollout_hash("simple-flag", &format!("distinct_id_{i}")) <= 0.45)
            .count();
        assert_eq!(total, 446);
    }

    #[test]
    fn empty_identifier_is_zero() {
        assert_eq!(rollout_hash("any", ""), 0.0);
    }

    proptest! {
        #[test]
        fn hashes_are_in_unit_range_and_deterministic(key in ".{0,20}", id in ".{1,40}") {
            let a = rollout_hash(&key, &id);
            prop_assert!((0.0..=1.0).contains(&a));
            prop_assert_eq!(a, rollout_hash(&key, &id));
            let v = variant_hash(&key, &id);
            prop_assert!((0.0..=1.0).contains(&v));
        }

        #[test]
        fn the_short_path_is_sha1(parts in proptest::collection::vec(".{0,70}", 0..4)) {
            let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
            let digest = Sha1::digest(parts.concat().as_bytes());
            let first8 = u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"));
            prop_assert_eq!(first_8_bytes(&parts), first8);
        }
    }
}
