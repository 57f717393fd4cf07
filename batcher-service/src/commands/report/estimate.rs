//! The statistics behind `cohort report`: Cohort's group against the hold-out, from the
//! filter's per-group, per-unit counters and TTFB histograms, with no I/O.
//!
//! **Units.** The rollout assigns users, not requests, to a group, so requests are not
//! independent: one heavy user can move a group's tail or error rate on their own. The
//! filter splits the users into [`UNITS`] units (`cohort_unit`, the user's rollout bucket
//! modulo 8: a random eighth of the users, in both groups). Each unit is an independent
//! replicate of the whole group.
//!
//! **Method (random groups).** A measure's point estimate is computed from the pooled data
//! of a group (all its units together). Its variance is estimated from the spread of the
//! same measure computed on each unit alone: `s² / k`, with `s²` the sample variance of the
//! `k` per-unit estimates (units with data for the measure). The difference Cohort − hold-out
//! gets a 95% confidence interval by Welch's t: standard error `√(s²_R/k_R + s²_H/k_H)`,
//! Welch–Satterthwaite degrees of freedom, and the Student-t quantile ([`t_quantile`]).
//! A verdict is given when the interval excludes 0.
//!
//! **Too small.** A group with fewer than [`Threshold::min_responses`] responses, or fewer
//! than [`Threshold::min_units`] units holding at least [`Threshold::min_unit_responses`]
//! responses each, gets no verdict (docs/DECISIONS.md, "`cohort report`'s intervals"). The
//! TTFT quantiles rest on the responses the TTFB histogram sampled (the filter records one in
//! `histogram_sample_every`), so their rows apply the same threshold to the samples.

use std::collections::BTreeMap;

/// How many units the filter splits the users into (`cohort_unit` 0..=7).
pub const UNITS: usize = 8;

/// The confidence level of every interval.
pub const CONFIDENCE: f64 = 0.95;

/// One histogram bucket as Prometheus exports it: the upper bound (`le`, `+Inf` for the
/// last) and the cumulative count of observations at or below it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    pub le: f64,
    pub count: f64,
}

/// The `q`-quantile (0–1) of a classic histogram, as PromQL's `histogram_quantile` computes
/// it: buckets sorted by bound, equal bounds merged, counts made monotonic; the rank
/// `q · total` is found in its bucket and interpolated linearly between the bucket's bounds
/// (the first bucket's lower bound is 0); a rank in the `+Inf` bucket gives the highest
/// finite bound. `None` without a `+Inf` bucket, with fewer than two buckets, or with no
/// observations.
pub fn histogram_quantile(q: f64, buckets: &[Bucket]) -> Option<f64> {
    if !(0.0..=1.0).contains(&q) {
        return None;
    }
    let mut sorted: Vec<Bucket> = buckets.to_vec();
    sorted.sort_by(|a, b| a.le.total_cmp(&b.le));
    let mut merged: Vec<Bucket> = Vec::with_capacity(sorted.len());
    for bucket in sorted {
        match merged.last_mut() {
            Some(last) if last.le == bucket.le => last.count += bucket.count,
            _ => merged.push(bucket),
        }
    }
    if merged.len() < 2 || merged.last().is_none_or(|b| b.le != f64::INFINITY) {
        return None;
    }
    let mut highest = f64::NEG_INFINITY;
    for bucket in &mut merged {
        highest = highest.max(bucket.count);
        bucket.count = highest;
    }
    let total = merged[merged.len() - 1].count;
    if total <= 0.0 || !total.is_finite() {
        return None;
    }
    let mut rank = q * total;
    let b = merged.iter().position(|bucket| bucket.count >= rank)?;
    if b == merged.len() - 1 {
        return Some(merged[merged.len() - 2].le);
    }
    if b == 0 && merged[0].le <= 0.0 {
        return Some(merged[0].le);
    }
    let (mut start, end, mut count) = (0.0, merged[b].le, merged[b].count);
    if b > 0 {
        start = merged[b - 1].le;
        count -= merged[b - 1].count;
        rank -= merged[b - 1].count;
    }
    Some(start + (end - start) * (rank / count))
}

/// What one unit (or a whole group, pooled) of one group counted over the window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts {
    /// Responses (`cohort_responses_total`, every status class).
    pub responses: f64,
    /// Of which 5xx.
    pub responses_5xx: f64,
    /// TTFB histogram (`cohort_response_ttfb_ms_bucket`), cumulative, in any order: the
    /// responses the filter sampled.
    pub ttfb: Vec<Bucket>,
    /// Prompt tokens the responses reported, and of which cached.
    pub prompt_tokens: f64,
    pub cached_tokens: f64,
}

impl Counts {
    /// Responses the TTFB histogram holds (its `+Inf` bucket, or its largest count).
    pub fn ttft_samples(&self) -> f64 {
        self.ttfb.iter().map(|b| b.count).fold(0.0, f64::max)
    }

    /// Adds `other`'s counts (histograms bucket by bucket).
    pub fn add(&mut self, other: &Counts) {
        self.responses += other.responses;
        self.responses_5xx += other.responses_5xx;
        self.prompt_tokens += other.prompt_tokens;
        self.cached_tokens += other.cached_tokens;
        for bucket in &other.ttfb {
            match self.ttfb.iter_mut().find(|b| b.le == bucket.le) {
                Some(mine) => mine.count += bucket.count,
                None => self.ttfb.push(*bucket),
            }
        }
    }
}

