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
//! does not get a tolerance below the trend. Parameters (`param_*_step`), tensors with no
//! layer index and one-element tensors keep their measurement: Theorems 2 and 3 bound the
//! relative Frobenius error of activations and gradients, whose norm averages over many
//! elements, while a one-element tensor (a loss, or an fp8 cast's amax, the largest magnitude
//! of a tensor reduced across ranks) moves with a single element: the trend of the layer's
//! activations says nothing about it, and lifting it to that trend would hide a scale computed
//! over the wrong group (Table 1 bug 7).
//!
//! Tolerances are in units of [`RunDtype::precision`]: the machine epsilon of the dtype tensors
//! are stored in, which for emulated fp8 is bf16's (seed Figure 8: fp8 errors are normalized
//! by bf16's precision because the mixed-precision recipe stores tensors in bf16).
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

/// One tensor's measurement for [`Model::fit`] and [`Model::tolerance`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measurement<'a> {
    /// The tensor.
    pub id: &'a CanonicalId,
    /// Its element count, where known (`None`: assumed many, so the growth model applies).
    pub elements: Option<u64>,
    /// Its largest perturbation response, normalized to one unit of precision (`None`: no
    /// perturbed run measured it).
    pub response: Option<f64>,
}

impl Measurement<'_> {
    /// Whether the growth model applies: a layer index, a kind it covers, and more than one
    /// element (see the module documentation).
    fn growth_shape(&self, layers: u64) -> Option<f64> {
        if self.elements == Some(1) {
            return None;
        }
        growth(self.id.kind, layer_of(&self.id.module)? + 1, layers)
    }
}

/// The tolerances of a trace's tensors.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Model {
    /// The unit of tolerances: [`RunDtype::precision`] of the run's dtype.
    pub epsilon: f64,
    /// Number of layers (one more than the largest layer index), 0 when no module has one.
    pub layers: u64,
    /// The growth model's coefficients, by kind.
    pub fits: Vec<Fit>,
    /// Whether any perturbed run exists.
    pub perturbed: bool,
}

