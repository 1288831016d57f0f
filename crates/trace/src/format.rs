//! The trace format, version 1: the types of `trace.json` and `rank-NNNNN/index.json`, read
//! strictly (every field required, no unknown field, every value checked, each problem named by
//! its JSON path) and written in exactly the form the reader accepts. docs/formats/trace.md is
//! the contract in prose.

use crate::error::TraceError;
use serde_json::{Map, Value};
use std::fmt;
use std::path::Path;

/// The `format` field of every `trace.json`.
pub const FORMAT_NAME: &str = "shardproof-trace";
/// The format version this crate reads and writes.
pub const FORMAT_VERSION: u64 = 1;

/// What a trace is a run of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The trusted (usually single-device) run.
    Reference,
    /// The distributed run under test.
    Candidate,
    /// A reference rerun with inputs perturbed at machine-epsilon scale.
    Perturbed,
}

impl Role {
    /// The name in `trace.json`.
    pub fn name(self) -> &'static str {
        match self {
            Role::Reference => "reference",
            Role::Candidate => "candidate",
            Role::Perturbed => "perturbed",
        }
    }
}

/// The run's compute dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunDtype {
    /// IEEE single precision.
    Float32,
    /// bfloat16.
    Bfloat16,
    /// IEEE half precision.
    Float16,
    /// FP8 E4M3 emulated by casts; stored as BF16 or F32.
    Float8E4m3fn,
    /// IEEE double precision.
    Float64,
}

impl RunDtype {
    const ALL: [RunDtype; 5] = [
        RunDtype::Float32,
        RunDtype::Bfloat16,
        RunDtype::Float16,
        RunDtype::Float8E4m3fn,
        RunDtype::Float64,
    ];

    /// The name in `trace.json`.
    pub fn name(self) -> &'static str {
        match self {
            RunDtype::Float32 => "float32",
            RunDtype::Bfloat16 => "bfloat16",
            RunDtype::Float16 => "float16",
            RunDtype::Float8E4m3fn => "float8_e4m3fn",
            RunDtype::Float64 => "float64",
        }
    }

    /// The dtype named `name` in `trace.json`.
    pub fn parse(name: &str) -> Option<RunDtype> {
        RunDtype::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Machine epsilon: the distance from 1 to the next representable number.
    pub fn epsilon(self) -> f64 {
        match self {
            RunDtype::Float32 => f64::from(f32::EPSILON),
            RunDtype::Bfloat16 => 2f64.powi(-7),
            RunDtype::Float16 => 2f64.powi(-10),
            RunDtype::Float8E4m3fn => 2f64.powi(-3),
            RunDtype::Float64 => f64::EPSILON,
        }
    }

    /// The unit tolerances are measured in: the machine epsilon of the dtype the run's tensors
    /// are stored in. That is the run dtype's own except for emulated fp8, whose tensors are
    /// bf16 between the fp8 casts: its errors are normalized by bf16's precision, as seed 002
    /// does (Figure 8), and perturbed runs perturb at that scale.
    pub fn precision(self) -> f64 {
        match self {
            RunDtype::Float8E4m3fn => RunDtype::Bfloat16.epsilon(),
            other => other.epsilon(),
        }
    }

    /// The safetensors dtypes a tensor of a run in this dtype may be stored in (the first is
    /// what the writer uses).
    pub fn storage(self) -> &'static [StorageDtype] {
        match self {
            RunDtype::Float32 => &[StorageDtype::F32],
            RunDtype::Bfloat16 => &[StorageDtype::Bf16],
            RunDtype::Float16 => &[StorageDtype::F16],
            RunDtype::Float8E4m3fn => &[StorageDtype::Bf16, StorageDtype::F32],
            RunDtype::Float64 => &[StorageDtype::F64],
        }
    }
}

impl fmt::Display for RunDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a tensor's elements are stored in safetensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StorageDtype {
    /// 32-bit float.
    F32,
    /// bfloat16.
    Bf16,
    /// 16-bit float.
    F16,
    /// 64-bit float.
    F64,
}

impl StorageDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            StorageDtype::F32 => 4,
            StorageDtype::Bf16 | StorageDtype::F16 => 2,
            StorageDtype::F64 => 8,
        }
    }

    /// The safetensors name (`F32`, `BF16`, `F16`, `F64`).
    pub fn name(self) -> &'static str {
        match self {
            StorageDtype::F32 => "F32",
            StorageDtype::Bf16 => "BF16",
            StorageDtype::F16 => "F16",
            StorageDtype::F64 => "F64",
        }
    }
}

/// The parallel degrees of a run (`parallel` in `trace.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Parallel {
    /// Tensor parallel degree.
    pub tp: u64,
    /// Data parallel degree.
    pub dp: u64,
    /// Pipeline parallel degree.
    pub pp: u64,
    /// Context parallel degree.
    pub cp: u64,
    /// Expert parallel degree.
    pub ep: u64,
    /// Virtual pipeline stages per pipeline rank.
    pub vpp: u64,
    /// Whether sequence parallelism is on.
    pub sp: bool,
}