/// One group's counts per unit (the `cohort_unit` label value; `""` for series without one).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Group {
    pub units: BTreeMap<String, Counts>,
}

impl Group {
    /// The unit's counts, created empty on first use.
    pub fn unit(&mut self, unit: &str) -> &mut Counts {
        self.units.entry(unit.to_owned()).or_default()
    }

    /// All units together.
    pub fn pooled(&self) -> Counts {
        let mut all = Counts::default();
        for counts in self.units.values() {
            all.add(counts);
        }
        all
    }

    /// Whether the group has any series at all (any count, even zero).
    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    /// The replicates: the units with a `cohort_unit` label. Series without one (a proxy
    /// whose filter keeps no hold-out, `rollout.share` 1) count in [`Group::pooled`] only.
    pub fn replicates(&self) -> impl Iterator<Item = &Counts> {
        self.units
            .iter()
            .filter(|(unit, _)| !unit.is_empty())
            .map(|(_, counts)| counts)
    }

    /// Each replicate's size for `measure` ([`Measure::size`]).
    pub fn sizes(&self, measure: Measure) -> Vec<f64> {
        self.replicates().map(|c| measure.size(c)).collect()
    }
}

/// The measures the report compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    TtftP50,
    TtftP95,
    /// Cached prompt tokens / prompt tokens, of the responses that reported usage.
    CachedShare,
    /// 5xx responses / responses.
    ErrorRate,
}

impl Measure {
    pub const ALL: [Measure; 4] = [
        Measure::TtftP50,
        Measure::TtftP95,
        Measure::CachedShare,
        Measure::ErrorRate,
    ];

    /// The measure on one unit's (or a pooled group's) counts; `None` without data.
    pub fn of(self, counts: &Counts) -> Option<f64> {
        let ratio = |num: f64, den: f64| (den > 0.0).then(|| num / den);
        match self {
            Measure::TtftP50 => histogram_quantile(0.5, &counts.ttfb),
            Measure::TtftP95 => histogram_quantile(0.95, &counts.ttfb),
            Measure::CachedShare => ratio(counts.cached_tokens, counts.prompt_tokens),
            Measure::ErrorRate => ratio(counts.responses_5xx, counts.responses),
        }
    }

    /// How many responses the measure rests on: the TTFB histogram's samples for the TTFT
    /// quantiles, every response for the rates.
    pub fn size(self, counts: &Counts) -> f64 {
        match self {
            Measure::TtftP50 | Measure::TtftP95 => counts.ttft_samples(),
            Measure::CachedShare | Measure::ErrorRate => counts.responses,
        }
    }

    /// Whether the measure rests on sampled responses (so it may be too small on its own).
    pub fn sampled(self) -> bool {
        matches!(self, Measure::TtftP50 | Measure::TtftP95)
    }

    /// Whether a higher value is better for the service (only the cached share).
    pub fn higher_is_better(self) -> bool {
        matches!(self, Measure::CachedShare)
    }

    /// Its name in the report and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Measure::TtftP50 => "ttft_p50_ms",
            Measure::TtftP95 => "ttft_p95_ms",
            Measure::CachedShare => "cached_token_share",
            Measure::ErrorRate => "5xx_rate",
        }
    }
}

/// A measure on one group: the pooled point estimate, and the variance of that estimate
/// from the spread of the per-unit estimates (`None` with fewer than two units with data).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub value: f64,
    pub variance: Option<f64>,
    /// Units with data for the measure.
    pub units: usize,
}

/// The random-groups estimate of `measure` on `group`; `None` when the pooled data has
/// none (no responses, no usage, an empty histogram).
pub fn estimate(measure: Measure, group: &Group) -> Option<Estimate> {
    let value = measure.of(&group.pooled())?;
    let per_unit: Vec<f64> = group
        .replicates()
        .filter_map(|counts| measure.of(counts))
        .collect();
    Some(Estimate {
        value,
        variance: replicate_variance(&per_unit),
        units: per_unit.len(),
    })
}

/// The random-groups variance of a pooled estimate from `k` replicate estimates:
/// `s² / k` (`s²` the sample variance, `k − 1` in its denominator); `None` when `k < 2`.
pub fn replicate_variance(replicates: &[f64]) -> Option<f64> {
    let k = replicates.len();
    if k < 2 {
        return None;
    }
    let mean = replicates.iter().sum::<f64>() / k as f64;
    let s2 = replicates.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (k - 1) as f64;
    Some(s2 / k as f64)
}

/// A difference between two estimates with its confidence interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Difference {
    pub value: f64,
    pub low: f64,
    pub high: f64,
    /// Welch–Satterthwaite degrees of freedom.
    pub df: f64,
}

impl Difference {
    /// Whether the interval excludes zero.
    pub fn excludes_zero(&self) -> bool {
        self.low > 0.0 || self.high < 0.0
    }
}

