//! Opens a trace directory: `trace.json`, every rank's `index.json`, and each rank's
//! `tensors.safetensors` memory-mapped (nothing is copied until a comparison reads it). Every
//! recorded tensor is checked against its safetensors entry (present, the run's dtype, local
//! boxes inside its shape) and every canonical id against the other ranks' (one full shape), so
//! that the merge and the comparison run on a trace that follows the format.

use crate::error::TraceError;
use crate::format::{
    parse_rank_index, parse_trace_meta, CanonicalId, RankIndex, Role, StorageDtype, TraceMeta,
};
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The name of a rank's directory: `rank-00017`.
pub fn rank_dir_name(rank: u64) -> String {
    format!("rank-{rank:05}")
}

/// Where a recorded tensor's elements lie in its rank's mapped file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// The element type.
    pub dtype: StorageDtype,
    /// The local tensor's shape.
    pub shape: Vec<u64>,
    /// The first byte of its data in the mapped file.
    pub offset: usize,
}

/// One rank of a trace: its index and its mapped tensors.
#[derive(Debug)]
pub struct Rank {
    /// `index.json`.
    pub index: RankIndex,
    /// `tensors.safetensors`, for error messages.
    pub file: PathBuf,
    /// Where each entry of `index.tensors` is stored, in the same order.
    pub stored: Vec<Stored>,
    map: Mmap,
}

impl Rank {
    /// The mapped bytes of the rank's safetensors file.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Tells the kernel the pages of `[start, end)` may be dropped from this process: a
    /// comparison that is done with a range keeps its resident memory bounded by what it is
    /// reading, not by the trace (the pages stay in the page cache).
    pub fn release(&self, start: usize, end: usize) {
        let end = end.min(self.map.len());
        if end > start {
            // SAFETY: the map is a read-only file mapping this process never writes, so dropping
            // its pages loses nothing: a later read faults them in again from the file. Advice
            // only; a failure changes nothing but the memory figure.
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start,
                    end - start,
                )
            };
        }
    }

    /// Maps the pages of `[start, end)` in one call before they are read: one system call
    /// instead of a page fault per 4 KiB page. Advice only.
    pub fn prefetch(&self, start: usize, end: usize) {
        let end = end.min(self.map.len());
        if end > start {
            #[cfg(target_os = "linux")]
            let advice = memmap2::Advice::PopulateRead;
            #[cfg(not(target_os = "linux"))]
            let advice = memmap2::Advice::WillNeed;
            let _ = self.map.advise_range(advice, start, end - start);
        }
    }
}

/// Where a canonical id is recorded: rank and entry (an index into that rank's `tensors`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Holder {
    /// The rank (an index into [`Trace::ranks`]).
    pub rank: usize,
    /// The entry in the rank's index.
    pub entry: usize,
}

/// A logical tensor of a trace: its full shape and the ranks holding pieces of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logical {
    /// The full tensor's shape.
    pub full_shape: Vec<u64>,
    /// The ranks' entries holding it, by rank.
    pub holders: Vec<Holder>,
    /// The smallest `seq` among its holders: its place in execution order.
    pub seq: u64,
    /// The recording module's class (the first holder's that has one).
    pub module_class: Option<String>,
}

/// An opened trace directory.
#[derive(Debug)]
pub struct Trace {
    /// The directory.
    pub dir: PathBuf,
    /// `trace.json`.
    pub meta: TraceMeta,
    /// Its ranks, by rank.
    pub ranks: Vec<Rank>,
    /// Every canonical id with the ranks holding it, in id order.
    pub logical: BTreeMap<CanonicalId, Logical>,
}

fn read_text(file: &Path) -> Result<String, TraceError> {
    std::fs::read_to_string(file).map_err(|e| {
        let err = TraceError::io(file, &e);
        if e.kind() == std::io::ErrorKind::NotFound {
            err.with_hint("a trace directory holds trace.json and rank-NNNNN/{index.json,tensors.safetensors}")
        } else {
            err
        }
    })
}

