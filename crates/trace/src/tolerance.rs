//! Each tensor's tolerance from the reference's perturbation responses (seed 002, sections 4.5
//! and 5).
//!
//! A perturbed run reruns the reference with its inputs perturbed at machine-epsilon scale; the
//! response `rel_err(reference, perturbed)` of a tensor estimates how far rounding alone moves
//! it (section 5.2: rounding and a perturbation of that size travel the same Lipschitz paths).
//! Responses are normalized to a perturbation of exactly one machine epsilon (they are linear in
//! its size at this scale), and the largest over the perturbed runs is the tensor's measured
//! response.
//!
//! The growth model of section 5.1 then smooths the measurements across layers, where it
//! applies: activations (forward kinds) grow as `eta * sqrt(l) * eps` (Theorem 2), gradients
//! (backward kinds and `main_grad`) as `sigma * sqrt(L / l) * eps` (Theorem 3), `l` the 1-based
//! layer and `L` the number of layers. `eta` and `sigma` are fitted per kind as the median of
//! the measured responses over the model's shape; a tensor's estimate is the larger of its
//! measurement and the fitted model, so a layer whose single measurement happened to be small
//! does not get a tolerance below the trend. Parameters (`param_*_step`) and tensors with no
//! layer index keep their measurement.
//!
//! The tolerance is [`SAFETY_FACTOR`] times the estimate (the candidate's own rounding adds to
//! the reference's, and one perturbed run samples the response once), and never below one
//! machine epsilon of the run's dtype (the rounding of the stored values themselves). With no
//! perturbed run, every tensor gets [`DEFAULT_FACTOR`] machine epsilons and the report says so.

use crate::format::{CanonicalId, Kind, Phase, RunDtype};

/// Tolerance over estimated error: the candidate's and the reference's rounding add up, and a
/// single perturbation samples the response once.
pub const SAFETY_FACTOR: f64 = 4.0;

/// The tolerance, in machine epsilons of the run's dtype, of a reference with no perturbed run.
pub const DEFAULT_FACTOR: f64 = 16.0;

/// Where a tensor's tolerance comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Its own perturbation response.
    Perturbation,
    /// The growth model fitted across layers (larger than its own response).
    GrowthModel,
    /// The floor of one machine epsilon (its response was smaller).
    Floor,
    /// No perturbed run measured it: the dtype default.
    DtypeDefault,
}

/// The layer of a module name: its first dot-separated component that is a number
/// (`layers.3.mlp.fc1` is layer 3).
///
/// ```
/// assert_eq!(shardproof_trace::tolerance::layer_of("layers.3.mlp.fc1"), Some(3));
/// assert_eq!(shardproof_trace::tolerance::layer_of("embedding"), None);
/// ```
pub fn layer_of(module: &str) -> Option<u64> {
    module.split('.').find_map(|c| c.parse::<u64>().ok())
}

/// The shape of the growth model for a kind at 1-based layer `l` of `layers`, or `None` where
/// the model does not apply.
fn growth(kind: Kind, l: u64, layers: u64) -> Option<f64> {
    match kind.phase() {
        Phase::Forward => Some((l as f64).sqrt()),
        Phase::Backward => Some((layers as f64 / l as f64).sqrt()),
        Phase::Optimizer if kind == Kind::MainGrad => Some((layers as f64 / l as f64).sqrt()),
        Phase::Optimizer => None,
    }
}

/// A fitted coefficient of the growth model.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Fit {
    /// The kind it is fitted for.
    pub kind: Kind,
    /// `eta` or `sigma`, in machine epsilons.
    pub coefficient: f64,
    /// Measurements it is fitted on.
    pub points: usize,
}

/// A tensor's tolerance and where it comes from.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Tolerance {
    /// The largest relative error accepted.
    pub value: f64,
    /// Where it comes from.
    pub source: Source,
}

/// The tolerances of a trace's tensors.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Model {
    /// Machine epsilon of the run's dtype.
    pub epsilon: f64,
    /// Number of layers (one more than the largest layer index), 0 when no module has one.
    pub layers: u64,
    /// The growth model's coefficients, by kind.
    pub fits: Vec<Fit>,
    /// Whether any perturbed run exists.
    pub perturbed: bool,
}