/// `a − b` with a `confidence` interval by Welch's t (each variance with `units − 1`
/// degrees of freedom); `None` when either variance is unknown. When both variances are
/// zero (every unit gave the same value) the interval is the point itself, and a
/// difference within rounding (1e-9 of the values) is 0.
pub fn welch(a: &Estimate, b: &Estimate, confidence: f64) -> Option<Difference> {
    let (va, vb) = (a.variance?, b.variance?);
    let mut value = a.value - b.value;
    let se2 = va + vb;
    // Rounding noise, not spread: every unit gave the same value (up to the last bits).
    let negligible = 1e-9 * a.value.abs().max(b.value.abs());
    if se2.sqrt() <= negligible {
        if value.abs() <= negligible {
            value = 0.0;
        }
        return Some(Difference {
            value,
            low: value,
            high: value,
            df: (a.units + b.units - 2) as f64,
        });
    }
    let df = se2 * se2 / (va * va / (a.units - 1) as f64 + vb * vb / (b.units - 1) as f64);
    let half = t_quantile(0.5 + confidence / 2.0, df) * se2.sqrt();
    Some(Difference {
        value,
        low: value - half,
        high: value + half,
        df,
    })
}

/// The smallest groups the report draws a conclusion from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    /// Responses in the group over the window.
    pub min_responses: f64,
    /// Units holding at least `min_unit_responses` responses each.
    pub min_units: usize,
    pub min_unit_responses: f64,
}

impl Default for Threshold {
    /// 200 responses, and 6 of the 8 units with at least 20 each: with 6 units the t
    /// quantile is at most 2.57 (5 degrees of freedom) instead of 12.7 with 2, and a unit of
    /// 20 responses has its p95 between its last two observations rather than on its
    /// maximum (docs/DECISIONS.md).
    fn default() -> Threshold {
        Threshold {
            min_responses: 200.0,
            min_units: 6,
            min_unit_responses: 20.0,
        }
    }
}

/// Why a group is too small to conclude from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TooSmall {
    /// Responses (for a TTFT row: sampled responses) in the group's units.
    pub responses: f64,
    /// Units with at least the threshold's responses.
    pub units: usize,
}

/// Which group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Cohort,
    Holdout,
}

impl Threshold {
    /// `Err` with the size when units of these `sizes` are below the threshold.
    pub fn check_sizes(&self, sizes: &[f64]) -> Result<(), TooSmall> {
        let responses = sizes.iter().sum();
        let units = self.units_with(sizes);
        if responses < self.min_responses || units < self.min_units {
            Err(TooSmall { responses, units })
        } else {
            Ok(())
        }
    }

    /// `Err` with the group's size when its responses are below the threshold.
    pub fn check(&self, group: &Group) -> Result<(), TooSmall> {
        self.check_sizes(&group.sizes(Measure::ErrorRate))
    }

    /// Units of these `sizes` with at least `min_unit_responses`.
    pub fn units_with(&self, sizes: &[f64]) -> usize {
        sizes
            .iter()
            .filter(|&&n| n >= self.min_unit_responses)
            .count()
    }

    /// The first group (the hold-out first) below the threshold for `measure`.
    pub fn check_measure(
        &self,
        measure: Measure,
        cohort: &Group,
        holdout: &Group,
    ) -> Result<(), (Side, TooSmall)> {
        self.check_sizes(&holdout.sizes(measure))
            .map_err(|small| (Side::Holdout, small))?;
        self.check_sizes(&cohort.sizes(measure))
            .map_err(|small| (Side::Cohort, small))
    }
}

/// The verdict on one measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Better,
    Worse,
    NoDetectableDifference,
    /// A group is below the threshold (the comparison's [`Outcome`], or for a TTFT row its
    /// `too_small`, says which).
    TooSmall,
    /// One group has no data for the measure (no usage reported, no histogram), or too
    /// few units with data for a variance.
    NoData,
}

impl Verdict {
    pub fn text(self) -> &'static str {
        match self {
            Verdict::Better => "better",
            Verdict::Worse => "worse",
            Verdict::NoDetectableDifference => "no detectable difference",
            Verdict::TooSmall => "too small to conclude",
            Verdict::NoData => "no data",
        }
    }
}

/// One measure compared.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    pub measure: Measure,
    pub cohort: Option<Estimate>,
    pub holdout: Option<Estimate>,
    /// Cohort − hold-out, with its interval (absent when too small or without data).
    pub difference: Option<Difference>,
    /// The point difference even where no interval is given.
    pub point_difference: Option<f64>,
    pub verdict: Verdict,
    /// Set when the groups are large enough but this measure's samples are not (a TTFT
    /// row: the histogram samples one response in `histogram_sample_every`).
    pub too_small: Option<(Side, TooSmall)>,
}

/// What the comparison could conclude overall.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    /// Both groups are large enough: each measure has a verdict.
    Compared,
    /// No series of either group in the window.
    NoData,
    /// No hold-out series (rollout share 1, or no held-out traffic in the window).
    NoHoldout,
    /// No Cohort-routed series (rollout share 0, or the breaker held everything out).
    NoCohort,
    /// The hold-out is below the threshold (checked first).
    HoldoutTooSmall(TooSmall),
    /// Cohort's group is below the threshold.
    CohortTooSmall(TooSmall),
}

/// The whole comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub outcome: Outcome,
    pub cohort: Counts,
    pub holdout: Counts,
    /// Units with at least the threshold's responses per unit, in each group.
    pub cohort_units: usize,
    pub holdout_units: usize,
    /// The same for the TTFB histogram's sampled responses.
    pub cohort_sampled_units: usize,
    pub holdout_sampled_units: usize,
    pub rows: Vec<Row>,
}