impl Default for Parallel {
    fn default() -> Parallel {
        Parallel {
            tp: 1,
            dp: 1,
            pp: 1,
            cp: 1,
            ep: 1,
            vpp: 1,
            sp: false,
        }
    }
}

/// How a perturbed run's inputs were perturbed.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Perturbation {
    /// The perturbation's random seed.
    pub seed: u64,
    /// Its norm relative to the perturbed tensor's.
    pub relative_scale: f64,
}

/// `trace.json`: the run-level metadata.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TraceMeta {
    /// What the run is.
    pub role: Role,
    /// Number of ranks (and of `rank-NNNNN` directories).
    pub world_size: u64,
    /// The compute dtype.
    pub dtype: RunDtype,
    /// The parallel degrees.
    pub parallel: Parallel,
    /// The perturbation, for role `perturbed` (and only then).
    pub perturbation: Option<Perturbation>,
    /// What wrote the trace.
    pub producer: String,
}

impl TraceMeta {
    /// The metadata of a run with no parallelism info yet and this crate as its producer.
    pub fn new(role: Role, world_size: u64, dtype: RunDtype) -> TraceMeta {
        TraceMeta {
            role,
            world_size,
            dtype,
            parallel: Parallel::default(),
            perturbation: None,
            producer: concat!("shardproof-trace ", env!("CARGO_PKG_VERSION")).to_string(),
        }
    }
}

/// The kind of a recorded tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A module's forward input.
    ForwardInput,
    /// A module's forward output.
    ForwardOutput,
    /// The gradient w.r.t. a module's output.
    GradOutput,
    /// The gradient w.r.t. a module's input.
    GradInput,
    /// A parameter's `.grad` after backward.
    ParamGrad,
    /// A module's input in an activation recomputation (during backward): checked against the
    /// same trace's `forward_input`, bit for bit, never against the other trace.
    RecomputeInput,
    /// A module's output in an activation recomputation: checked against the same trace's
    /// `forward_output`, bit for bit.
    RecomputeOutput,
    /// The gradient the optimizer consumes, after gradient reduction.
    MainGrad,
    /// A parameter before the optimizer step.
    ParamBeforeStep,
    /// A parameter after the optimizer step.
    ParamAfterStep,
}

/// The phase of a kind, in execution order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Forward kinds.
    Forward,
    /// Backward kinds (`grad_output`, `grad_input`, `param_grad`, `recompute_input`,
    /// `recompute_output`).
    Backward,
    /// Optimizer kinds (`main_grad`, `param_before_step`, `param_after_step`).
    Optimizer,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 10] = [
        Kind::ForwardInput,
        Kind::ForwardOutput,
        Kind::GradOutput,
        Kind::GradInput,
        Kind::ParamGrad,
        Kind::RecomputeInput,
        Kind::RecomputeOutput,
        Kind::MainGrad,
        Kind::ParamBeforeStep,
        Kind::ParamAfterStep,
    ];

    /// The name in `index.json`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::ForwardInput => "forward_input",
            Kind::ForwardOutput => "forward_output",
            Kind::GradOutput => "grad_output",
            Kind::GradInput => "grad_input",
            Kind::ParamGrad => "param_grad",
            Kind::RecomputeInput => "recompute_input",
            Kind::RecomputeOutput => "recompute_output",
            Kind::MainGrad => "main_grad",
            Kind::ParamBeforeStep => "param_before_step",
            Kind::ParamAfterStep => "param_after_step",
        }
    }

    /// The kind named `name`.
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The forward kind a recomputation kind repeats (`recompute_output` repeats
    /// `forward_output`); `None` for every other kind.
    pub fn recomputed(self) -> Option<Kind> {
        match self {
            Kind::RecomputeInput => Some(Kind::ForwardInput),
            Kind::RecomputeOutput => Some(Kind::ForwardOutput),
            _ => None,
        }
    }

    /// The phase the kind is recorded in.
    pub fn phase(self) -> Phase {
        match self {
            Kind::ForwardInput | Kind::ForwardOutput => Phase::Forward,
            Kind::GradOutput
            | Kind::GradInput
            | Kind::ParamGrad
            | Kind::RecomputeInput
            | Kind::RecomputeOutput => Phase::Backward,
            Kind::MainGrad | Kind::ParamBeforeStep | Kind::ParamAfterStep => Phase::Optimizer,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The canonical id of a logical tensor: the same in the reference and the candidate.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct CanonicalId {
    /// The training iteration.
    pub iteration: u64,
    /// The global microbatch.
    pub microbatch: u64,
    /// What the tensor is.
    pub kind: Kind,
    /// The canonical module name (a parameter's canonical name for parameter kinds).
    pub module: String,
    /// The position among the module's inputs or outputs (0 for parameters).
    pub index: u64,
}

impl CanonicalId {
    /// An id.
    pub fn new(
        iteration: u64,
        microbatch: u64,
        kind: Kind,
        module: impl Into<String>,
        index: u64,
    ) -> CanonicalId {
        CanonicalId {
            iteration,
            microbatch,
            kind,
            module: module.into(),
            index,
        }
    }
}

impl fmt::Display for CanonicalId {
    /// `it{iteration}/mb{microbatch}/{kind}/{module}/{index}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "it{}/mb{}/{}/{}/{}",
            self.iteration, self.microbatch, self.kind, self.module, self.index
        )
    }
}

/// A half-open box: `[start, end)` per dimension.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct Region(pub Vec<[u64; 2]>);

impl Region {
    /// The box of a whole tensor of `shape`.
    pub fn whole(shape: &[u64]) -> Region {
        Region(shape.iter().map(|&n| [0, n]).collect())
    }

    /// Its extent in each dimension.
    pub fn extents(&self) -> Vec<u64> {
        self.0.iter().map(|[s, e]| e - s).collect()
    }

    /// Its number of elements.
    pub fn volume(&self) -> u64 {
        self.0.iter().map(|[s, e]| e - s).product()
    }

    /// The common part of two boxes of the same rank, if not empty.
    pub fn intersect(&self, other: &Region) -> Option<Region> {
        let dims: Vec<[u64; 2]> = self
            .0
            .iter()
            .zip(&other.0)
            .map(|(a, b)| [a[0].max(b[0]), a[1].min(b[1])])
            .collect();
        dims.iter().all(|[s, e]| s < e).then_some(Region(dims))
    }

    /// Whether the box lies within a tensor of `shape`.
    pub fn within(&self, shape: &[u64]) -> bool {
        self.0.len() == shape.len() && self.0.iter().zip(shape).all(|([s, e], n)| s <= e && e <= n)
    }
}

impl fmt::Display for Region {
    /// `[0:8, 0:2, 32:64]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (k, [s, e]) in self.0.iter().enumerate() {
            if k > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{s}:{e}")?;
        }
        f.write_str("]")
    }
}

