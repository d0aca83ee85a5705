//! The Prometheus registry `/metrics` serves.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};

/// Prometheus metrics of the HTTP layer. Actors register their own in the same registry.
pub struct Metrics {
    pub registry: Registry,
    pub(crate) http_requests: IntCounterVec,
    pub(crate) http_latency: HistogramVec,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new_custom(Some("corvid".into()), None).unwrap_or_default();
        let requests = IntCounterVec::new(
            Opts::new("http_requests_total", "HTTP requests by route and status"),
            &["method", "route", "status"],
        )
        .expect("static metric definition is valid");
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "http_request_duration_seconds",
                "HTTP request latency by route",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0, 10.0,
            ]),
            &["method", "route"],
        )
        .expect("static metric definition is valid");
        // Registering fresh, uniquely named collectors in a fresh registry cannot collide.
        let _ = registry.register(Box::new(requests.clone()));
        let _ = registry.register(Box::new(latency.clone()));
        Metrics {
            registry,
            http_requests: requests,
            http_latency: latency,
        }
    }

    /// Prometheus text exposition of every registered metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