impl Model {
    /// Fits the model on every tensor's measured response (normalized to one unit of
    /// precision; `None` where no perturbed run measured the tensor).
    pub fn fit(dtype: RunDtype, measured: &[Measurement<'_>], perturbed: bool) -> Model {
        let epsilon = dtype.precision();
        let layers = measured
            .iter()
            .filter_map(|m| layer_of(&m.id.module))
            .max()
            .map_or(0, |l| l + 1);
        let mut fits = Vec::new();
        for kind in Kind::ALL {
            let mut ratios: Vec<f64> = Vec::new();
            let mut distinct_layers = std::collections::BTreeSet::new();
            for m in measured {
                let (Some(r), Some(l)) = (m.response, layer_of(&m.id.module)) else {
                    continue;
                };
                if m.id.kind != kind || r <= 0.0 || !r.is_finite() {
                    continue;
                }
                if let Some(shape) = m.growth_shape(layers) {
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

    /// The growth model's estimate for `m`, if it applies.
    pub fn predicted(&self, m: &Measurement<'_>) -> Option<f64> {
        let fit = self.fits.iter().find(|f| f.kind == m.id.kind)?;
        Some(fit.coefficient * m.growth_shape(self.layers)? * self.epsilon)
    }

    /// The tolerance of the measured tensor `m`.
    pub fn tolerance(&self, m: &Measurement<'_>) -> Tolerance {
        let Some(measured) = m.response.filter(|_| self.perturbed) else {
            return Tolerance {
                value: DEFAULT_FACTOR * self.epsilon,
                source: Source::DtypeDefault,
            };
        };
        let (estimate, mut source) = match self.predicted(m) {
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

    fn m(id: &CanonicalId, elements: u64, response: Option<f64>) -> Measurement<'_> {
        Measurement {
            id,
            elements: Some(elements),
            response,
        }
    }

    #[test]
    fn the_growth_model_lifts_a_layer_below_the_trend() {
        let eps = RunDtype::Bfloat16.epsilon();
        let ids: Vec<CanonicalId> = (0..4)
            .map(|l| id(Kind::ForwardOutput, &format!("layers.{l}.mlp")))
            .collect();
        // Responses follow sqrt(l) * eps, except layer 2 measured far below.
        let responses = [1.0, 2f64.sqrt(), 0.1, 2.0].map(|r| Some(r * eps));
        let measured: Vec<Measurement> = ids
            .iter()
            .zip(responses)
            .map(|(i, r)| m(i, 64, r))
            .collect();
        let model = Model::fit(RunDtype::Bfloat16, &measured, true);
        assert_eq!(model.layers, 4);
        let t2 = model.tolerance(&measured[2]);
        assert_eq!(t2.source, Source::GrowthModel);
        assert!(
            (t2.value - SAFETY_FACTOR * 3f64.sqrt() * model.fits[0].coefficient * eps).abs()
                < 1e-12
        );
        let t3 = model.tolerance(&measured[3]);
        assert!(t3.value >= SAFETY_FACTOR * 2.0 * eps * 0.999);
    }

    #[test]
    fn a_one_element_tensor_keeps_its_own_measurement() {
        let eps = RunDtype::Bfloat16.epsilon();
        let outputs: Vec<CanonicalId> = (0..4)
            .map(|l| id(Kind::ForwardOutput, &format!("layers.{l}.mlp")))
            .collect();
        let amax = id(Kind::ForwardOutput, "layers.0.mlp.linear_fc1.input_amax");
        // Activations respond with 5 eps * sqrt(l); the amax of layer 0 with 0.5 eps.
        let mut measured: Vec<Measurement> = outputs
            .iter()
            .enumerate()
            .map(|(l, i)| m(i, 64, Some(5.0 * ((l + 1) as f64).sqrt() * eps)))
            .collect();
        measured.push(m(&amax, 1, Some(0.5 * eps)));
        let model = Model::fit(RunDtype::Bfloat16, &measured, true);
        assert_eq!(model.fits[0].points, 4);
        let t = model.tolerance(&measured[4]);
        assert_eq!(t.source, Source::Perturbation);
        assert!((t.value - SAFETY_FACTOR * 0.5 * eps).abs() < 1e-15);
        // The same tensor with many elements would be lifted to the trend.
        let many = Measurement {
            elements: None,
            ..measured[4]
        };
        assert_eq!(model.tolerance(&many).source, Source::GrowthModel);
    }

    #[test]
    fn fp8_tolerances_are_in_bf16_precision() {
        let a = id(Kind::ForwardOutput, "layers.0.mlp");
        let model = Model::fit(RunDtype::Float8E4m3fn, &[m(&a, 8, Some(0.0))], true);
        assert_eq!(model.epsilon, RunDtype::Bfloat16.epsilon());
        assert_eq!(model.tolerance(&m(&a, 8, Some(0.0))).value, 2f64.powi(-7));
    }

    #[test]
    fn without_perturbed_runs_the_dtype_default_applies() {
        let a = id(Kind::ParamGrad, "layers.0.w");
        let model = Model::fit(RunDtype::Float32, &[m(&a, 4, None)], false);
        let t = model.tolerance(&m(&a, 4, None));
        assert_eq!(t.source, Source::DtypeDefault);
        assert_eq!(t.value, DEFAULT_FACTOR * f64::from(f32::EPSILON));
    }

    #[test]
    fn a_zero_response_gets_the_floor() {
        let a = id(Kind::ParamBeforeStep, "layers.0.w");
        let model = Model::fit(RunDtype::Bfloat16, &[m(&a, 4, Some(0.0))], true);
        assert_eq!(
            model.tolerance(&m(&a, 4, Some(0.0))),
            Tolerance {
                value: 2f64.powi(-7),
                source: Source::Floor
            }
        );
    }
}
