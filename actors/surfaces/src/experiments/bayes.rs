//! The Bayesian comparison of a test variant with control, as PostHog's experiments engine
//! does it.
//!
//! The model: each variant's metric has a sample mean x̄ and variance s² (mean metrics:
//! s² = (Σx² − (Σx)²/n)/(n − 1); funnels: the proportion p with p(1 − p)). The effect θ is the
//! **relative** lift (x̄_T − x̄_C)/x̄_C, whose sampling variance by the delta method (no
//! covariance) is (s²_T/n_T)/x̄_C² + x̄_T²(s²_C/n_C)/x̄_C⁴. With PostHog's default flat
//! (non-informative) Gaussian prior the posterior of θ is Normal(θ̂, Var). Then
//! chance to win = P(θ > 0) = Φ(θ̂/σ) (P(θ < 0) when lower is better), and the credible
//! interval is θ̂ ± z·σ with z the (1 + level)/2 normal quantile (level 0.95 by default).
//! Funnels use the same normal approximation, valid only with at least 5 successes and 5
//! failures in both variants.

use serde::Serialize;

/// One variant's sufficient statistics.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sample {
    /// Exposed units (people).
    pub n: u64,
    /// Σ of the per-unit metric (conversions, for a funnel).
    pub sum: f64,
    /// Σ of squares of the per-unit metric (equals `sum` for 0/1 funnel outcomes).
    pub sum_squares: f64,
}

/// Whether the metric is a mean of values or a proportion of converted units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Mean,
    Funnel,
}

/// A test variant against control.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// Posterior mean of the relative lift.
    pub effect: f64,
    /// Posterior standard deviation of the relative lift.
    pub effect_sd: f64,
    pub chance_to_win: f64,
    /// Credible interval of the relative lift at `level`.
    pub credible_interval: [f64; 2],
    pub level: f64,
    /// The interval excludes zero (chance to win above `level` or below `1 − level`).
    pub significant: bool,
}

/// Why a comparison cannot be made yet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotComparable {
    #[error("No exposures yet.")]
    NoData,
    #[error("Normal approximation invalid: each variant needs at least 5 conversions and 5 non-conversions.")]
    TooFewConversions,
    #[error("The control mean must be positive to compute a relative effect.")]
    ControlMeanNotPositive,
    #[error("The effect has no variance yet (every value is identical).")]
    NoVariance,
}

fn moments(kind: MetricKind, s: &Sample) -> (f64, f64) {
    let n = s.n as f64;
    let mean = s.sum / n;
    let variance = match kind {
        MetricKind::Funnel => mean * (1.0 - mean),
        MetricKind::Mean if s.n > 1 => ((s.sum_squares - s.sum * s.sum / n) / (n - 1.0)).max(0.0),
        MetricKind::Mean => 0.0,
    };
    (mean, variance)
}

/// Compares `test` with `control`. `lower_is_better` flips the chance to win.
pub fn compare(
    kind: MetricKind,
    control: &Sample,
    test: &Sample,
    level: f64,
    lower_is_better: bool,
) -> Result<Comparison, NotComparable> {
    if control.n == 0 || test.n == 0 {
        return Err(NotComparable::NoData);
    }
    if kind == MetricKind::Funnel {
        let enough = |s: &Sample| s.sum >= 5.0 && (s.n as f64 - s.sum) >= 5.0;
        if !enough(control) || !enough(test) {
            return Err(NotComparable::TooFewConversions);
        }
    }
    let (mean_c, var_c) = moments(kind, control);
    let (mean_t, var_t) = moments(kind, test);
    if mean_c <= 0.0 {
        return Err(NotComparable::ControlMeanNotPositive);
    }
    let effect = (mean_t - mean_c) / mean_c;
    let variance = (var_t / test.n as f64) / (mean_c * mean_c)
        + mean_t * mean_t * (var_c / control.n as f64) / mean_c.powi(4);
    if variance.is_nan() || variance <= 0.0 {
        return Err(NotComparable::NoVariance);
    }
    let sd = variance.sqrt();
    let up = normal_cdf(effect / sd);
    let chance_to_win = if lower_is_better { 1.0 - up } else { up };
    let z = normal_quantile((1.0 + level) / 2.0);
    Ok(Comparison {
        effect,
        effect_sd: sd,
        chance_to_win,
        credible_interval: [effect - z * sd, effect + z * sd],
        level,
        significant: chance_to_win > level || chance_to_win < 1.0 - level,
    })
}

/// Φ, the standard normal distribution function (from musl's `erfc`, full double precision).
pub fn normal_cdf(x: f64) -> f64 {
    0.5 * libm::erfc(-x / std::f64::consts::SQRT_2)
}

/// Φ⁻¹, the standard normal quantile for `p` in (0, 1): Acklam's rational approximation
/// (relative error below 1.2e-9) refined by one Halley step on [`normal_cdf`].
pub fn normal_quantile(p: f64) -> f64 {
    let x = acklam(p);
    let e = normal_cdf(x) - p;
    let u = e * (2.0 * std::f64::consts::PI).sqrt() * (x * x / 2.0).exp();
    x - u / (1.0 + x * u / 2.0)
}

