//! Perturbed reference runs (seed 002, sections 4.5 and 5), shared by `trace emit` and
//! `shardproof run --dtype bf16`: the spec reruns with every float input multiplied by
//! `1 + eps * u` (`eps` the dtype's machine epsilon, `u` uniform in [-1, 1) from a seeded
//! hash), each output's response is its relative error from the unperturbed run, and the
//! tolerance model of [`crate::tolerance`] turns responses into tolerances. Integer and
//! boolean inputs (token ids, masks) are never perturbed: they are exact in every run.

use crate::format::{CanonicalId, Kind, RunDtype};
use crate::sums::Sums;
use crate::tolerance::{Measurement, Model, Tolerance};
use shardproof_case::Case;
use shardproof_ops::Tensor;
use std::collections::BTreeMap;

/// splitmix64.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A value in [-1, 1) from a seed, a name and an element index.
pub fn uniform(seed: u64, name: &str, element: u64) -> f64 {
    let h = name.bytes().fold(mix(seed), |h, b| mix(h ^ u64::from(b)));
    (mix(h ^ mix(element)) >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// The seed of perturbed run `run` of a run seeded `seed`.
pub fn run_seed(seed: u64, run: u64) -> u64 {
    mix(seed ^ (run + 1))
}

/// `leaves` with every float tensor perturbed by a relative `eps * u`, `u` from `seed`.
pub fn perturb(leaves: &BTreeMap<String, Tensor>, eps: f64, seed: u64) -> BTreeMap<String, Tensor> {
    leaves
        .iter()
        .map(|(name, t)| {
            if !t.dtype().is_float() {
                return (name.clone(), t.clone());
            }
            let data = t
                .data
                .iter()
                .enumerate()
                .map(|(e, x)| x * (1.0 + eps * uniform(seed, name, e as u64)))
                .collect();
            (name.clone(), Tensor::new(t.meta.clone(), data))
        })
        .collect()
}

/// `||reference - other|| / ||reference||`, as `trace compare` measures it.
pub fn relative_error(reference: &[f64], other: &[f64]) -> f64 {
    let mut sums = Sums::default();
    for (b, a) in reference.iter().zip(other) {
        let d = a - b;
        sums.diff_sq += if d.is_nan() && !b.is_nan() {
            f64::INFINITY
        } else {
            d * d
        };
        sums.ref_sq += b * b;
    }
    sums.relative_error()
}

/// The canonical id of a case's output expectation `name`: `NAME_new` of an input `NAME` is
/// that parameter's `param_after_step`, anything else a `forward_output` of its own name.
pub fn output_id(case: &Case, name: &str) -> CanonicalId {
    match name
        .strip_suffix("_new")
        .filter(|p| case.inputs.iter().any(|i| i.spec_name == *p))
    {
        Some(param) => CanonicalId::new(0, 0, Kind::ParamAfterStep, param, 0),
        None => CanonicalId::new(0, 0, Kind::ForwardOutput, name, 0),
    }
}

/// The tolerances of tensors from their perturbation responses: `responses[k]` lists the
/// relative errors of tensor `k` in each perturbed run (at a relative perturbation of one
/// machine epsilon). The largest response is the measurement, then the growth model and the
/// safety factor of [`crate::tolerance`] apply, exactly as `trace compare` does.
pub fn tolerances(dtype: RunDtype, ids: &[CanonicalId], responses: &[Vec<f64>]) -> Vec<Tolerance> {
    // A non-finite response (a run that overflowed, or values not finite to begin with)
    // measures nothing, as in `trace compare`: such a tensor keeps the dtype default.
    let measured: Vec<Option<f64>> = responses
        .iter()
        .map(|r| r.iter().copied().filter(|x| x.is_finite()).reduce(f64::max))
        .collect();
    // A case's outputs are not one-element statistics of the kind the growth model leaves
    // alone (see `crate::tolerance`); their sizes are not at hand here.
    let pairs: Vec<Measurement> = ids
        .iter()
        .zip(measured.iter().copied())
        .map(|(id, response)| Measurement {
            id,
            elements: None,
            response,
        })
        .collect();
    let perturbed = responses.iter().any(|r| !r.is_empty());
    let model = Model::fit(dtype, &pairs, perturbed);
    pairs.iter().map(|m| model.tolerance(m)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tolerance::{Source, SAFETY_FACTOR};
    use shardproof_ir::DType;
    use shardproof_ops::Meta;

    #[test]
    fn only_floats_are_perturbed_and_only_by_eps() {
        let mut leaves = BTreeMap::new();
        let x = Tensor::new(Meta::new(DType::F32, vec![4]), vec![1.0, -2.0, 3.0, 0.5]);
        let ids = Tensor::new(Meta::new(DType::I64, vec![2]), vec![3.0, 7.0]);
        leaves.insert("x".to_string(), x.clone());
        leaves.insert("ids".to_string(), ids.clone());
        let eps = RunDtype::Bfloat16.epsilon();
        let p = perturb(&leaves, eps, run_seed(0, 0));
        assert_eq!(p["ids"].data, ids.data);
        assert_ne!(p["x"].data, x.data);
        for (a, b) in p["x"].data.iter().zip(x.data.iter()) {
            assert!(((a - b) / b).abs() <= eps);
        }
        assert!(relative_error(&x.data, &p["x"].data) <= eps);
        assert_eq!(relative_error(&[0.0], &[0.0]), 0.0);
        assert_eq!(relative_error(&[0.0], &[1.0]), f64::INFINITY);
        assert_eq!(relative_error(&[1.0], &[f64::NAN]), f64::INFINITY);
    }

    #[test]
    fn tolerances_follow_the_largest_response() {
        let eps = RunDtype::Bfloat16.epsilon();
        let ids = [CanonicalId::new(0, 0, Kind::ForwardOutput, "loss", 0)];
        let t = tolerances(RunDtype::Bfloat16, &ids, &[vec![eps, 3.0 * eps]]);
        assert_eq!(t[0].source, Source::Perturbation);
        assert!((t[0].value - SAFETY_FACTOR * 3.0 * eps).abs() < 1e-15);
        let none = tolerances(RunDtype::Bfloat16, &ids, &[vec![]]);
        assert_eq!(none[0].source, Source::DtypeDefault);
        let overflowed = tolerances(RunDtype::Bfloat16, &ids, &[vec![f64::INFINITY]]);
        assert_eq!(overflowed[0].source, Source::DtypeDefault);
        assert!(overflowed[0].value.is_finite());
    }
}
