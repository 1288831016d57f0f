//! Writes trace directories in exactly the form [`crate::reader`] accepts: `trace.json`, and per
//! rank `index.json` and `tensors.safetensors`. Values stream to disk as they are recorded (a
//! rank's data goes to a part file; the safetensors header, known only at the end, is written
//! before it on [`RankWriter::finish`]), so writing a trace of any size takes little memory.

use crate::error::TraceError;
use crate::format::{
    rank_index_json, trace_meta_json, CanonicalId, Coords, Piece, RankIndex, Region, StorageDtype,
    TensorEntry, TraceMeta,
};
use crate::reader::rank_dir_name;
use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Writes a trace directory.
#[derive(Debug)]
pub struct TraceWriter {
    dir: PathBuf,
    meta: TraceMeta,
}

impl TraceWriter {
    /// Creates `dir` (and its parents) and writes `trace.json`.
    pub fn create(dir: &Path, meta: TraceMeta) -> Result<TraceWriter, TraceError> {
        std::fs::create_dir_all(dir).map_err(|e| TraceError::io(dir, &e))?;
        let file = dir.join("trace.json");
        std::fs::write(&file, trace_meta_json(&meta)).map_err(|e| TraceError::io(&file, &e))?;
        Ok(TraceWriter {
            dir: dir.to_path_buf(),
            meta,
        })
    }

    /// The trace's metadata.
    pub fn meta(&self) -> &TraceMeta {
        &self.meta
    }

    /// Starts rank `rank`'s directory.
    pub fn rank(&self, rank: u64, coords: Coords) -> Result<RankWriter, TraceError> {
        if rank >= self.meta.world_size {
            return Err(TraceError::new(
                &self.dir,
                None,
                format!("rank {rank} is outside world_size {}", self.meta.world_size),
            ));
        }
        let dir = self.dir.join(rank_dir_name(rank));
        std::fs::create_dir_all(&dir).map_err(|e| TraceError::io(&dir, &e))?;
        let part_path = dir.join("tensors.safetensors.part");
        let part = std::fs::File::create(&part_path).map_err(|e| TraceError::io(&part_path, &e))?;
        Ok(RankWriter {
            dir,
            index: RankIndex {
                rank,
                coords,
                tensors: Vec::new(),
            },
            storage: self.meta.dtype.storage()[0],
            part: BufWriter::with_capacity(1 << 20, part),
            part_path,
            infos: BTreeMap::new(),
            written: 0,
            exact_replicas: false,
        })
    }
}

/// Writes one rank of a trace; call [`RankWriter::finish`] at the end.
#[derive(Debug)]
pub struct RankWriter {
    dir: PathBuf,
    index: RankIndex,
    storage: StorageDtype,
    part: BufWriter<std::fs::File>,
    part_path: PathBuf,
    /// Key -> (local shape, start and end byte in the part file).
    infos: BTreeMap<String, (Vec<u64>, u64, u64)>,
    written: u64,
    exact_replicas: bool,
}

/// The values of a rank's local tensor, row-major.
#[derive(Clone, Debug)]
pub struct Local<'a> {
    /// Its shape.
    pub shape: &'a [u64],
    /// Its pieces: local boxes and where they lie in the full tensor.
    pub pieces: Vec<Piece>,
}

impl RankWriter {
    /// Declares the replicas of the tensors recorded from now on bit-identical in a correct
    /// run (`exact_replicas` in `index.json`), or not.
    pub fn set_exact_replicas(&mut self, exact: bool) {
        self.exact_replicas = exact;
    }

    /// Records a tensor: `values` are the local tensor's elements, row-major, rounded to the
    /// run's storage dtype. Its key is `t` and its sequence number, which counts up from 0.
    pub fn record(
        &mut self,
        id: CanonicalId,
        module_class: Option<&str>,
        full_shape: &[u64],
        local: Local<'_>,
        values: &[f64],
    ) -> Result<(), TraceError> {
        self.record_iter(id, module_class, full_shape, local, values.iter().copied())
    }

