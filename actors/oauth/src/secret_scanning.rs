//! Secret-scanning reports from a public code host (GitHub's partner format): a JSON list of
//! `{token, type, url, source}`, signed with ECDSA P-256 / SHA-256. The signature (base64 DER)
//! arrives in a header beside the identifier of the key that made it; keys are configured as
//! PEM `SubjectPublicKeyInfo`.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_ASN1};
use serde::Deserialize;

/// DER prefix of a P-256 `SubjectPublicKeyInfo` (id-ecPublicKey, prime256v1, BIT STRING of 66
/// bytes); what follows is the 65-byte uncompressed point ring verifies with.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// One configured verification key.
#[derive(Debug, Clone)]
pub struct VerifyingKey {
    pub id: String,
    point: Vec<u8>,
}

impl VerifyingKey {
    /// Parses a PEM P-256 public key.
    pub fn from_pem(id: &str, pem: &str) -> Result<VerifyingKey, String> {
        let body: String = pem
            .lines()
            .map(str::trim)
            .filter(|l| !l.starts_with("-----"))
            .collect();
        let der = STANDARD
            .decode(body)
            .map_err(|_| format!("secret-scanning key {id}: not base64 PEM"))?;
        let point = der
            .strip_prefix(&P256_SPKI_PREFIX[..])
            .filter(|p| p.len() == 65 && p[0] == 0x04)
            .ok_or_else(|| format!("secret-scanning key {id}: not an ECDSA P-256 public key"))?;
        Ok(VerifyingKey {
            id: id.to_string(),
            point: point.to_vec(),
        })
    }
}

/// Whether `signature_b64` over `body` verifies with the key named `key_id`.
pub fn verify(keys: &[VerifyingKey], key_id: &str, signature_b64: &str, body: &[u8]) -> bool {
    let Some(key) = keys.iter().find(|k| k.id == key_id) else {
        return false;
    };
    let Ok(signature) = STANDARD.decode(signature_b64.trim()) else {
        return false;
    };
    UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &key.point)
        .verify(body, &signature)
        .is_ok()
}

/// One reported token.
#[derive(Debug, Clone, Deserialize)]
pub struct Report {
    pub token: String,
    #[serde(rename = "type", default)]
    pub token_type: String,
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub source: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};

    #[test]
    fn signatures_verify_only_with_the_right_key_and_body() {
        let rng = SystemRandom::new();
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).expect("key");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
            .expect("pair");
        let mut spki = P256_SPKI_PREFIX.to_vec();
        spki.extend_from_slice(pair.public_key().as_ref());
        let pem = format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            STANDARD.encode(&spki)
        );
        let keys = vec![VerifyingKey::from_pem("k1", &pem).expect("parses")];
        let body = br#"[{"token":"pha_x","type":"posthog_oauth_access_token"}]"#;
        let sig = STANDARD.encode(pair.sign(&rng, body).expect("signs").as_ref());
        assert!(verify(&keys, "k1", &sig, body));
        assert!(!verify(&keys, "k2", &sig, body));
        assert!(!verify(&keys, "k1", &sig, b"[]"));
        assert!(!verify(&keys, "k1", "not base64!", body));
    }
}