/// Compares Cohort's group against the hold-out on every [`Measure`].
pub fn compare(cohort: &Group, holdout: &Group, threshold: &Threshold) -> Comparison {
    let outcome = match (cohort.is_empty(), holdout.is_empty()) {
        (true, true) => Outcome::NoData,
        (_, true) => Outcome::NoHoldout,
        (true, false) => Outcome::NoCohort,
        (false, false) => match (threshold.check(holdout), threshold.check(cohort)) {
            (Err(small), _) => Outcome::HoldoutTooSmall(small),
            (Ok(()), Err(small)) => Outcome::CohortTooSmall(small),
            (Ok(()), Ok(())) => Outcome::Compared,
        },
    };
    let rows = Measure::ALL
        .iter()
        .map(|&measure| {
            let (c, h) = (estimate(measure, cohort), estimate(measure, holdout));
            let point_difference = c.zip(h).map(|(c, h)| c.value - h.value);
            let too_small = match outcome {
                Outcome::Compared if measure.sampled() => {
                    threshold.check_measure(measure, cohort, holdout).err()
                }
                _ => None,
            };
            let (difference, verdict) = match outcome {
                Outcome::Compared if too_small.is_some() => (None, Verdict::TooSmall),
                Outcome::Compared => match c.zip(h).and_then(|(c, h)| welch(&c, &h, CONFIDENCE)) {
                    Some(d) => (Some(d), verdict(measure, &d)),
                    None => (None, Verdict::NoData),
                },
                Outcome::HoldoutTooSmall(_) | Outcome::CohortTooSmall(_) => {
                    (None, Verdict::TooSmall)
                }
                Outcome::NoData | Outcome::NoHoldout | Outcome::NoCohort => (None, Verdict::NoData),
            };
            Row {
                measure,
                cohort: c,
                holdout: h,
                difference,
                point_difference,
                verdict,
                too_small,
            }
        })
        .collect();
    Comparison {
        outcome,
        cohort: cohort.pooled(),
        holdout: holdout.pooled(),
        cohort_units: threshold.units_with(&cohort.sizes(Measure::ErrorRate)),
        holdout_units: threshold.units_with(&holdout.sizes(Measure::ErrorRate)),
        cohort_sampled_units: threshold.units_with(&cohort.sizes(Measure::TtftP50)),
        holdout_sampled_units: threshold.units_with(&holdout.sizes(Measure::TtftP50)),
        rows,
    }
}

/// Better or worse when the interval excludes zero (in the measure's good direction),
/// else no detectable difference.
pub fn verdict(measure: Measure, difference: &Difference) -> Verdict {
    if !difference.excludes_zero() {
        Verdict::NoDetectableDifference
    } else if (difference.value > 0.0) == measure.higher_is_better() {
        Verdict::Better
    } else {
        Verdict::Worse
    }
}

// ---------------------------------------------------------------------------------------
// Student's t distribution

/// `ln Γ(x)` for `x > 0` (Lanczos, g = 7, nine coefficients; relative error below 1e-13).
fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x) Γ(1 − x) = π / sin(πx).
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut sum = C[0];
    for (i, c) in C.iter().enumerate().skip(1) {
        sum += c / (x + i as f64);
    }
    let t = x + G + 0.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

/// The regularized incomplete beta function `I_x(a, b)` (continued fraction by the
/// modified Lentz method, on the side where it converges fast).
fn incomplete_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front =
        (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_fraction(a, b, x) / a
    } else {
        1.0 - front * beta_fraction(b, a, 1.0 - x) / b
    }
}

/// The continued fraction of the incomplete beta function.
fn beta_fraction(a: f64, b: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    const EPSILON: f64 = 1e-15;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..100_000 {
        let m = m as f64;
        let m2 = 2.0 * m;
        for aa in [
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ] {
            d = 1.0 + aa * d;
            if d.abs() < TINY {
                d = TINY;
            }
            c = 1.0 + aa / c;
            if c.abs() < TINY {
                c = TINY;
            }
            d = 1.0 / d;
            h *= d * c;
        }
        if (d * c - 1.0).abs() < EPSILON {
            break;
        }
    }
    h
}

/// The cumulative distribution of Student's t with `df` degrees of freedom (`df > 0`, not
/// necessarily whole).
pub fn t_cdf(t: f64, df: f64) -> f64 {
    let tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t));
    if t > 0.0 {
        1.0 - tail
    } else {
        tail
    }
}

