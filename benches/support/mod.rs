//! What the capture benches share: the properties of the load test's events
//! (`benches/load/make_bodies.py` writes the same shape for the HTTP load).

use serde_json::{json, Value};

/// The `i`-th event's properties: ~450 bytes of JSON, as posthog-node sends them.
pub fn event_properties(i: usize) -> Value {
    json!({
        "$current_url": format!("https://shop.example.com/products/{i}?ref=newsletter"),
        "$browser": "Chrome", "$browser_version": 131, "$os": "Mac OS X",
        "$device_type": "Desktop", "$lib": "posthog-node", "$lib_version": "5.70.0",
        "$session_id": "0193a8a0-47c1-7b8e-9c4e-6b2f6c1d2e3f",
        "plan": "pro", "cart_value": 129.5, "items": 3,
        "$referrer": "https://www.google.com/", "$screen_width": 1920
    })
}