/// A box of the local tensor and where it lies in the logical full tensor.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Piece {
    /// The box in the local tensor; for a flat piece, the whole box of `full`'s extents in the
    /// view of the stored elements from `flat_start` on.
    pub local: Region,
    /// The box in the logical full tensor (equal extents).
    pub full: Region,
    /// A flat piece (`local_flat` in `index.json`): the stored tensor's row-major elements
    /// `flat_start..flat_start + volume(full)` fill `full` in row-major order (a ZeRO shard of
    /// a contiguous buffer, whose range crosses rows and parameters). `None`: a box piece.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flat_start: Option<u64>,
}

impl Piece {
    /// A box piece: `local` of the stored tensor is `full` of the logical tensor.
    pub fn boxed(local: Region, full: Region) -> Piece {
        Piece {
            local,
            full,
            flat_start: None,
        }
    }

    /// A flat piece: stored elements `flat_start..` in row-major order fill `full`.
    pub fn flat(flat_start: u64, full: Region) -> Piece {
        Piece {
            local: Region::whole(&full.extents()),
            full,
            flat_start: Some(flat_start),
        }
    }

    /// The stored elements a flat piece reads, `[start, end)`.
    pub fn flat_range(&self) -> Option<[u64; 2]> {
        self.flat_start.map(|s| [s, s + self.full.volume()])
    }
}

/// A rank's coordinates in the parallel mesh (`coords` in `index.json`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Coords {
    /// Pipeline stage.
    pub pp: u64,
    /// Data parallel rank.
    pub dp: u64,
    /// Context parallel rank.
    pub cp: u64,
    /// Tensor parallel rank.
    pub tp: u64,
    /// Expert parallel rank.
    pub ep: u64,
}

/// One recorded tensor of a rank (an entry of `tensors` in `index.json`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TensorEntry {
    /// Its name in the rank's `tensors.safetensors`.
    pub key: String,
    /// Its recording order on the rank.
    pub seq: u64,
    /// Its canonical id.
    pub id: CanonicalId,
    /// The recording module's class, when known.
    pub module_class: Option<String>,
    /// The shape of the logical full tensor.
    pub full_shape: Vec<u64>,
    /// The local tensor's boxes and where they lie in the full tensor.
    pub pieces: Vec<Piece>,
    /// `exact_replicas` in `index.json` (optional, default false): the writer declares that in
    /// a correct run every replica of this tensor is bit-identical (same kernels on the same
    /// inputs, or a reduction whose result is independent of order, such as a max), so replicas
    /// that differ at all are a finding, whatever the tolerance.
    pub exact_replicas: bool,
}

/// `rank-NNNNN/index.json`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RankIndex {
    /// The rank.
    pub rank: u64,
    /// Its mesh coordinates.
    pub coords: Coords,
    /// What it recorded.
    pub tensors: Vec<TensorEntry>,
}

