//! Generation and hashing of secrets: project tokens, personal API keys, passwords.
//!
//! Secrets are stored only as SHA-256 digests (API keys: high-entropy, so a fast hash is right)
//! or argon2id hashes (passwords: low-entropy, so a slow hash is right).

use argon2::password_hash::{rand_core::OsRng, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Argon2, PasswordHash};
use rand::Rng;
use sha2::{Digest, Sha256};

use super::StoreError;

const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

pub const PROJECT_TOKEN_PREFIX: &str = "phc_";
pub const PERSONAL_API_KEY_PREFIX: &str = "phx_";

/// `len` characters drawn uniformly from the base62 alphabet with the OS CSPRNG.
pub fn random_base62(len: usize) -> String {
    let mut rng = OsRng;
    (0..len)
        .map(|_| BASE62[rng.gen_range(0..BASE62.len())] as char)
        .collect()
}

/// `phc_` + 43 base62 characters (~256 bits), PostHog's project token shape.
pub fn new_project_token() -> String {
    format!("{PROJECT_TOKEN_PREFIX}{}", random_base62(43))
}

/// `phx_` + 47 base62 characters (~280 bits, like PostHog's 35 random bytes).
pub fn new_personal_api_key() -> String {
    format!("{PERSONAL_API_KEY_PREFIX}{}", random_base62(47))
}

/// A random password for the bootstrap admin: 24 base62 characters (~142 bits).
pub fn new_password() -> String {
    random_base62(24)
}

/// Lower-case hex SHA-256, the lookup key for stored API keys and tokens.
pub fn sha256_hex(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// `phx_...abcd`: enough to recognise a key in a list, useless to an attacker.
pub fn mask(secret: &str) -> String {
    let tail: String = secret
        .chars()
        .rev()
        .take(4)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let prefix = secret.get(..4).unwrap_or("");
    format!("{prefix}...{tail}")
}

/// argon2id with the crate's defaults (OWASP-recommended parameters) and a random salt.
pub fn hash_password(password: &str) -> Result<String, StoreError> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|_| StoreError::PasswordHash)
}

/// Constant-time verification against a stored PHC string; a malformed hash never matches.
pub fn verify_password(password: &str, phc: &str) -> bool {
    PasswordHash::new(phc)
        .map(|parsed| {
            Argon2::default()
                .verify_password(password.as_bytes(), &parsed)
                .is_ok()
        })
        .unwrap_or(false)
}

/// A valid hash of a random password, verified against when a login names an unknown email
/// so the answer takes as long as for a known one.
pub fn dummy_password_hash() -> String {
    static DUMMY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DUMMY
        .get_or_init(|| hash_password(&random_base62(24)).unwrap_or_default())
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_have_the_documented_shape() {
        let token = new_project_token();
        assert!(token.starts_with("phc_"));
        assert_eq!(token.len(), 4 + 43);
        assert!(token.bytes().skip(4).all(|b| b.is_ascii_alphanumeric()));
        let key = new_personal_api_key();
        assert!(key.starts_with("phx_"));
        assert_ne!(new_personal_api_key(), key);
    }

    #[test]
    fn mask_keeps_prefix_and_last_four() {
        assert_eq!(mask("phx_abcdefgh1234"), "phx_...1234");
    }

    #[test]
    fn password_hash_round_trip() {
        let hash = hash_password("hunter2").expect("hashes");
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_password("hunter2", &hash));
        assert!(!verify_password("hunter3", &hash));
        assert!(!verify_password("hunter2", "not a hash"));
    }
}