fn acklam(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let p = p.clamp(1e-300, 1.0 - 1e-16);
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    // The expected numbers below were computed independently of this module, with Python's
    // `statistics.NormalDist` (exact Φ and Φ⁻¹) applied to the formulas in the module docs:
    //   rel(nc, sc, ssc, nt, st, sst) → (θ̂, σ, Φ(θ̂/σ), θ̂ − z·σ, θ̂ + z·σ), z = Φ⁻¹(0.975).

    #[test]
    fn funnel_worked_example() {
        // Control 20/100 converted, test 30/100.
        let control = Sample {
            n: 100,
            sum: 20.0,
            sum_squares: 20.0,
        };
        let test = Sample {
            n: 100,
            sum: 30.0,
            sum_squares: 30.0,
        };
        let c = compare(MetricKind::Funnel, &control, &test, 0.95, false).expect("comparable");
        assert!(close(c.effect, 0.5, 1e-12));
        assert!(close(c.effect_sd, 0.377_491_721_763_537_5, 1e-12));
        assert!(close(c.chance_to_win, 0.907_336_847_900_710_1, 1e-9));
        assert!(close(
            c.credible_interval[0],
            -0.239_870_179_118_548_24,
            1e-8
        ));
        assert!(close(c.credible_interval[1], 1.239_870_179_118_548, 1e-8));
        assert!(!c.significant);
    }

    #[test]
    fn mean_worked_example() {
        // Control values 1, 2, 3, 4; test values 2, 3, 4, 5.
        let control = Sample {
            n: 4,
            sum: 10.0,
            sum_squares: 30.0,
        };
        let test = Sample {
            n: 4,
            sum: 14.0,
            sum_squares: 54.0,
        };
        let c = compare(MetricKind::Mean, &control, &test, 0.95, false).expect("comparable");
        assert!(close(c.effect, 0.4, 1e-12));
        assert!(close(c.effect_sd, 0.444_222_166_638_871_54, 1e-12));
        assert!(close(c.chance_to_win, 0.816_059_678_610_167_3, 1e-9));
        assert!(close(
            c.credible_interval[0],
            -0.470_659_447_746_538_34,
            1e-8
        ));
        assert!(close(c.credible_interval[1], 1.270_659_447_746_538_3, 1e-8));
    }

    #[test]
    fn lower_is_better_and_a_losing_variant() {
        // Control 150/1000, test 130/1000: the test converts less.
        let control = Sample {
            n: 1000,
            sum: 150.0,
            sum_squares: 150.0,
        };
        let test = Sample {
            n: 1000,
            sum: 130.0,
            sum_squares: 130.0,
        };
        let up = compare(MetricKind::Funnel, &control, &test, 0.95, false).expect("ok");
        assert!(close(up.chance_to_win, 0.083_199_067_163_260_09, 1e-9));
        assert!(close(
            up.credible_interval[1],
            0.055_505_539_667_569_104,
            1e-8
        ));
        let down = compare(MetricKind::Funnel, &control, &test, 0.95, true).expect("ok");
        assert!(close(
            down.chance_to_win,
            1.0 - 0.083_199_067_163_260_09,
            1e-6
        ));
    }

    #[test]
    fn too_little_data_is_not_compared() {
        let few = Sample {
            n: 10,
            sum: 3.0,
            sum_squares: 3.0,
        };
        let ok = Sample {
            n: 100,
            sum: 30.0,
            sum_squares: 30.0,
        };
        assert_eq!(
            compare(MetricKind::Funnel, &few, &ok, 0.95, false),
            Err(NotComparable::TooFewConversions)
        );
        let none = Sample {
            n: 0,
            sum: 0.0,
            sum_squares: 0.0,
        };
        assert_eq!(
            compare(MetricKind::Mean, &none, &ok, 0.95, false),
            Err(NotComparable::NoData)
        );
        let zero = Sample {
            n: 5,
            sum: 0.0,
            sum_squares: 0.0,
        };
        assert_eq!(
            compare(MetricKind::Mean, &zero, &ok, 0.95, false),
            Err(NotComparable::ControlMeanNotPositive)
        );
        let flat = Sample {
            n: 5,
            sum: 5.0,
            sum_squares: 5.0,
        };
        assert_eq!(
            compare(MetricKind::Mean, &flat, &flat, 0.95, false),
            Err(NotComparable::NoVariance)
        );
    }

    #[test]
    fn normal_functions_match_known_values() {
        assert!(close(normal_cdf(0.0), 0.5, 1e-9));
        assert!(close(normal_cdf(1.959_963_984_540_054), 0.975, 1e-7));
        assert!(close(normal_cdf(-3.0), 0.001_349_898_031_630_094_6, 1e-8));
        assert!(close(normal_quantile(0.975), 1.959_963_984_540_053_6, 1e-8));
        assert!(close(normal_quantile(0.05), -1.644_853_626_951_472_2, 1e-8));
        assert!(close(normal_quantile(0.999), 3.090_232_306_167_813_5, 1e-7));
    }
}