/// The reader of one JSON document: each accessor names the JSON path of what it reads in its
/// error, and an object's fields are checked to be exactly the expected ones.
struct Doc<'a> {
    file: &'a Path,
}

impl Doc<'_> {
    fn err(&self, path: &str, message: impl Into<String>) -> TraceError {
        TraceError::new(self.file, Some(path.to_string()), message)
    }

    /// The fields of an object, refusing any other than `fields`.
    fn object<'v>(
        &self,
        v: &'v Value,
        path: &str,
        fields: &[&str],
    ) -> Result<&'v Map<String, Value>, TraceError> {
        let Value::Object(map) = v else {
            return Err(self.err(path, format!("expected an object, found {}", describe(v))));
        };
        if let Some(extra) = map.keys().find(|k| !fields.contains(&k.as_str())) {
            return Err(self
                .err(&format!("{path}.{extra}"), "unknown field")
                .with_hint(format!(
                    "the fields of this object are: {}",
                    fields.join(", ")
                )));
        }
        Ok(map)
    }

    fn field<'v>(
        &self,
        map: &'v Map<String, Value>,
        path: &str,
        name: &str,
    ) -> Result<&'v Value, TraceError> {
        map.get(name).ok_or_else(|| {
            self.err(path, format!("missing field `{name}`"))
                .with_hint("every field of the format is required (write null where allowed)")
        })
    }

    fn uint(&self, v: &Value, path: &str) -> Result<u64, TraceError> {
        v.as_u64().ok_or_else(|| {
            self.err(
                path,
                format!("expected a non-negative integer, found {}", describe(v)),
            )
        })
    }

    fn positive(&self, v: &Value, path: &str) -> Result<u64, TraceError> {
        match self.uint(v, path)? {
            0 => Err(self.err(path, "expected a positive integer, found 0")),
            n => Ok(n),
        }
    }

    fn string<'v>(&self, v: &'v Value, path: &str) -> Result<&'v str, TraceError> {
        v.as_str()
            .ok_or_else(|| self.err(path, format!("expected a string, found {}", describe(v))))
    }

    fn array<'v>(&self, v: &'v Value, path: &str) -> Result<&'v [Value], TraceError> {
        v.as_array()
            .map(Vec::as_slice)
            .ok_or_else(|| self.err(path, format!("expected an array, found {}", describe(v))))
    }

    fn region(&self, v: &Value, path: &str) -> Result<Region, TraceError> {
        let mut dims = Vec::new();
        for (d, pair) in self.array(v, path)?.iter().enumerate() {
            let at = format!("{path}[{d}]");
            let items = self.array(pair, &at)?;
            let [s, e] = items else {
                return Err(self.err(&at, format!("expected [start, end], found {pair}")));
            };
            let (s, e) = (
                self.uint(s, &format!("{at}[0]"))?,
                self.uint(e, &format!("{at}[1]"))?,
            );
            if s > e {
                return Err(self
                    .err(&at, format!("start {s} is past end {e}"))
                    .with_hint("boxes are half-open [start, end) with start <= end"));
            }
            dims.push([s, e]);
        }
        Ok(Region(dims))
    }
}

/// A JSON value's type, for error messages.
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// Parses JSON text, naming `line:col` of a syntax error.
fn parse_json(file: &Path, text: &str) -> Result<Value, TraceError> {
    serde_json::from_str(text).map_err(|e| {
        TraceError::new(
            file,
            Some(format!("{}:{}", e.line(), e.column())),
            format!("not valid JSON: {e}"),
        )
    })
}

