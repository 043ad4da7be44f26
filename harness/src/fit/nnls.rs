//! Non-negative least squares: min ‖A·x − b‖₂ subject to x ≥ 0, by the Lawson–Hanson active-set
//! method. Every unconstrained sub-problem is solved by nalgebra's SVD least squares; columns
//! are scaled to unit norm first (bytes span nine orders of magnitude).
use nalgebra::{DMatrix, DVector};

const MAX_OUTER: usize = 200;

/// Least squares restricted to the columns in `passive` (others are zero).
fn solve_on(a: &DMatrix<f64>, b: &DVector<f64>, passive: &[bool]) -> DVector<f64> {
    let cols: Vec<usize> = (0..a.ncols()).filter(|&j| passive[j]).collect();
    let mut x = DVector::zeros(a.ncols());
    if cols.is_empty() {
        return x;
    }
    let sub = a.select_columns(&cols);
    let sol = sub
        .svd(true, true)
        .solve(b, 1e-12)
        .expect("SVD computed with U and V^T");
    for (k, &j) in cols.iter().enumerate() {
        x[j] = sol[k];
    }
    x
}

/// Solves NNLS. `a` is rows × features; returns one non-negative coefficient per column.
pub fn nnls(a: &DMatrix<f64>, b: &DVector<f64>) -> DVector<f64> {
    let n = a.ncols();
    let scale: Vec<f64> = (0..n)
        .map(|j| {
            let s = a.column(j).norm();
            if s > 0.0 {
                s
            } else {
                1.0
            }
        })
        .collect();
    let mut an = a.clone();
    for (j, s) in scale.iter().enumerate() {
        an.column_mut(j).scale_mut(1.0 / s);
    }
    let tol = 1e-10 * b.norm().max(1.0);
    let mut passive = vec![false; n];
    let mut x = DVector::<f64>::zeros(n);
    for _ in 0..MAX_OUTER {
        let w = an.transpose() * (b - &an * &x);
        let candidate = (0..n)
            .filter(|&j| !passive[j] && w[j] > tol)
            .max_by(|&i, &j| w[i].total_cmp(&w[j]));
        let Some(j) = candidate else { break };
        passive[j] = true;
        loop {
            let z = solve_on(&an, b, &passive);
            if (0..n).all(|k| !passive[k] || z[k] > 0.0) {
                x = z;
                break;
            }
            // Step back towards x until the first passive coefficient reaches zero.
            let alpha = (0..n)
                .filter(|&k| passive[k] && z[k] <= 0.0)
                .map(|k| x[k] / (x[k] - z[k]))
                .fold(f64::INFINITY, f64::min);
            x += (z - &x) * alpha;
            for k in 0..n {
                if passive[k] && x[k] <= 1e-15 {
                    passive[k] = false;
                    x[k] = 0.0;
                }
            }
            if !passive.iter().any(|&p| p) {
                break;
            }
        }
    }
    DVector::from_iterator(n, (0..n).map(|j| x[j] / scale[j]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_non_negative_coefficients() {
        // y = 3 + 2·x1 + 0·x2, exactly.
        let a = DMatrix::from_row_slice(
            5,
            3,
            &[
                1.0, 1.0, 5.0, 1.0, 2.0, 1.0, 1.0, 3.0, 4.0, 1.0, 4.0, 2.0, 1.0, 5.0, 3.0,
            ],
        );
        let b = DVector::from_vec(vec![5.0, 7.0, 9.0, 11.0, 13.0]);
        let x = nnls(&a, &b);
        assert!(
            (x[0] - 3.0).abs() < 1e-9 && (x[1] - 2.0).abs() < 1e-9 && x[2].abs() < 1e-9,
            "{x}"
        );
    }

    #[test]
    fn clamps_a_negative_unconstrained_solution() {
        // Unconstrained: y = 10 − x. NNLS must return x's coefficient 0 and the mean as offset.
        let a = DMatrix::from_row_slice(3, 2, &[1.0, 1.0, 1.0, 2.0, 1.0, 3.0]);
        let b = DVector::from_vec(vec![9.0, 8.0, 7.0]);
        let x = nnls(&a, &b);
        assert!((x[0] - 8.0).abs() < 1e-9 && x[1] == 0.0, "{x}");
    }

    /// The exact NNLS optimum of a small problem: the best non-negative least-squares solution
    /// over every support.
    fn brute_force_sse(a: &DMatrix<f64>, b: &DVector<f64>) -> f64 {
        let n = a.ncols();
        let mut best = b.norm_squared();
        for mask in 1u32..(1 << n) {
            let cols: Vec<usize> = (0..n).filter(|j| mask & (1 << j) != 0).collect();
            let sub = a.select_columns(&cols);
            let z = solve_on(&sub, b, &vec![true; cols.len()]);
            if z.iter().all(|&v| v >= 0.0) {
                best = best.min((b - &sub * z).norm_squared());
            }
        }
        best
    }

    #[test]
    fn reaches_the_optimum_on_collinear_designs() {
        // Designs like a fit group's: a constant column, proportional columns (act and logits
        // are both ∝ batch), a column that is the sum of two others; exact and noisy targets.
        let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        for case in 0..400 {
            let (m, n) = (3 + (rnd() * 10.0) as usize, 3 + (rnd() * 4.0) as usize);
            let mut a = DMatrix::from_fn(m, n, |_, _| {
                (rnd() * 10.0).round() * 10f64.powi((rnd() * 7.0) as i32)
            });
            a.column_mut(0).fill(1.0);
            let c = 0.5 + rnd() * 3.0;
            let col = a.column(1) * c;
            a.set_column(2, &col);
            if n > 4 {
                let sum = a.column(1) + a.column(3);
                a.set_column(n - 1, &sum);
            }
            let truth = DVector::from_fn(n, |_, _| if rnd() < 0.3 { 0.0 } else { rnd() * 3.0 });
            let mut b = &a * &truth;
            if case % 2 == 1 {
                let amp = 0.2 * b.amax();
                b.iter_mut().for_each(|v| *v += (rnd() - 0.5) * amp);
            }
            let x = nnls(&a, &b);
            assert!(x.iter().all(|v| v.is_finite() && *v >= 0.0), "{x}");
            let (got, best) = ((&b - &a * &x).norm_squared(), brute_force_sse(&a, &b));
            assert!(
                got <= best * (1.0 + 1e-9) + 1e-10 * b.norm_squared(),
                "case {case}: nnls SSE {got:e}, optimum {best:e}; x {x}"
            );
        }
    }
}