impl Trace {
    /// Opens the trace in `dir` and checks it.
    pub fn open(dir: &Path) -> Result<Trace, TraceError> {
        let meta_file = dir.join("trace.json");
        let meta = parse_trace_meta(&meta_file, &read_text(&meta_file)?)?;
        // A rank directory beyond world_size is a trace that does not say what it is.
        if let Ok(entries) = std::fs::read_dir(dir) {
            let mut extra: Vec<String> = entries
                .filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| {
                    n.strip_prefix("rank-")
                        .and_then(|r| r.parse::<u64>().ok())
                        .is_some_and(|r| r >= meta.world_size)
                })
                .collect();
            extra.sort();
            if let Some(first) = extra.first() {
                return Err(TraceError::new(
                    &dir.join(first),
                    None,
                    format!("a rank directory beyond world_size {}", meta.world_size),
                )
                .with_hint("world_size in trace.json counts the rank-NNNNN directories"));
            }
        }
        let mut ranks = Vec::new();
        for r in 0..meta.world_size {
            ranks.push(open_rank(dir, r, &meta)?);
        }
        let logical = index_ids(dir, &ranks)?;
        tracing::debug!(
            dir = %dir.display(),
            ranks = ranks.len(),
            tensors = logical.len(),
            "opened trace"
        );
        Ok(Trace {
            dir: dir.to_path_buf(),
            meta,
            ranks,
            logical,
        })
    }

    /// The perturbed runs in `perturbed-0/`, `perturbed-1/`, ... of a reference trace, opened;
    /// stops at the first number with no directory.
    pub fn open_perturbed(&self) -> Result<Vec<Trace>, TraceError> {
        let mut runs = Vec::new();
        loop {
            let dir = self.dir.join(format!("perturbed-{}", runs.len()));
            if !dir.is_dir() {
                return Ok(runs);
            }
            let run = Trace::open(&dir)?;
            if run.meta.role != Role::Perturbed {
                return Err(TraceError::new(
                    &dir.join("trace.json"),
                    Some("$.role".into()),
                    format!(
                        "expected role \"perturbed\" in a perturbed run, found {:?}",
                        run.meta.role.name()
                    ),
                ));
            }
            runs.push(run);
        }
    }

    /// Total bytes of tensor data in the trace.
    pub fn data_bytes(&self) -> u64 {
        self.ranks
            .iter()
            .flat_map(|r| &r.stored)
            .map(|s| s.shape.iter().product::<u64>() * s.dtype.size() as u64)
            .sum()
    }
}

fn storage_dtype(d: safetensors::Dtype) -> Option<StorageDtype> {
    match d {
        safetensors::Dtype::F32 => Some(StorageDtype::F32),
        safetensors::Dtype::BF16 => Some(StorageDtype::Bf16),
        safetensors::Dtype::F16 => Some(StorageDtype::F16),
        safetensors::Dtype::F64 => Some(StorageDtype::F64),
        _ => None,
    }
}

