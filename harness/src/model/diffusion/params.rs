//! Parameter counts of the layers the diffusion models share, from their sizes alone (the
//! analytic counts that the tests hold against the recorded tensor shapes).

/// Parameters of a linear layer of `i` → `o` features with a bias.
pub fn linear_params(i: u64, o: u64) -> u64 {
    i * o + o
}

/// Parameters of a convolution of `i` → `o` channels over `taps` kernel positions with a bias:
/// `k * k` for a k×k 2D kernel, `kt * kh * kw` for a 3D one.
pub fn conv_params(i: u64, o: u64, taps: u64) -> u64 {
    i * o * taps + o
}
