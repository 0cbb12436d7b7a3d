//! Summaries of measured samples: median, percentiles, coefficient of
//! variation. Pure functions, used by the bench and the controller's tests.
//! A summary of no samples is `None`, never 0: a missing measurement must not
//! read as a good one.

/// The median: the middle value, or the mean of the middle two for an even
/// count (the median of 2 runs is their mean, not the larger). Non-finite
/// values are left out; None if nothing is left.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    let n = s.len();
    Some(if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 })
}

/// The `p` quantile (0-1) of sorted values, nearest rank; None for no values.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * p.clamp(0.0, 1.0)).round() as usize;
    Some(sorted[i.min(sorted.len() - 1)])
}

/// Standard deviation over mean; None for fewer than two values or a zero mean.
pub fn coefficient_of_variation(v: &[f64]) -> Option<f64> {
    if v.len() < 2 {
        return None;
    }
    let m = v.iter().sum::<f64>() / v.len() as f64;
    if m == 0.0 {
        return None;
    }
    Some((v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64).sqrt() / m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&[100.0, 200.0]), Some(150.0), "regression: the median of 2 was the larger");
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[f64::INFINITY, 1.0, 2.0]), Some(1.5), "non-finite values are left out");
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN]), None);
    }

    #[test]
    fn no_samples_have_no_percentile() {
        assert_eq!(percentile(&[], 0.99), None, "regression: 100% probe loss read as a p99 of 0");
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.99), Some(99.0));
        assert_eq!(percentile(&v, 0.5), Some(51.0));
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
    }

    #[test]
    fn coefficient_of_variation_needs_two_values_and_a_mean() {
        assert_eq!(coefficient_of_variation(&[5.0]), None);
        assert_eq!(coefficient_of_variation(&[0.0, 0.0]), None);
        let cv = coefficient_of_variation(&[9.0, 11.0]).unwrap();
        assert!((cv - 0.1).abs() < 1e-12, "{cv}");
    }
}