    /// [`RankWriter::record`] with the values from an iterator (which must yield exactly the
    /// local tensor's number of elements), so large tensors never sit in memory.
    pub fn record_iter(
        &mut self,
        id: CanonicalId,
        module_class: Option<&str>,
        full_shape: &[u64],
        local: Local<'_>,
        values: impl Iterator<Item = f64>,
    ) -> Result<(), TraceError> {
        let seq = self.index.tensors.len() as u64;
        let key = format!("t{seq:06}");
        let bad = |message: String| {
            TraceError::new(&self.dir, Some(format!("tensor {key:?} ({id})")), message)
        };
        let stored_len: u64 = local.shape.iter().product();
        for p in &local.pieces {
            if let Some([s, e]) = p.flat_range() {
                if e > stored_len || !p.full.within(full_shape) {
                    return Err(bad(format!(
                        "flat piece [{s}, {e}) -> {} lies outside {stored_len} stored elements or full shape \
                         {full_shape:?}",
                        p.full
                    )));
                }
                continue;
            }
            if !p.local.within(local.shape) || !p.full.within(full_shape) {
                return Err(bad(format!(
                    "piece {} -> {} lies outside local shape {:?} or full shape {full_shape:?}",
                    p.local, p.full, local.shape
                )));
            }
            if p.local.extents() != p.full.extents() {
                return Err(bad(format!(
                    "piece {} -> {} differs in extents",
                    p.local, p.full
                )));
            }
        }
        let count: u64 = local.shape.iter().product();
        let start = self.written;
        let mut n = 0u64;
        let mut buf = [0u8; 8];
        for v in values {
            let bytes = encode(self.storage, v, &mut buf);
            self.part
                .write_all(bytes)
                .map_err(|e| TraceError::io(&self.part_path, &e))?;
            n += 1;
        }
        if n != count {
            return Err(bad(format!(
                "{n} values for a local shape {:?} of {count} elements",
                local.shape
            )));
        }
        self.written += count * self.storage.size() as u64;
        self.infos
            .insert(key.clone(), (local.shape.to_vec(), start, self.written));
        self.index.tensors.push(TensorEntry {
            key,
            seq,
            id,
            module_class: module_class.map(str::to_string),
            full_shape: full_shape.to_vec(),
            pieces: local.pieces,
            exact_replicas: self.exact_replicas,
        });
        Ok(())
    }

    /// Writes `index.json` and `tensors.safetensors` (header, then the recorded data).
    pub fn finish(self) -> Result<(), TraceError> {
        let RankWriter {
            dir,
            index,
            storage,
            part,
            part_path,
            infos,
            ..
        } = self;
        let part = part
            .into_inner()
            .map_err(|e| TraceError::io(&part_path, e.error()))?;
        drop(part);
        // safetensors wants the data in offset order, which is recording order; the header
        // lists keys in sorted order, as its reader does not care.
        let mut header = serde_json::Map::new();
        for (key, (shape, start, end)) in &infos {
            header.insert(
                key.clone(),
                serde_json::json!({"dtype": storage.name(), "shape": shape, "data_offsets": [start, end]}),
            );
        }
        let mut text = serde_json::Value::Object(header).to_string();
        while !text.len().is_multiple_of(8) {
            text.push(' ');
        }
        let file = dir.join("tensors.safetensors");
        let write = || -> std::io::Result<()> {
            let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(&file)?);
            out.write_all(&(text.len() as u64).to_le_bytes())?;
            out.write_all(text.as_bytes())?;
            std::io::copy(&mut std::fs::File::open(&part_path)?, &mut out)?;
            out.flush()?;
            std::fs::remove_file(&part_path)
        };
        write().map_err(|e| TraceError::io(&file, &e))?;
        let index_file = dir.join("index.json");
        std::fs::write(&index_file, rank_index_json(&index))
            .map_err(|e| TraceError::io(&index_file, &e))
    }
}

/// `v` rounded to `dtype`, as little-endian bytes in `buf`.
fn encode(dtype: StorageDtype, v: f64, buf: &mut [u8; 8]) -> &[u8] {
    match dtype {
        StorageDtype::F32 => buf[..4].copy_from_slice(&(v as f32).to_le_bytes()),
        StorageDtype::Bf16 => buf[..2].copy_from_slice(&half::bf16::from_f64(v).to_le_bytes()),
        StorageDtype::F16 => buf[..2].copy_from_slice(&half::f16::from_f64(v).to_le_bytes()),
        StorageDtype::F64 => buf.copy_from_slice(&v.to_le_bytes()),
    }
    &buf[..dtype.size()]
}

/// The elements of `region` of a row-major tensor of `shape`, row-major: how a test or an
/// emitter cuts a rank's piece out of a logical full tensor.
///
/// ```
/// use shardproof_trace::{extract, Region};
/// let full: Vec<f64> = (0..6).map(f64::from).collect(); // shape [2, 3]
/// assert_eq!(extract(&full, &[2, 3], &Region(vec![[0, 2], [1, 3]])), [1.0, 2.0, 4.0, 5.0]);
/// ```
pub fn extract(full: &[f64], shape: &[u64], region: &Region) -> Vec<f64> {
    let mut out = Vec::with_capacity(region.volume() as usize);
    let strides = strides(shape);
    let extents = region.extents();
    let count: u64 = extents.iter().product();
    let mut index = vec![0u64; shape.len()];
    for _ in 0..count {
        let offset: u64 = index
            .iter()
            .zip(&region.0)
            .zip(&strides)
            .map(|((i, [s, _]), st)| (s + i) * st)
            .sum();
        out.push(full[offset as usize]);
        // Odometer over the region's extents, last dimension fastest.
        for d in (0..index.len()).rev() {
            index[d] += 1;
            if index[d] < extents[d] {
                break;
            }
            index[d] = 0;
        }
    }
    out
}

/// Row-major strides of `shape`, in elements.
pub fn strides(shape: &[u64]) -> Vec<u64> {
    let mut s = vec![1u64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}
