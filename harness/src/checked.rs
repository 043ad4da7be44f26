//! Overflow-checked byte and element counts. Every figure an estimate derives from a query (its
//! batch, context, resolution) or a config is a [`Checked`]: `+`, `*` and the other operations
//! return the exact value or an overflow that poisons the rest of the expression, so a figure
//! past 2^64 B is never silently wrapped or saturated. [`Checked::bytes`] turns it back into a
//! `u64`, naming the figure in the [`Overflow`] when it does not fit.
use std::ops::{Add, Div, Mul};

/// A `u64` count, or the overflow of the arithmetic that produced it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checked(Option<u64>);

/// A figure that exceeds 64-bit bytes; `figure` names it ("activations", "KV cache", ...).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the estimate's byte figures exceed 2^64 B ({figure})")]
pub struct Overflow {
    pub figure: String,
}

impl Overflow {
    pub fn new(figure: impl Into<String>) -> Self {
        Overflow {
            figure: figure.into(),
        }
    }
}

impl Checked {
    pub const ZERO: Checked = Checked(Some(0));

    pub const fn new(v: u64) -> Self {
        Checked(Some(v))
    }

    /// A non-negative real figure (a fitted or regressed byte count), rounded: negative
    /// values are 0; NaN, infinities and values of 2^64 or more overflow (an `as u64` cast
    /// would saturate them silently).
    pub fn from_f64(x: f64) -> Self {
        const LIMIT: f64 = 18_446_744_073_709_551_616.0; // 2^64
        let r = x.max(0.0).round();
        // `f64::max` drops a NaN; +inf is beyond the limit.
        Checked((!x.is_nan() && r < LIMIT).then_some(r as u64))
    }

    /// The product of a tensor's dimensions.
    pub fn product(dims: &[usize]) -> Self {
        dims.iter()
            .fold(Checked::new(1), |p, &d| p * Checked::from(d))
    }

    /// The value, or None after an overflow.
    pub const fn get(self) -> Option<u64> {
        self.0
    }

    /// The value, or an [`Overflow`] naming `figure`.
    pub fn bytes(self, figure: &str) -> Result<u64, Overflow> {
        self.0.ok_or_else(|| Overflow::new(figure))
    }

    pub fn is_overflow(self) -> bool {
        self.0.is_none()
    }

    /// The larger of the two; an overflow is larger than every value.
    pub fn max(self, other: impl Into<Checked>) -> Self {
        self.zip(other.into(), |a, b| Some(a.max(b)))
    }

    /// The smaller of the two; an overflow is larger than every value.
    pub fn min(self, other: impl Into<Checked>) -> Self {
        match (self.0, other.into().0) {
            (Some(a), Some(b)) => Checked(Some(a.min(b))),
            (Some(a), None) | (None, Some(a)) => Checked(Some(a)),
            (None, None) => Checked(None),
        }
    }

    /// `self − other`, at least 0 (an overflowed `self` stays overflowed; an overflowed
    /// `other` leaves nothing of a finite `self`).
    pub fn saturating_sub(self, other: impl Into<Checked>) -> Self {
        match (self.0, other.into().0) {
            (Some(a), Some(b)) => Checked(Some(a.saturating_sub(b))),
            (Some(_), None) => Checked::ZERO,
            (None, _) => Checked(None),
        }
    }

    /// `self / n` rounded up (n > 0).
    pub fn div_ceil(self, n: u64) -> Self {
        Checked(self.0.map(|a| a.div_ceil(n)))
    }

    fn zip(self, other: Checked, f: impl FnOnce(u64, u64) -> Option<u64>) -> Self {
        Checked(self.0.zip(other.0).and_then(|(a, b)| f(a, b)))
    }
}

impl From<u64> for Checked {
    fn from(v: u64) -> Self {
        Checked(Some(v))
    }
}

impl From<usize> for Checked {
    fn from(v: usize) -> Self {
        Checked(u64::try_from(v).ok())
    }
}

impl<T: Into<Checked>> Add<T> for Checked {
    type Output = Checked;
    fn add(self, rhs: T) -> Checked {
        self.zip(rhs.into(), u64::checked_add)
    }
}

impl<T: Into<Checked>> Mul<T> for Checked {
    type Output = Checked;
    fn mul(self, rhs: T) -> Checked {
        self.zip(rhs.into(), u64::checked_mul)
    }
}

/// Division by a positive count (a division never overflows; by 0 it panics, like `u64`).
impl Div<u64> for Checked {
    type Output = Checked;
    fn div(self, rhs: u64) -> Checked {
        Checked(self.0.map(|a| a / rhs))
    }
}

impl<T: Into<Checked>> std::iter::Sum<T> for Checked {
    fn sum<I: Iterator<Item = T>>(iter: I) -> Checked {
        iter.fold(Checked::ZERO, |s, x| s + x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: u64 = u64::MAX;

    #[test]
    fn exact_below_the_limit() {
        let c = Checked::new(3) * 4u64 + Checked::from(5usize);
        assert_eq!(c.get(), Some(17));
        assert_eq!((Checked::new(MAX - 1) + 1u64).bytes("x"), Ok(MAX));
        assert_eq!((Checked::new(1 << 32) * (1u64 << 31)).get(), Some(1 << 63));
        assert_eq!(Checked::product(&[2, 3, 7]).get(), Some(42));
        assert_eq!(Checked::product(&[]).get(), Some(1));
        assert_eq!(
            [1u64, 2, 3].into_iter().sum::<Checked>().get(),
            Some(6),
            "sum"
        );
        assert_eq!((Checked::new(7) / 2).get(), Some(3));
        assert_eq!(Checked::new(7).div_ceil(2).get(), Some(4));
        assert_eq!(Checked::new(7).saturating_sub(9u64).get(), Some(0));
    }

    #[test]
    fn an_overflow_poisons_the_expression_and_names_its_figure() {
        let over = Checked::new(MAX) + 1u64;
        assert!(over.is_overflow());
        assert!((Checked::new(1 << 32) * (1u64 << 32)).is_overflow());
        // Nothing brings it back: not a multiplication by 0, a division, or a later sum.
        let zero = Checked::ZERO;
        assert!((over * zero).is_overflow());
        assert!((over / 1_000_000).is_overflow());
        assert!([Checked::new(1), over, Checked::new(2)]
            .into_iter()
            .sum::<Checked>()
            .is_overflow());
        assert!(Checked::product(&[usize::MAX, 2]).is_overflow());
        assert_eq!(
            over.bytes("activations").unwrap_err().to_string(),
            "the estimate's byte figures exceed 2^64 B (activations)"
        );
        // An overflow is larger than every value.
        assert!(over.max(5u64).is_overflow());
        assert_eq!(over.min(5u64).get(), Some(5));
        assert_eq!(Checked::new(5).saturating_sub(over), Checked::ZERO);
        assert!(over.saturating_sub(5u64).is_overflow());
    }

    #[test]
    fn reals_overflow_instead_of_saturating() {
        assert_eq!(Checked::from_f64(2.4).get(), Some(2));
        assert_eq!(Checked::from_f64(-7.0).get(), Some(0));
        assert_eq!(
            Checked::from_f64(1e19).get(),
            Some(10_000_000_000_000_000_000)
        );
        for x in [f64::NAN, f64::INFINITY, 1.8446744073709552e19, 1e300] {
            assert!(Checked::from_f64(x).is_overflow(), "{x}");
        }
        // NaN does not hide behind max(0.0).
        assert!(Checked::from_f64(-f64::NAN).is_overflow());
    }
}
