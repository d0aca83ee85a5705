//! PKCE (RFC 7636), S256 only: `plain` would let a stolen code be redeemed by anyone who saw
//! the authorization request.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// RFC 7636 §4.1: 43–128 characters of `A-Z a-z 0-9 - . _ ~`.
pub fn verifier_well_formed(verifier: &str) -> bool {
    (43..=128).contains(&verifier.len())
        && verifier
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
}

/// An S256 challenge is always 43 base64url characters.
pub fn challenge_well_formed(challenge: &str) -> bool {
    challenge.len() == 43
        && challenge
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
}

/// `BASE64URL(SHA256(verifier))` without padding.
pub fn s256(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// Whether `verifier` answers `challenge`, compared in constant time.
pub fn verify(verifier: &str, challenge: &str) -> bool {
    s256(verifier).as_bytes().ct_eq(challenge.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc7636_appendix_b_vector() {
        let verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
        let challenge = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";
        assert_eq!(s256(verifier), challenge);
        assert!(verify(verifier, challenge));
        assert!(!verify(
            "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXx",
            challenge
        ));
        assert!(verifier_well_formed(verifier));
        assert!(challenge_well_formed(challenge));
    }

    #[test]
    fn verifier_shape_is_enforced() {
        assert!(!verifier_well_formed(&"a".repeat(42)));
        assert!(verifier_well_formed(&"a".repeat(128)));
        assert!(!verifier_well_formed(&"a".repeat(129)));
        assert!(!verifier_well_formed(&format!("{}+", "a".repeat(43))));
    }
}