/// Reads `trace.json` text.
pub fn parse_trace_meta(file: &Path, text: &str) -> Result<TraceMeta, TraceError> {
    let doc = Doc { file };
    let root = parse_json(file, text)?;
    let fields = [
        "format",
        "version",
        "role",
        "world_size",
        "dtype",
        "parallel",
        "perturbation",
        "producer",
    ];
    let map = doc.object(&root, "$", &fields)?;
    let format = doc.string(doc.field(map, "$", "format")?, "$.format")?;
    if format != FORMAT_NAME {
        return Err(doc
            .err(
                "$.format",
                format!("expected \"{FORMAT_NAME}\", found {format:?}"),
            )
            .with_hint("a trace directory holds a shardproof trace.json"));
    }
    let version = doc.uint(doc.field(map, "$", "version")?, "$.version")?;
    if version != FORMAT_VERSION {
        return Err(doc
            .err(
                "$.version",
                format!("expected version {FORMAT_VERSION}, found {version}"),
            )
            .with_hint("this shardproof reads trace format version 1; use a matching collector"));
    }
    let role = match doc.string(doc.field(map, "$", "role")?, "$.role")? {
        "reference" => Role::Reference,
        "candidate" => Role::Candidate,
        "perturbed" => Role::Perturbed,
        other => {
            return Err(doc.err(
                "$.role",
                format!("expected \"reference\", \"candidate\" or \"perturbed\", found {other:?}"),
            ))
        }
    };
    let world_size = doc.positive(doc.field(map, "$", "world_size")?, "$.world_size")?;
    let dtype_name = doc.string(doc.field(map, "$", "dtype")?, "$.dtype")?;
    let dtype = RunDtype::parse(dtype_name).ok_or_else(|| {
        doc.err("$.dtype", format!("unknown dtype {dtype_name:?}"))
            .with_hint(format!(
                "one of: {}",
                RunDtype::ALL.map(RunDtype::name).join(", ")
            ))
    })?;
    let pv = doc.field(map, "$", "parallel")?;
    let pm = doc.object(
        pv,
        "$.parallel",
        &["tp", "dp", "pp", "cp", "ep", "vpp", "sp"],
    )?;
    let degree = |name: &str| {
        let at = format!("$.parallel.{name}");
        doc.positive(doc.field(pm, "$.parallel", name)?, &at)
    };
    let sp = doc.field(pm, "$.parallel", "sp")?;
    let parallel = Parallel {
        tp: degree("tp")?,
        dp: degree("dp")?,
        pp: degree("pp")?,
        cp: degree("cp")?,
        ep: degree("ep")?,
        vpp: degree("vpp")?,
        sp: sp.as_bool().ok_or_else(|| {
            doc.err(
                "$.parallel.sp",
                format!("expected a boolean, found {}", describe(sp)),
            )
        })?,
    };
    let perturbation = match doc.field(map, "$", "perturbation")? {
        Value::Null => None,
        v => {
            let m = doc.object(v, "$.perturbation", &["seed", "relative_scale"])?;
            let seed = doc.uint(
                doc.field(m, "$.perturbation", "seed")?,
                "$.perturbation.seed",
            )?;
            let scale_v = doc.field(m, "$.perturbation", "relative_scale")?;
            let relative_scale = scale_v
                .as_f64()
                .filter(|s| s.is_finite() && *s > 0.0)
                .ok_or_else(|| {
                    doc.err(
                        "$.perturbation.relative_scale",
                        format!("expected a positive number, found {}", describe(scale_v)),
                    )
                })?;
            Some(Perturbation {
                seed,
                relative_scale,
            })
        }
    };
    match (role, perturbation.is_some()) {
        (Role::Perturbed, false) => {
            return Err(doc
                .err(
                    "$.perturbation",
                    "a perturbed run needs its perturbation, found null",
                )
                .with_hint("write {\"seed\": S, \"relative_scale\": X}"))
        }
        (Role::Reference | Role::Candidate, true) => {
            return Err(doc
                .err(
                    "$.perturbation",
                    format!("a {} run has no perturbation", role.name()),
                )
                .with_hint("write null, or role \"perturbed\""))
        }
        _ => {}
    }
    let producer = doc
        .string(doc.field(map, "$", "producer")?, "$.producer")?
        .to_string();
    Ok(TraceMeta {
        role,
        world_size,
        dtype,
        parallel,
        perturbation,
        producer,
    })
}

