//! A hasher for maps and sets whose keys are already well-mixed 64-bit hashes: hashing them
//! again would only cost time.

use std::hash::{BuildHasherDefault, Hasher};

/// Passes a `u64` key through as its own hash (other input is folded in, for completeness).
#[derive(Default, Clone, Copy)]
pub struct Identity(u64);

impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// The `BuildHasher` of [`Identity`].
pub type PreHashed = BuildHasherDefault<Identity>;