fn open_rank(dir: &Path, r: u64, meta: &TraceMeta) -> Result<Rank, TraceError> {
    let rank_dir = dir.join(rank_dir_name(r));
    let index_file = rank_dir.join("index.json");
    let index = parse_rank_index(&index_file, &read_text(&index_file)?)?;
    if index.rank != r {
        return Err(TraceError::new(
            &index_file,
            Some("$.rank".into()),
            format!("expected rank {r} (the directory's), found {}", index.rank),
        ));
    }
    let p = &meta.parallel;
    let c = &index.coords;
    for (name, coord, degree) in [
        ("pp", c.pp, p.pp),
        ("dp", c.dp, p.dp),
        ("cp", c.cp, p.cp),
        ("tp", c.tp, p.tp),
        ("ep", c.ep, p.ep),
    ] {
        if coord >= degree {
            return Err(TraceError::new(
                &index_file,
                Some(format!("$.coords.{name}")),
                format!("coordinate {coord} is outside the run's {name} degree {degree}"),
            )
            .with_hint("coords count from 0 up to the degrees in trace.json's parallel"));
        }
    }
    let file = rank_dir.join("tensors.safetensors");
    let handle = std::fs::File::open(&file).map_err(|e| TraceError::io(&file, &e))?;
    // SAFETY: the map is read-only and private; a trace is not written while it is compared
    // (a file truncated underneath would fault, as any mapped reader would).
    let map = unsafe { Mmap::map(&handle) }.map_err(|e| TraceError::io(&file, &e))?;
    let _ = map.advise(memmap2::Advice::Sequential);
    let (header_len, metadata) = safetensors::SafeTensors::read_metadata(&map).map_err(|e| {
        TraceError::new(&file, None, format!("not a valid safetensors file: {e}"))
            .with_hint("each rank's tensors.safetensors is written by the safetensors format")
    })?;
    let data_start = 8 + header_len;
    let mut stored = Vec::with_capacity(index.tensors.len());
    for (t, entry) in index.tensors.iter().enumerate() {
        let at = || Some(format!("tensor {:?}", entry.key));
        let Some(info) = metadata.info(&entry.key) else {
            return Err(TraceError::new(
                &file,
                at(),
                "missing: index.json records it ($.tensors[{t}].key)"
                    .replace("{t}", &t.to_string()),
            )
            .with_hint("every key of index.json names a tensor of the rank's safetensors file"));
        };
        let dtype = storage_dtype(info.dtype)
            .filter(|d| meta.dtype.storage().contains(d))
            .ok_or_else(|| {
                TraceError::new(
                    &file,
                    at(),
                    format!(
                        "stored as {:?}, but a {} run stores {}",
                        info.dtype,
                        meta.dtype,
                        meta.dtype
                            .storage()
                            .iter()
                            .map(|d| d.name())
                            .collect::<Vec<_>>()
                            .join(" or ")
                    ),
                )
            })?;
        let shape: Vec<u64> = info.shape.iter().map(|&n| n as u64).collect();
        let stored_len: u64 = shape.iter().product();
        for (p, piece) in entry.pieces.iter().enumerate() {
            if let Some([start, end]) = piece.flat_range() {
                if end > stored_len {
                    return Err(TraceError::new(
                        &index_file,
                        Some(format!("$.tensors[{t}].pieces[{p}].local_flat")),
                        format!(
                            "flat range [{start}, {end}) lies outside the stored tensor's {stored_len} elements (key {:?})",
                            entry.key
                        ),
                    ));
                }
            } else if !piece.local.within(&shape) {
                return Err(TraceError::new(
                    &index_file,
                    Some(format!("$.tensors[{t}].pieces[{p}].local")),
                    format!(
                        "box {} lies outside the stored tensor's shape {shape:?} (key {:?})",
                        piece.local, entry.key
                    ),
                ));
            }
        }
        stored.push(Stored {
            dtype,
            shape,
            offset: data_start + info.data_offsets.0,
        });
    }
    Ok(Rank {
        index,
        file,
        stored,
        map,
    })
}

/// Every canonical id of the trace with its holders; ranks that disagree on an id's full shape
/// make the trace invalid.
fn index_ids(dir: &Path, ranks: &[Rank]) -> Result<BTreeMap<CanonicalId, Logical>, TraceError> {
    let mut logical: BTreeMap<CanonicalId, Logical> = BTreeMap::new();
    for (r, rank) in ranks.iter().enumerate() {
        for (e, entry) in rank.index.tensors.iter().enumerate() {
            let holder = Holder { rank: r, entry: e };
            match logical.get_mut(&entry.id) {
                None => {
                    logical.insert(
                        entry.id.clone(),
                        Logical {
                            full_shape: entry.full_shape.clone(),
                            holders: vec![holder],
                            seq: entry.seq,
                            module_class: entry.module_class.clone(),
                        },
                    );
                }
                Some(l) => {
                    if l.full_shape != entry.full_shape {
                        let first = l.holders[0].rank;
                        return Err(TraceError::new(
                            &dir.join(rank_dir_name(r as u64)).join("index.json"),
                            Some(format!("$.tensors[{e}].full_shape")),
                            format!(
                                "{} has full shape {:?} here but {:?} on rank {first}",
                                entry.id, entry.full_shape, l.full_shape
                            ),
                        )
                        .with_hint(
                            "every rank records a canonical id with the same logical full shape",
                        ));
                    }
                    l.holders.push(holder);
                    l.seq = l.seq.min(entry.seq);
                    if l.module_class.is_none() {
                        l.module_class.clone_from(&entry.module_class);
                    }
                }
            }
        }
    }
    Ok(logical)
}