/// The `p`-quantile of Student's t with `df` degrees of freedom (`0 < p < 1`, `df > 0`,
/// not necessarily whole): the `t` with `t_cdf(t, df) = p`, by bisection to within 1e-12.
/// Degrees of freedom above 10⁶ are taken as 10⁶ (the normal quantile to six digits).
pub fn t_quantile(p: f64, df: f64) -> f64 {
    assert!(p > 0.0 && p < 1.0 && df > 0.0, "t_quantile({p}, {df})");
    let df = df.min(1e6);
    if p < 0.5 {
        return -t_quantile(1.0 - p, df);
    }
    let (mut low, mut high) = (0.0_f64, 1.0_f64);
    while t_cdf(high, df) < p {
        low = high;
        high *= 2.0;
    }
    while high - low > 1e-12 * high.max(1.0) {
        let mid = 0.5 * (low + high);
        if t_cdf(mid, df) < p {
            low = mid;
        } else {
            high = mid;
        }
    }
    0.5 * (low + high)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buckets(pairs: &[(f64, f64)]) -> Vec<Bucket> {
        pairs
            .iter()
            .map(|&(le, count)| Bucket { le, count })
            .collect()
    }

    const INF: f64 = f64::INFINITY;

    #[test]
    fn t_quantiles_match_the_tables() {
        // Two-sided 95% (p = 0.975) and one-sided 95% (p = 0.95), from any t table.
        for (p, df, table) in [
            (0.975, 1.0, 12.706),
            (0.975, 2.0, 4.303),
            (0.975, 3.0, 3.182),
            (0.975, 5.0, 2.571),
            (0.975, 7.0, 2.365),
            (0.975, 10.0, 2.228),
            (0.975, 14.0, 2.145),
            (0.975, 30.0, 2.042),
            (0.975, 120.0, 1.980),
            (0.975, 1e9, 1.960),
            (0.95, 3.0, 2.353),
            (0.95, 10.0, 1.812),
            (0.995, 4.0, 4.604),
            (0.9995, 6.0, 5.959),
        ] {
            let t = t_quantile(p, df);
            assert!(
                (t - table).abs() < 5e-4,
                "t({p}, {df}) = {t}, table {table}"
            );
        }
        // Whole-number closed forms: df 1 is Cauchy, df 2 has t = (2p−1)·√(2/(1−(2p−1)²)).
        let cauchy = (std::f64::consts::PI * (0.975 - 0.5)).tan();
        assert!((t_quantile(0.975, 1.0) - cauchy).abs() < 1e-9);
        let a: f64 = 2.0 * 0.975 - 1.0;
        let closed = a * (2.0 / (1.0 - a * a)).sqrt();
        assert!((t_quantile(0.975, 2.0) - closed).abs() < 1e-9);
        // Fractional degrees of freedom (Welch) lie between their whole neighbours.
        let (t5, t55, t6) = (
            t_quantile(0.975, 5.0),
            t_quantile(0.975, 5.5),
            t_quantile(0.975, 6.0),
        );
        assert!(t5 > t55 && t55 > t6, "{t5} {t55} {t6}");
        // Symmetry, and the CDF undoes the quantile.
        assert!((t_quantile(0.025, 7.0) + t_quantile(0.975, 7.0)).abs() < 1e-9);
        for df in [1.0, 2.5, 9.0, 40.0] {
            for p in [0.6, 0.9, 0.99] {
                assert!((t_cdf(t_quantile(p, df), df) - p).abs() < 1e-9, "{p} {df}");
            }
        }
        assert_eq!(t_cdf(0.0, 3.0), 0.5);
    }

    #[test]
    fn ln_gamma_is_exact_on_factorials_and_the_half() {
        for (x, exact) in [(1.0, 1.0_f64), (2.0, 1.0), (5.0, 24.0), (11.0, 3_628_800.0)] {
            assert!((ln_gamma(x) - exact.ln()).abs() < 1e-12, "{x}");
        }
        let half = std::f64::consts::PI.sqrt().ln();
        assert!((ln_gamma(0.5) - half).abs() < 1e-12);
    }

    #[test]
    fn histogram_quantile_interpolates_as_promql_does() {
        // 10 observations at or below 10, 30 more up to 50, 10 more up to 100, none above.
        let h = buckets(&[(10.0, 10.0), (50.0, 40.0), (100.0, 50.0), (INF, 50.0)]);
        // Rank 25 of 50: 15 into the (10, 50] bucket of 30 → 10 + 40 × 15/30.
        assert_eq!(histogram_quantile(0.5, &h), Some(30.0));
        // Rank 47.5: 7.5 of 10 into (50, 100].
        assert_eq!(histogram_quantile(0.95, &h), Some(87.5));
        // Rank 2.5 in the first bucket: its lower bound is 0.
        assert_eq!(histogram_quantile(0.05, &h), Some(2.5));
        // Order does not matter; duplicate bounds (`le="10"` and `le="10.0"` of two
        // sources) add up.
        let shuffled = buckets(&[(INF, 50.0), (100.0, 50.0), (10.0, 10.0), (50.0, 40.0)]);
        assert_eq!(histogram_quantile(0.5, &shuffled), Some(30.0));
        let split = buckets(&[
            (10.0, 4.0),
            (10.0, 6.0),
            (50.0, 40.0),
            (100.0, 50.0),
            (INF, 50.0),
        ]);
        assert_eq!(histogram_quantile(0.5, &split), Some(30.0));
        // A rank past the last finite bound gives that bound.
        let tail = buckets(&[(10.0, 1.0), (100.0, 2.0), (INF, 10.0)]);
        assert_eq!(histogram_quantile(0.5, &tail), Some(100.0));
        // Non-monotonic counts (increase() extrapolation) are made monotonic.
        let bumpy = buckets(&[(10.0, 10.0), (50.0, 9.5), (100.0, 20.0), (INF, 20.0)]);
        assert_eq!(histogram_quantile(0.5, &bumpy), Some(10.0));
        // No +Inf bucket, one bucket, no observations, q out of range: no answer.
        assert_eq!(histogram_quantile(0.5, &buckets(&[(10.0, 1.0)])), None);
        assert_eq!(histogram_quantile(0.5, &buckets(&[(INF, 5.0)])), None);
        assert_eq!(
            histogram_quantile(0.5, &buckets(&[(10.0, 0.0), (INF, 0.0)])),
            None
        );
        assert_eq!(histogram_quantile(1.5, &h), None);
    }

    #[test]
    fn replicate_variance_is_the_sample_variance_over_k() {
        // Mean 5, squared deviations 9 + 1 + 1 + 9 = 20, s² = 20/3, / 4.
        let v = replicate_variance(&[2.0, 4.0, 6.0, 8.0]).unwrap();
        assert!((v - 20.0 / 3.0 / 4.0).abs() < 1e-12);
        assert_eq!(replicate_variance(&[3.0]), None);
        assert_eq!(replicate_variance(&[]), None);
    }

    #[test]
    fn welch_matches_a_hand_computation() {
        // va = 4, vb = 1 with 8 and 5 units: df = 25 / (16/7 + 1/4) = 9.859...
        let a = Estimate {
            value: 10.0,
            variance: Some(4.0),
            units: 8,
        };
        let b = Estimate {
            value: 3.0,
            variance: Some(1.0),
            units: 5,
        };
        let d = welch(&a, &b, 0.95).unwrap();
        let df = 25.0 / (16.0 / 7.0 + 1.0 / 4.0);
        assert!((d.df - df).abs() < 1e-12);
        let half = t_quantile(0.975, df) * 5.0_f64.sqrt();
        assert!((d.low - (7.0 - half)).abs() < 1e-9 && (d.high - (7.0 + half)).abs() < 1e-9);
        assert!(d.excludes_zero());
        // Every unit alike in both groups, values equal but for rounding: no difference.
        let flat = |value: f64| Estimate {
            value,
            variance: Some(0.0),
            units: 8,
        };
        let same = welch(&flat(0.906_25), &flat(0.906_25 + 1e-16), 0.95).unwrap();
        assert_eq!((same.value, same.low, same.high), (0.0, 0.0, 0.0));
        assert!(!same.excludes_zero());
        let apart = welch(&flat(0.9), &flat(0.8), 0.95).unwrap();
        assert!(apart.excludes_zero() && apart.low == apart.high);
        // One variance zero: the other's degrees of freedom.
        let exact = Estimate {
            variance: Some(0.0),
            ..b
        };
        assert!((welch(&a, &exact, 0.95).unwrap().df - 7.0).abs() < 1e-12);
        // Unknown variance: no interval.
        let single = Estimate {
            variance: None,
            units: 1,
            ..b
        };
        assert_eq!(welch(&a, &single, 0.95), None);
    }

    /// A unit of `n` responses: `errors` of them 5xx, every TTFB in the contract's bucket
    /// that holds `ttft` (so its interpolated median is that bucket's middle), 40% of the
    /// prompt tokens cached.
    fn unit(n: f64, errors: f64, ttft: f64) -> Counts {
        let bounds = [
            5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
        ];
        let ttfb = bounds
            .iter()
            .map(|&le| Bucket {
                le,
                count: if le >= ttft { n } else { 0.0 },
            })
            .chain([Bucket { le: INF, count: n }])
            .collect();
        Counts {
            responses: n,
            responses_5xx: errors,
            ttfb,
            prompt_tokens: 100.0 * n,
            cached_tokens: 40.0 * n,
        }
    }

    fn group(units: &[Counts]) -> Group {
        Group {
            units: units
                .iter()
                .enumerate()
                .map(|(i, c)| (i.to_string(), c.clone()))
                .collect(),
        }
    }

    #[test]
    fn a_slower_cohort_with_more_cache_hits_is_worse_on_ttft_and_better_on_cache() {
        let cohort = group(
            &(0..8)
                .map(|i| {
                    let errors = [0.0, 2.0, 1.0, 3.0, 0.0, 1.0, 2.0, 1.0][i];
                    let mut u = unit(100.0 + 10.0 * i as f64, errors, 200.0);
                    // Cached share 0.70 ± a little per unit.
                    u.cached_tokens = u.prompt_tokens * (0.68 + 0.005 * i as f64);
                    // Medians spread within (100, 250]: shift part of the unit down a bucket.
                    u.ttfb[4].count = 2.0 * i as f64;
                    u
                })
                .collect::<Vec<_>>(),
        );
        let holdout = group(
            &(0..8)
                .map(|i| {
                    let errors = [2.0, 0.0, 1.0, 1.0, 3.0, 0.0, 1.0, 2.0][i];
                    let mut u = unit(90.0 + 5.0 * i as f64, errors, 40.0);
                    u.cached_tokens = u.prompt_tokens * (0.40 + 0.01 * i as f64);
                    u.ttfb[2].count = 3.0 * i as f64;
                    u
                })
                .collect::<Vec<_>>(),
        );
        let c = compare(&cohort, &holdout, &Threshold::default());
        assert_eq!(c.outcome, Outcome::Compared);
        let row = |m: Measure| *c.rows.iter().find(|r| r.measure == m).unwrap();
        let p50 = row(Measure::TtftP50);
        let d = p50.difference.unwrap();
        assert!(d.value > 100.0 && d.low > 0.0, "{p50:?}");
        assert_eq!(p50.verdict, Verdict::Worse);
        let cached = row(Measure::CachedShare);
        assert!(cached.difference.unwrap().low > 0.0, "{cached:?}");
        assert_eq!(cached.verdict, Verdict::Better);
        // Error rates of 0–3% per unit in both groups: nothing to tell apart.
        assert_eq!(
            row(Measure::ErrorRate).verdict,
            Verdict::NoDetectableDifference
        );
        assert_eq!(
            c.cohort.responses,
            (0..8).map(|i| 100.0 + 10.0 * i as f64).sum::<f64>()
        );
    }

    /// A heavy user lives in one unit: their many failing requests make Cohort's pooled 5xx
    /// rate look worse. Counting requests as independent (a binomial interval over all
    /// responses) calls that a confident difference; with users as the units, the one
    /// unit's outlier widens the interval to include zero.
    #[test]
    fn one_heavy_user_is_no_evidence_when_users_are_the_units() {
        let holdout = group(
            &(0..8)
                .map(|i| unit(200.0, [2.0, 1.0, 3.0, 2.0, 1.0, 2.0, 3.0, 2.0][i], 40.0))
                .collect::<Vec<_>>(),
        );
        let mut units: Vec<Counts> = (0..8)
            .map(|i| unit(200.0, [1.0, 2.0, 2.0, 3.0, 2.0, 1.0, 2.0, 2.0][i], 40.0))
            .collect();
        // Unit 5 holds a user who sent 200 requests, 40% of them failing (a client bug).
        units[5].add(&unit(200.0, 80.0, 40.0));
        let cohort = group(&units);
        let c = compare(&cohort, &holdout, &Threshold::default());
        let row = *c
            .rows
            .iter()
            .find(|r| r.measure == Measure::ErrorRate)
            .unwrap();

        // Requests as units: rate 95/1800 against 16/1600, a z-interval far from zero.
        let (p1, n1) = (
            c.cohort.responses_5xx / c.cohort.responses,
            c.cohort.responses,
        );
        let (p2, n2) = (
            c.holdout.responses_5xx / c.holdout.responses,
            c.holdout.responses,
        );
        let se = (p1 * (1.0 - p1) / n1 + p2 * (1.0 - p2) / n2).sqrt();
        let requests_low = (p1 - p2) - 1.96 * se;
        assert!(requests_low > 0.03, "requests as units: low {requests_low}");
        println!(
            "5xx difference {:.4}: requests as units [{requests_low:.4}, {:.4}]",
            p1 - p2,
            (p1 - p2) + 1.96 * se
        );

        // Users as units: the same point difference, an interval that includes zero.
        let d = row.difference.unwrap();
        println!(
            "users as units [{:.4}, {:.4}] ({:.1} degrees of freedom)",
            d.low, d.high, d.df
        );
        assert!((d.value - (p1 - p2)).abs() < 1e-12);
        assert!(d.low < 0.0 && d.high > 0.0, "{d:?}");
        assert_eq!(row.verdict, Verdict::NoDetectableDifference);
    }

    /// Under no difference at all, the 95% interval covers zero about 95% of the time
    /// (simulated users with their own error propensity, 8 units per group).
    #[test]
    fn the_interval_covers_zero_at_its_level_when_the_groups_are_alike() {
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let mut uniform = move || {
            // splitmix64
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        };
        let trials = 400;
        let mut covered = 0;
        for _ in 0..trials {
            let mut groups = [Group::default(), Group::default()];
            for g in &mut groups {
                // 80 users per group, each 1–40 requests and an error rate of 0–4%.
                for user in 0..80 {
                    let requests = 1.0 + (uniform() * 40.0).floor();
                    let rate = uniform() * 0.04;
                    let errors = (0..requests as usize).filter(|_| uniform() < rate).count();
                    let counts = g.unit(&(user % UNITS).to_string());
                    counts.responses += requests;
                    counts.responses_5xx += errors as f64;
                }
            }
            let (a, b) = (
                estimate(Measure::ErrorRate, &groups[0]).unwrap(),
                estimate(Measure::ErrorRate, &groups[1]).unwrap(),
            );
            if !welch(&a, &b, CONFIDENCE).unwrap().excludes_zero() {
                covered += 1;
            }
        }
        let coverage = covered as f64 / trials as f64;
        println!("{covered} of {trials} intervals cover 0");
        assert!((0.91..=0.99).contains(&coverage), "coverage {coverage}");
    }

    #[test]
    fn a_small_or_missing_group_gets_no_verdict() {
        let big = group(&vec![unit(100.0, 1.0, 40.0); 8]);
        let threshold = Threshold::default();
        // 8 units but 8 × 20 = 160 responses: under 200.
        let few = group(&vec![unit(20.0, 0.0, 40.0); 8]);
        let c = compare(&big, &few, &threshold);
        assert_eq!(
            c.outcome,
            Outcome::HoldoutTooSmall(TooSmall {
                responses: 160.0,
                units: 8
            })
        );
        assert!(c.rows.iter().all(|r| r.verdict == Verdict::TooSmall));
        assert!(c.rows.iter().all(|r| r.difference.is_none()));
        assert!(c.rows.iter().all(|r| r.point_difference.is_some()));
        // 500 responses in 5 well-filled units and 3 near-empty ones: too few units.
        let mut lopsided: Vec<Counts> = vec![unit(100.0, 1.0, 40.0); 5];
        lopsided.extend(vec![unit(19.0, 0.0, 40.0); 3]);
        assert_eq!(
            compare(&group(&lopsided), &big, &threshold).outcome,
            Outcome::CohortTooSmall(TooSmall {
                responses: 557.0,
                units: 5
            })
        );
        // Exactly at the threshold: compared.
        let mut edge: Vec<Counts> = vec![unit(20.0, 0.0, 40.0); 6];
        edge.push(unit(80.0, 0.0, 40.0));
        assert_eq!(
            compare(&big, &group(&edge), &threshold).outcome,
            Outcome::Compared
        );
        // No hold-out series at all; no series at all.
        let none = Group::default();
        let c = compare(&big, &none, &threshold);
        assert_eq!(c.outcome, Outcome::NoHoldout);
        assert!(c.rows.iter().all(|r| r.verdict == Verdict::NoData));
        assert_eq!(compare(&none, &none, &threshold).outcome, Outcome::NoData);
        assert_eq!(compare(&none, &big, &threshold).outcome, Outcome::NoCohort);
    }

    /// The filter samples the TTFB histogram (one response in 8 by default): groups large
    /// enough by their responses can hold too few samples for a TTFT verdict.
    #[test]
    fn ttft_rows_are_too_small_when_the_histogram_sampled_too_few() {
        let sampled = |n: f64, every: f64| {
            let mut u = unit(n, 1.0, 40.0);
            for b in &mut u.ttfb {
                b.count = (b.count / every).floor();
            }
            u
        };
        // 8 units of 100 responses, 12 sampled each (96 in all): the rates are compared,
        // TTFT is not.
        let cohort = group(&vec![sampled(100.0, 8.0); 8]);
        let holdout = group(&vec![sampled(100.0, 1.0); 8]);
        let c = compare(&cohort, &holdout, &Threshold::default());
        assert_eq!(c.outcome, Outcome::Compared);
        assert_eq!((c.cohort_units, c.cohort_sampled_units), (8, 0));
        assert_eq!(c.holdout_sampled_units, 8);
        for row in &c.rows {
            if row.measure.sampled() {
                assert_eq!(row.verdict, Verdict::TooSmall, "{row:?}");
                assert_eq!(
                    row.too_small,
                    Some((
                        Side::Cohort,
                        TooSmall {
                            responses: 96.0,
                            units: 0
                        }
                    ))
                );
                assert!(row.point_difference.is_some() && row.difference.is_none());
            } else {
                assert_ne!(row.verdict, Verdict::TooSmall, "{row:?}");
                assert_eq!(row.too_small, None);
            }
        }
        // Every response sampled: TTFT compared too.
        let all = group(&vec![sampled(100.0, 1.0); 8]);
        let c = compare(&all, &holdout, &Threshold::default());
        assert!(c.rows.iter().all(|r| r.too_small.is_none()));
    }

    /// A proxy without a hold-out writes no `cohort_unit`: its routed series join the
    /// pooled value, not the replicates.
    #[test]
    fn series_without_a_unit_are_pooled_but_not_a_replicate() {
        let mut units: Vec<Counts> = (0..8).map(|_| unit(100.0, 1.0, 40.0)).collect();
        units[3].responses_5xx = 3.0;
        let mut cohort = group(&units);
        let holdout = group(&vec![unit(100.0, 1.0, 40.0); 8]);
        let before = estimate(Measure::ErrorRate, &cohort).unwrap();
        cohort.units.insert(String::new(), unit(5_000.0, 0.0, 40.0));
        let after = estimate(Measure::ErrorRate, &cohort).unwrap();
        assert_eq!((before.units, after.units), (8, 8));
        assert_eq!(before.variance, after.variance);
        assert!((after.value - 10.0 / 5_800.0).abs() < 1e-12, "{after:?}");
        let c = compare(&cohort, &holdout, &Threshold::default());
        assert_eq!((c.outcome, c.cohort_units), (Outcome::Compared, 8));
        // Only unlabelled series: no replicates, too small.
        let mut bare = Group::default();
        bare.units.insert(String::new(), unit(5_000.0, 0.0, 40.0));
        assert_eq!(
            compare(&cohort, &bare, &Threshold::default()).outcome,
            Outcome::HoldoutTooSmall(TooSmall {
                responses: 0.0,
                units: 0
            })
        );
    }

    #[test]
    fn a_measure_without_data_says_so() {
        // Engines that report no usage: no cached share in either group.
        let mut units = vec![unit(100.0, 1.0, 40.0); 8];
        for u in &mut units {
            u.prompt_tokens = 0.0;
            u.cached_tokens = 0.0;
        }
        let g = group(&units);
        let c = compare(&g, &g, &Threshold::default());
        let cached = c
            .rows
            .iter()
            .find(|r| r.measure == Measure::CachedShare)
            .unwrap();
        assert_eq!((cached.verdict, cached.cohort), (Verdict::NoData, None));
    }

    #[test]
    fn verdicts_follow_the_measure_s_direction() {
        let d = |value: f64, low: f64, high: f64| Difference {
            value,
            low,
            high,
            df: 7.0,
        };
        assert_eq!(verdict(Measure::TtftP50, &d(5.0, 1.0, 9.0)), Verdict::Worse);
        assert_eq!(
            verdict(Measure::TtftP95, &d(-5.0, -9.0, -1.0)),
            Verdict::Better
        );
        assert_eq!(
            verdict(Measure::CachedShare, &d(0.1, 0.05, 0.15)),
            Verdict::Better
        );
        assert_eq!(
            verdict(Measure::ErrorRate, &d(0.01, 0.001, 0.02)),
            Verdict::Worse
        );
        assert_eq!(
            verdict(Measure::ErrorRate, &d(0.01, -0.001, 0.02)),
            Verdict::NoDetectableDifference
        );
    }
}