/// Reads `rank-NNNNN/index.json` text. Checks what the index alone can tell (boxes of equal
/// extents inside the full shape, unique keys, sequence numbers and ids); the reader checks the
/// rest against the safetensors file.
pub fn parse_rank_index(file: &Path, text: &str) -> Result<RankIndex, TraceError> {
    let doc = Doc { file };
    let root = parse_json(file, text)?;
    let map = doc.object(&root, "$", &["rank", "coords", "tensors"])?;
    let rank = doc.uint(doc.field(map, "$", "rank")?, "$.rank")?;
    let cv = doc.field(map, "$", "coords")?;
    let cm = doc.object(cv, "$.coords", &["pp", "dp", "cp", "tp", "ep"])?;
    let coord = |name: &str| {
        doc.uint(
            doc.field(cm, "$.coords", name)?,
            &format!("$.coords.{name}"),
        )
    };
    let coords = Coords {
        pp: coord("pp")?,
        dp: coord("dp")?,
        cp: coord("cp")?,
        tp: coord("tp")?,
        ep: coord("ep")?,
    };
    let mut tensors = Vec::new();
    let mut keys = std::collections::HashMap::new();
    let mut seqs = std::collections::HashMap::new();
    let mut ids = std::collections::HashMap::new();
    for (t, tv) in doc
        .array(doc.field(map, "$", "tensors")?, "$.tensors")?
        .iter()
        .enumerate()
    {
        let at = format!("$.tensors[{t}]");
        let fields = [
            "key",
            "seq",
            "id",
            "module_class",
            "full_shape",
            "pieces",
            "exact_replicas",
        ];
        let tm = doc.object(tv, &at, &fields)?;
        let key = doc
            .string(doc.field(tm, &at, "key")?, &format!("{at}.key"))?
            .to_string();
        if let Some(first) = keys.insert(key.clone(), t) {
            return Err(doc.err(
                &format!("{at}.key"),
                format!("key {key:?} is also $.tensors[{first}]'s"),
            ));
        }
        let seq = doc.uint(doc.field(tm, &at, "seq")?, &format!("{at}.seq"))?;
        if let Some(first) = seqs.insert(seq, t) {
            return Err(doc
                .err(
                    &format!("{at}.seq"),
                    format!("seq {seq} is also $.tensors[{first}]'s"),
                )
                .with_hint("seq is the recording order on the rank: 0, 1, 2, ..."));
        }
        let id_at = format!("{at}.id");
        let idm = doc.object(
            doc.field(tm, &at, "id")?,
            &id_at,
            &["iteration", "microbatch", "kind", "module", "index"],
        )?;
        let kind_name = doc.string(doc.field(idm, &id_at, "kind")?, &format!("{id_at}.kind"))?;
        let kind = Kind::parse(kind_name).ok_or_else(|| {
            doc.err(
                &format!("{id_at}.kind"),
                format!("unknown kind {kind_name:?}"),
            )
            .with_hint(format!("one of: {}", Kind::ALL.map(Kind::name).join(", ")))
        })?;
        let module = doc.string(
            doc.field(idm, &id_at, "module")?,
            &format!("{id_at}.module"),
        )?;
        if module.is_empty() {
            return Err(doc.err(
                &format!("{id_at}.module"),
                "expected a module name, found \"\"",
            ));
        }
        let id = CanonicalId {
            iteration: doc.uint(
                doc.field(idm, &id_at, "iteration")?,
                &format!("{id_at}.iteration"),
            )?,
            microbatch: doc.uint(
                doc.field(idm, &id_at, "microbatch")?,
                &format!("{id_at}.microbatch"),
            )?,
            kind,
            module: module.to_string(),
            index: doc.uint(doc.field(idm, &id_at, "index")?, &format!("{id_at}.index"))?,
        };
        if let Some(first) = ids.insert(id.clone(), t) {
            return Err(doc
                .err(&id_at, format!("id {id} is also $.tensors[{first}]'s"))
                .with_hint("a rank records each canonical id once"));
        }
        let exact_replicas = match tm.get("exact_replicas") {
            None => false,
            Some(v) => v.as_bool().ok_or_else(|| {
                doc.err(
                    &format!("{at}.exact_replicas"),
                    format!("expected a boolean, found {}", describe(v)),
                )
            })?,
        };
        let module_class = match doc.field(tm, &at, "module_class")? {
            Value::Null => None,
            v => Some(doc.string(v, &format!("{at}.module_class"))?.to_string()),
        };
        let shape_at = format!("{at}.full_shape");
        let full_shape = doc
            .array(doc.field(tm, &at, "full_shape")?, &shape_at)?
            .iter()
            .enumerate()
            .map(|(d, n)| doc.uint(n, &format!("{shape_at}[{d}]")))
            .collect::<Result<Vec<u64>, _>>()?;
        // Counts of elements are products of sizes: refuse a shape whose count overflows
        // rather than let any later product wrap.
        if full_shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .is_none_or(|n| n > 1 << 62)
        {
            return Err(doc.err(
                &shape_at,
                format!("a full shape of more than 2^62 elements: {full_shape:?}"),
            ));
        }
        let pieces_at = format!("{at}.pieces");
        let piece_values = doc.array(doc.field(tm, &at, "pieces")?, &pieces_at)?;
        if piece_values.is_empty() {
            return Err(doc
                .err(&pieces_at, "expected at least one piece, found []")
                .with_hint("a rank that holds nothing of a tensor does not record it"));
        }
        let mut pieces = Vec::new();
        for (p, pv) in piece_values.iter().enumerate() {
            let pat = format!("{pieces_at}[{p}]");
            let pm = doc.object(pv, &pat, &["local", "local_flat", "full"])?;
            let full = doc.region(doc.field(pm, &pat, "full")?, &format!("{pat}.full"))?;
            let flat = match (pm.get("local"), pm.get("local_flat")) {
                (Some(_), Some(_)) => {
                    return Err(doc
                        .err(&pat, "both `local` and `local_flat`")
                        .with_hint("a piece is a box (`local`) or a flat range (`local_flat`)"))
                }
                (None, Some(v)) => {
                    let at = format!("{pat}.local_flat");
                    let range = doc.region(&Value::Array(vec![v.clone()]), &at)?;
                    Some(range.0[0])
                }
                _ => None,
            };
            let local = match flat {
                Some(_) => Region::whole(&full.extents()),
                None => doc.region(doc.field(pm, &pat, "local")?, &format!("{pat}.local"))?,
            };
            if full.0.len() != full_shape.len() {
                return Err(doc.err(
                    &format!("{pat}.full"),
                    format!(
                        "a box of {} dimensions in a full tensor of {}",
                        full.0.len(),
                        full_shape.len()
                    ),
                ));
            }
            if !full.within(&full_shape) {
                return Err(doc.err(
                    &format!("{pat}.full"),
                    format!("box {full} lies outside the full shape {full_shape:?}"),
                ));
            }
            if local.extents() != full.extents() {
                return Err(doc
                    .err(
                        &pat,
                        format!("local box {local} and full box {full} differ in extents"),
                    )
                    .with_hint("a piece's two boxes have the same extent in every dimension"));
            }
            if let Some([start, end]) = flat {
                if end - start != full.volume() {
                    return Err(doc
                        .err(
                            &format!("{pat}.local_flat"),
                            format!(
                                "flat range [{start}, {end}) holds {} elements, full box {full} {}",
                                end - start,
                                full.volume()
                            ),
                        )
                        .with_hint("a flat range holds exactly the elements of its full box"));
                }
            }
            pieces.push(Piece {
                local,
                full,
                flat_start: flat.map(|[s, _]| s),
            });
        }
        tensors.push(TensorEntry {
            key,
            seq,
            id,
            module_class,
            full_shape,
            pieces,
            exact_replicas,
        });
    }
    Ok(RankIndex {
        rank,
        coords,
        tensors,
    })
}

