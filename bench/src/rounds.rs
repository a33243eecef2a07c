//! Figures over rounds: on a shared machine one run's figures can be a neighbour's, so the
//! benches that take rounds print medians, and each ratio as the median of the rounds' own ratios
//! (figures taken minutes apart do not compare) with its range.

/// The median of the figures that are numbers (NaN when none is).
pub fn median(v: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A ratio's median over rounds and, over several, its range.
pub fn ratio_text(v: &[f64]) -> String {
    let m = median(v.iter().copied());
    if v.len() < 2 {
        return format!("{m:.2}");
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{m:.2} ({lo:.2}–{hi:.2})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_skip_what_is_no_figure_and_ratios_carry_their_range() {
        // The direct path has no proxy CPU: its NaN is no figure, not the median.
        assert!(median([f64::NAN, f64::NAN].into_iter()).is_nan());
        assert_eq!(median([3.0, f64::NAN, 1.0, 2.0].into_iter()), 2.0);
        assert_eq!(median([4.0, 1.0].into_iter()), 2.5);
        assert_eq!(ratio_text(&[0.8]), "0.80");
        assert_eq!(ratio_text(&[0.9, 0.7, 1.2]), "0.90 (0.70–1.20)");
    }
}
