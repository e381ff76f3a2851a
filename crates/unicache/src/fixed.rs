//! Fixed-point arithmetic (Q32: value × 2^32 in a u64) for LeCaR's weights. Every replica must
//! make the same eviction choice, so the policy may not depend on a platform's floating-point
//! `exp`; these functions are exact integer computations, identical everywhere.

pub const ONE: u64 = 1 << 32;

/// a × b in Q32.
pub fn mul(a: u64, b: u64) -> u64 {
    ((u128::from(a) * u128::from(b)) >> 32) as u64
}

/// a / b in Q32; b must be positive.
pub fn div(a: u64, b: u64) -> u64 {
    ((u128::from(a) << 32) / u128::from(b)) as u64
}

/// e^x for x in Q32 with 0 ≤ x < 1 (Taylor series; the error is below 2^-32 · 3).
fn exp_fraction(x: u64) -> u64 {
    debug_assert!(x < ONE);
    let mut sum = ONE;
    let mut term = ONE;
    for k in 1..=12u64 {
        term = mul(term, x) / k;
        if term == 0 {
            break;
        }
        sum += term;
    }
    sum
}

/// e^-1 in Q32.
const EXP_MINUS_ONE: u64 = 1_580_030_169;

/// e^x for 0 ≤ x < 1, in Q32.
pub fn exp(x: u64) -> u64 {
    exp_fraction(x.min(ONE - 1))
}

/// e^-y for y ≥ 0 (Q32), in Q32; underflows to 0.
pub fn exp_neg(y: u64) -> u64 {
    let whole = y >> 32;
    if whole >= 23 {
        return 0;
    }
    let mut result = div(ONE, exp_fraction(y & (ONE - 1)));
    for _ in 0..whole {
        result = mul(result, EXP_MINUS_ONE);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to_f64(q: u64) -> f64 {
        q as f64 / ONE as f64
    }

    fn from_f64(x: f64) -> u64 {
        (x * ONE as f64) as u64
    }

    #[test]
    fn exp_matches_floating_point_closely() {
        for x in [0.0, 0.001, 0.1, 0.45, 0.9, 0.999] {
            let got = to_f64(exp(from_f64(x)));
            assert!((got - x.exp()).abs() < 1e-8, "e^{x}: {got}");
        }
        for y in [0.0, 0.5, 1.0, 2.5, 5.3, 10.0, 22.9] {
            let got = to_f64(exp_neg(from_f64(y)));
            assert!((got - (-y).exp()).abs() < 1e-8, "e^-{y}: {got}");
        }
        assert_eq!(exp_neg(from_f64(40.0)), 0);
        assert!((to_f64(EXP_MINUS_ONE) - (-1f64).exp()).abs() < 1e-9);
    }
}