fn region_json(r: &Region) -> Value {
    Value::Array(r.0.iter().map(|[s, e]| serde_json::json!([s, e])).collect())
}

/// `trace.json` text of `meta`.
pub fn trace_meta_json(meta: &TraceMeta) -> String {
    let p = &meta.parallel;
    let v = serde_json::json!({
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "role": meta.role.name(),
        "world_size": meta.world_size,
        "dtype": meta.dtype.name(),
        "parallel": {"tp": p.tp, "dp": p.dp, "pp": p.pp, "cp": p.cp, "ep": p.ep, "vpp": p.vpp, "sp": p.sp},
        "perturbation": meta.perturbation.map(|q| serde_json::json!({"seed": q.seed, "relative_scale": q.relative_scale})),
        "producer": meta.producer,
    });
    serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
}

/// `index.json` text of `index`.
pub fn rank_index_json(index: &RankIndex) -> String {
    let c = &index.coords;
    let tensors: Vec<Value> = index
        .tensors
        .iter()
        .map(|t| {
            let mut entry = serde_json::json!({
                "key": t.key,
                "seq": t.seq,
                "id": {"iteration": t.id.iteration, "microbatch": t.id.microbatch,
                       "kind": t.id.kind.name(), "module": t.id.module, "index": t.id.index},
                "module_class": t.module_class,
                "full_shape": t.full_shape,
                "pieces": t.pieces.iter().map(|p| match p.flat_range() {
                    Some(range) => serde_json::json!({"local_flat": range, "full": region_json(&p.full)}),
                    None => serde_json::json!({"local": region_json(&p.local), "full": region_json(&p.full)}),
                }).collect::<Vec<_>>(),
            });
            if t.exact_replicas {
                entry["exact_replicas"] = Value::Bool(true);
            }
            entry
        })
        .collect();
    let v = serde_json::json!({
        "rank": index.rank,
        "coords": {"pp": c.pp, "dp": c.dp, "cp": c.cp, "tp": c.tp, "ep": c.ep},
        "tensors": tensors,
    });
    serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    const META: &str = r#"{ "format": "shardproof-trace", "version": 1, "role": "reference",
        "world_size": 4, "dtype": "bfloat16",
        "parallel": {"tp": 2, "dp": 1, "pp": 2, "cp": 1, "ep": 1, "vpp": 1, "sp": true},
        "perturbation": null, "producer": "shardproof.trace 0.1.0" }"#;

    const INDEX: &str = r#"{ "rank": 1, "coords": {"pp": 0, "dp": 0, "cp": 0, "tp": 1, "ep": 0},
        "tensors": [ { "key": "t000017", "seq": 17,
          "id": { "iteration": 0, "microbatch": 0, "kind": "forward_output",
                  "module": "layers.3.mlp.fc1", "index": 0 },
          "module_class": "ColumnParallelLinear", "full_shape": [8, 2, 64],
          "pieces": [ { "local": [[0, 8], [0, 2], [0, 32]], "full": [[0, 8], [0, 2], [32, 64]] } ] } ] }"#;

    fn path() -> &'static Path {
        Path::new("t/trace.json")
    }

    #[test]
    fn the_contract_examples_read_and_write_back() {
        let meta = parse_trace_meta(path(), META).unwrap();
        assert_eq!(
            (meta.role, meta.world_size, meta.dtype),
            (Role::Reference, 4, RunDtype::Bfloat16)
        );
        assert_eq!(
            parse_trace_meta(path(), &trace_meta_json(&meta)).unwrap(),
            meta
        );
        let index = parse_rank_index(path(), INDEX).unwrap();
        assert_eq!(
            index.tensors[0].id.to_string(),
            "it0/mb0/forward_output/layers.3.mlp.fc1/0"
        );
        assert_eq!(
            index.tensors[0].pieces[0].full.to_string(),
            "[0:8, 0:2, 32:64]"
        );
        assert_eq!(
            parse_rank_index(path(), &rank_index_json(&index)).unwrap(),
            index
        );
    }

    #[test]
    fn flat_pieces_read_write_back_and_are_checked() {
        let local = r#""local": [[0, 8], [0, 2], [0, 32]]"#;
        let flat = INDEX
            .replace(local, r#""local_flat": [0, 64]"#)
            .replace("[[0, 8], [0, 2], [32, 64]]", "[[1, 2], [0, 2], [32, 64]]");
        let index = parse_rank_index(path(), &flat).unwrap();
        let piece = &index.tensors[0].pieces[0];
        assert_eq!(piece.flat_range(), Some([0, 64]));
        assert_eq!(piece.local, Region(vec![[0, 1], [0, 2], [0, 32]]));
        assert_eq!(
            parse_rank_index(path(), &rank_index_json(&index)).unwrap(),
            index
        );
        let short = parse_rank_index(path(), &flat.replace("[0, 64]", "[0, 63]"))
            .unwrap_err()
            .to_string();
        assert!(short.contains("pieces[0].local_flat"), "{short}");
        let both = flat.replace(r#""local_flat""#, &format!(r#"{local}, "local_flat""#));
        let both = parse_rank_index(path(), &both).unwrap_err().to_string();
        assert!(both.contains("both `local` and `local_flat`"), "{both}");
    }

    #[test]
    fn malformed_metadata_names_the_json_path() {
        let err = |text: String| parse_trace_meta(path(), &text).unwrap_err().to_string();
        assert!(err(META.replace("\"version\": 1", "\"version\": 2"))
            .contains("at $.version: expected version 1"));
        assert!(err(META.replace("bfloat16", "int8")).contains("at $.dtype: unknown dtype"));
        assert!(err(META.replace("\"sp\": true", "\"sp\": 1")).contains("at $.parallel.sp"));
        assert!(err(META.replace("\"tp\": 2", "\"tp\": 0")).contains("at $.parallel.tp"));
        assert!(
            err(META.replace("\"producer\"", "\"extra\": 1, \"producer\""))
                .contains("at $.extra: unknown field")
        );
        assert!(
            err(META.replace("\"role\": \"reference\"", "\"role\": \"perturbed\""))
                .contains("at $.perturbation")
        );
        assert!(
            err(META.replace(", \"producer\": \"shardproof.trace 0.1.0\"", ""))
                .contains("missing field `producer`")
        );
        assert!(err(META.replace("{ \"format\"", "{ , \"format\"")).starts_with("t/trace.json:1:"));
    }

    #[test]
    fn malformed_indexes_name_the_json_path() {
        let err = |text: String| parse_rank_index(path(), &text).unwrap_err().to_string();
        assert!(err(INDEX.replace("forward_output", "fwd"))
            .contains("at $.tensors[0].id.kind: unknown kind \"fwd\""));
        assert!(err(INDEX.replace("[32, 64]", "[32, 65]"))
            .contains("at $.tensors[0].pieces[0].full: box"));
        assert!(err(INDEX.replace("[0, 32]", "[0, 31]")).contains("differ in extents"));
        assert!(err(INDEX.replace("[32, 64]", "[64, 32]"))
            .contains("$.tensors[0].pieces[0].full[2]: start 64 is past end 32"));
        assert!(err(INDEX.replace("\"seq\": 17", "\"seq\": -1"))
            .contains("$.tensors[0].seq: expected a non-negative integer"));
        assert!(err(INDEX.replace(", \"ep\": 0}", "}")).contains("at $.coords: missing field `ep`"));
        let pieces = INDEX.find("\"pieces\"").unwrap();
        let empty = format!("{}\"pieces\": [] }} ] }}", &INDEX[..pieces]);
        assert!(err(empty).contains("expected at least one piece"));
        let huge = INDEX.replace("[8, 2, 64]", "[4294967296, 4294967296, 64]");
        assert!(err(huge).contains("at $.tensors[0].full_shape: a full shape of more than 2^62"));
    }

    #[test]
    fn regions_intersect_and_kinds_order_by_phase() {
        let a = Region(vec![[0, 4], [0, 8]]);
        let b = Region(vec![[2, 6], [4, 8]]);
        assert_eq!(a.intersect(&b), Some(Region(vec![[2, 4], [4, 8]])));
        assert_eq!(a.intersect(&Region(vec![[4, 6], [0, 8]])), None);
        assert!(Kind::ForwardOutput.phase() < Kind::GradInput.phase());
        assert!(Kind::ParamGrad.phase() < Kind::MainGrad.phase());
    }
}