impl Model {
    /// Fits the model on every tensor's measured response (normalized to one machine
    /// epsilon; `None` where no perturbed run measured the tensor).
    pub fn fit(
        dtype: RunDtype,
        measured: &[(&CanonicalId, Option<f64>)],
        perturbed: bool,
    ) -> Model {
        let epsilon = dtype.epsilon();
        let layers = measured
            .iter()
            .filter_map(|(id, _)| layer_of(&id.module))
            .max()
            .map_or(0, |l| l + 1);
        let mut fits = Vec::new();
        for kind in Kind::ALL {
            let mut ratios: Vec<f64> = Vec::new();
            let mut distinct_layers = std::collections::BTreeSet::new();
            for (id, response) in measured {
                let (Some(r), Some(l)) = (response, layer_of(&id.module)) else {
                    continue;
                };
                if id.kind != kind || *r <= 0.0 || !r.is_finite() {
                    continue;
                }
                if let Some(shape) = growth(kind, l + 1, layers) {
                    ratios.push(r / (shape * epsilon));
                    distinct_layers.insert(l);
                }
            }
            // A trend needs two layers; with one, the measurement is all there is.
            if distinct_layers.len() < 2 {
                continue;
            }
            ratios.sort_by(f64::total_cmp);
            let median = ratios[ratios.len() / 2];
            fits.push(Fit {
                kind,
                coefficient: median,
                points: ratios.len(),
            });
        }
        Model {
            epsilon,
            layers,
            fits,
            perturbed,
        }
    }

    /// The growth model's estimate for `id`, if it applies.
    pub fn predicted(&self, id: &CanonicalId) -> Option<f64> {
        let fit = self.fits.iter().find(|f| f.kind == id.kind)?;
        let l = layer_of(&id.module)?;
        Some(fit.coefficient * growth(id.kind, l + 1, self.layers)? * self.epsilon)
    }

    /// The tolerance of `id` whose measured response is `measured`.
    pub fn tolerance(&self, id: &CanonicalId, measured: Option<f64>) -> Tolerance {
        let Some(measured) = measured.filter(|_| self.perturbed) else {
            return Tolerance {
                value: DEFAULT_FACTOR * self.epsilon,
                source: Source::DtypeDefault,
            };
        };
        let (estimate, mut source) = match self.predicted(id) {
            Some(p) if p > measured => (p, Source::GrowthModel),
            _ => (measured, Source::Perturbation),
        };
        let mut value = SAFETY_FACTOR * estimate;
        if value < self.epsilon {
            (value, source) = (self.epsilon, Source::Floor);
        }
        Tolerance { value, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(kind: Kind, module: &str) -> CanonicalId {
        CanonicalId::new(0, 0, kind, module, 0)
    }

    #[test]
    fn the_growth_model_lifts_a_layer_below_the_trend() {
        let eps = RunDtype::Bfloat16.epsilon();
        let ids: Vec<CanonicalId> = (0..4)
            .map(|l| id(Kind::ForwardOutput, &format!("layers.{l}.mlp")))
            .collect();
        // Responses follow sqrt(l) * eps, except layer 2 measured far below.
        let responses = [1.0, 2f64.sqrt(), 0.1, 2.0].map(|r| Some(r * eps));
        let measured: Vec<(&CanonicalId, Option<f64>)> = ids.iter().zip(responses).collect();
        let model = Model::fit(RunDtype::Bfloat16, &measured, true);
        assert_eq!(model.layers, 4);
        let t2 = model.tolerance(&ids[2], responses[2]);
        assert_eq!(t2.source, Source::GrowthModel);
        assert!(
            (t2.value - SAFETY_FACTOR * 3f64.sqrt() * model.fits[0].coefficient * eps).abs()
                < 1e-12
        );
        let t3 = model.tolerance(&ids[3], responses[3]);
        assert!(t3.value >= SAFETY_FACTOR * 2.0 * eps * 0.999);
    }

    #[test]
    fn without_perturbed_runs_the_dtype_default_applies() {
        let a = id(Kind::ParamGrad, "layers.0.w");
        let model = Model::fit(RunDtype::Float32, &[(&a, None)], false);
        let t = model.tolerance(&a, None);
        assert_eq!(t.source, Source::DtypeDefault);
        assert_eq!(t.value, DEFAULT_FACTOR * f64::from(f32::EPSILON));
    }

    #[test]
    fn a_zero_response_gets_the_floor() {
        let a = id(Kind::ParamBeforeStep, "layers.0.w");
        let model = Model::fit(RunDtype::Bfloat16, &[(&a, Some(0.0))], true);
        assert_eq!(
            model.tolerance(&a, Some(0.0)),
            Tolerance {
                value: 2f64.powi(-7),
                source: Source::Floor
            }
        );
    }
}
