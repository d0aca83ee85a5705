//! Corvid's engine. Each domain lives beside the actor (or store) that owns its state; the
//! `corvid` service crate only validates HTTP input and hands typed calls to these owners.
//!
//! - [`meta`]: organizations, projects, users and personal API keys in sled.

pub mod meta;
