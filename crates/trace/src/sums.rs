//! The streaming kernel of every comparison: the sums `||a - b||^2` and `||b||^2` over a region
//! of the logical full tensor, read straight from two mapped pieces (no tensor is ever
//! materialized). Work is split into fixed blocks independent of the thread count and the
//! block sums are added in block order, so the result is the same bytes at any thread count.

use crate::format::{Region, StorageDtype};
use crate::reader::Rank;
use crate::writer::strides;
use rayon::prelude::*;

/// Elements per unit of parallel work.
const UNIT: u64 = 1 << 20;
/// Elements decoded at a time.
const BLOCK: usize = 512;

/// A stored piece of a local tensor: its rank's mapped bytes and where the piece lies.
#[derive(Clone, Debug)]
pub struct PieceData<'t> {
    /// The rank's mapped file.
    pub bytes: &'t [u8],
    /// The element type.
    pub dtype: StorageDtype,
    /// The first byte of the local tensor in `bytes`.
    pub offset: usize,
    /// Row-major strides of the local tensor, in elements.
    pub strides: Vec<u64>,
    /// The piece's box in the local tensor.
    pub local: Region,
    /// The same box in the full tensor.
    pub full: Region,
    /// The rank whose mapped file `bytes` is: each unit of work prefetches its pages and drops
    /// them when done, so memory stays bounded by the units in flight. `None` for plain bytes.
    pub rank: Option<&'t Rank>,
}

impl PieceData<'_> {
    /// The element offset in the local tensor of full-tensor coordinates `at`.
    fn element(&self, at: &[u64]) -> u64 {
        at.iter()
            .zip(&self.local.0)
            .zip(&self.full.0)
            .zip(&self.strides)
            .map(|(((x, l), f), s)| (l[0] + x - f[0]) * s)
            .sum()
    }
}

/// `||a - b||^2` and `||b||^2` over a region.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sums {
    /// Sum of squared differences.
    pub diff_sq: f64,
    /// Sum of squares of `b` (the reference side).
    pub ref_sq: f64,
}

impl Sums {
    fn add(self, o: Sums) -> Sums {
        Sums {
            diff_sq: self.diff_sq + o.diff_sq,
            ref_sq: self.ref_sq + o.ref_sq,
        }
    }

    /// rel_err = ||a - b|| / ||b||; 0 when both are zero, infinite when only `b` is zero or
    /// `a` has a non-finite value where `b` has none.
    pub fn relative_error(self) -> f64 {
        if self.diff_sq == 0.0 {
            0.0
        } else if self.ref_sq == 0.0 || !self.diff_sq.is_finite() {
            f64::INFINITY
        } else {
            (self.diff_sq / self.ref_sq).sqrt()
        }
    }
}

/// Two pieces compared over `region` (inside both pieces' full boxes).
#[derive(Clone, Debug)]
pub struct Pair<'t> {
    /// The compared side.
    pub a: PieceData<'t>,
    /// The reference side.
    pub b: PieceData<'t>,
    /// The region of the full tensor.
    pub region: Region,
}

/// One unit of work: rows `[row_lo, row_hi)` and columns `[col_lo, col_hi)` of a pair's region
/// (rows run over every dimension but the last).
struct Unit {
    pair: usize,
    row_lo: u64,
    row_hi: u64,
    col_lo: u64,
    col_hi: u64,
}

fn units(pairs: &[Pair<'_>]) -> Vec<Unit> {
    let mut out = Vec::new();
    for (p, pair) in pairs.iter().enumerate() {
        let ext = pair.region.extents();
        let (rows, cols) = match ext.split_last() {
            None => (1, 1),
            Some((last, rest)) => (rest.iter().product::<u64>(), *last),
        };
        if rows == 0 || cols == 0 {
            continue;
        }
        if cols >= UNIT {
            for row in 0..rows {
                let mut c = 0;
                while c < cols {
                    let hi = (c + UNIT).min(cols);
                    out.push(Unit {
                        pair: p,
                        row_lo: row,
                        row_hi: row + 1,
                        col_lo: c,
                        col_hi: hi,
                    });
                    c = hi;
                }
            }
        } else {
            let per = (UNIT / cols).max(1);
            let mut r = 0;
            while r < rows {
                let hi = (r + per).min(rows);
                out.push(Unit {
                    pair: p,
                    row_lo: r,
                    row_hi: hi,
                    col_lo: 0,
                    col_hi: cols,
                });
                r = hi;
            }
        }
    }
    out
}

/// Decodes `out.len()` elements of `dtype` starting at byte `start` of `bytes`.
fn decode(bytes: &[u8], dtype: StorageDtype, start: usize, out: &mut [f64]) {
    let n = out.len();
    let src = &bytes[start..start + n * dtype.size()];
    match dtype {
        StorageDtype::F32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            }
        }
        StorageDtype::Bf16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                let bits = u32::from(u16::from_le_bytes([c[0], c[1]])) << 16;
                *o = f64::from(f32::from_bits(bits));
            }
        }
        StorageDtype::F16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f64();
            }
        }
        StorageDtype::F64 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(8)) {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                *o = f64::from_le_bytes(b);
            }
        }
    }
}

/// Adds `||a - b||^2` and `||b||^2` of two decoded blocks into eight lanes each (lanes let the
/// compiler vectorize; their fixed order keeps the sum deterministic).
fn accumulate(a: &[f64], b: &[f64], diff: &mut [f64; 8], refs: &mut [f64; 8]) {
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..8 {
            let d = x[l] - y[l];
            diff[l] += d * d;
            refs[l] += y[l] * y[l];
        }
    }
    for (l, (x, y)) in ca.remainder().iter().zip(cb.remainder()).enumerate() {
        let d = x - y;
        diff[l] += d * d;
        refs[l] += y * y;
    }
}

/// Decode buffers of one thread.
struct Scratch {
    a64: [f64; BLOCK],
    b64: [f64; BLOCK],
    a32: [f32; BLOCK],
    b32: [f32; BLOCK],
}

/// Decodes `out.len()` elements of a dtype narrower than f64 into f32 (exactly).
fn decode32(bytes: &[u8], dtype: StorageDtype, start: usize, out: &mut [f32]) {
    let n = out.len();
    let src = &bytes[start..start + n * dtype.size()];
    match dtype {
        StorageDtype::F32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        StorageDtype::Bf16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16);
            }
        }
        StorageDtype::F16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        StorageDtype::F64 => unreachable!("f64 data takes the f64 path"),
    }
}

/// The two sums of one decoded f32 block, in sixteen lanes added in a fixed order.
fn accumulate32(a: &[f32], b: &[f32]) -> (f32, f32) {
    let (mut diff, mut refs) = ([0f32; 16], [0f32; 16]);
    let mut ca = a.chunks_exact(16);
    let mut cb = b.chunks_exact(16);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..16 {
            let d = x[l] - y[l];
            diff[l] += d * d;
            refs[l] += y[l] * y[l];
        }
    }
    for (l, (x, y)) in ca.remainder().iter().zip(cb.remainder()).enumerate() {
        let d = x - y;
        diff[l] += d * d;
        refs[l] += y * y;
    }
    (diff.iter().sum(), refs.iter().sum())
}

/// The sums of `n` elements from byte `sa` of `a` and `sb` of `b`. Data narrower than f64 is
/// summed in f32 (twice the vector width) within the block, and the block's sums are added in
/// f64; a block whose f32 sums could have overflowed or underflowed is redone in f64.
fn block_sums(pair: &Pair<'_>, sa: usize, sb: usize, n: usize, s: &mut Scratch) -> (f64, f64) {
    let (a, b) = (&pair.a, &pair.b);
    if a.dtype != StorageDtype::F64 && b.dtype != StorageDtype::F64 {
        decode32(a.bytes, a.dtype, sa, &mut s.a32[..n]);
        decode32(b.bytes, b.dtype, sb, &mut s.b32[..n]);
        let (d, r) = accumulate32(&s.a32[..n], &s.b32[..n]);
        if d.is_finite() && r.is_finite() && r >= 1e-30 {
            return (f64::from(d), f64::from(r));
        }
    }
    decode(a.bytes, a.dtype, sa, &mut s.a64[..n]);
    decode(b.bytes, b.dtype, sb, &mut s.b64[..n]);
    let (mut diff, mut refs) = ([0f64; 8], [0f64; 8]);
    accumulate(&s.a64[..n], &s.b64[..n], &mut diff, &mut refs);
    (diff.iter().sum(), refs.iter().sum())
}

/// Calls `block(start byte in a, start byte in b, elements)` for every run of at most
/// [`BLOCK`] elements of a unit, in row-major order, with the unit's pages prefetched before
/// and released after.
fn walk_unit(pair: &Pair<'_>, u: &Unit, mut block: impl FnMut(usize, usize, usize)) {
    let region = &pair.region.0;
    let dims = region.len();
    let ext = pair.region.extents();
    let mut at = vec![0u64; dims];
    let spans = [span(&pair.a, pair, u), span(&pair.b, pair, u)];
    for (side, (start, end)) in [&pair.a, &pair.b].iter().zip(spans) {
        if let Some(rank) = side.rank {
            rank.prefetch(start, end);
        }
    }
    for row in u.row_lo..u.row_hi {
        // The row's coordinates: mixed radix over every dimension but the last.
        let mut r = row;
        for d in (0..dims.saturating_sub(1)).rev() {
            at[d] = region[d][0] + r % ext[d];
            r /= ext[d];
        }
        if dims > 0 {
            at[dims - 1] = region[dims - 1][0] + u.col_lo;
        }
        let ea = pair.a.element(&at);
        let eb = pair.b.element(&at);
        let mut done = 0u64;
        let cols = u.col_hi - u.col_lo;
        while done < cols {
            let n = ((cols - done) as usize).min(BLOCK);
            let sa = pair.a.offset + ((ea + done) as usize) * pair.a.dtype.size();
            let sb = pair.b.offset + ((eb + done) as usize) * pair.b.dtype.size();
            block(sa, sb, n);
            done += n as u64;
        }
    }
    for (side, (start, end)) in [&pair.a, &pair.b].iter().zip(spans) {
        if let Some(rank) = side.rank {
            rank.release(start, end);
        }
    }
}

fn run_unit(pair: &Pair<'_>, u: &Unit) -> Sums {
    let mut scratch = Scratch {
        a64: [0.0; BLOCK],
        b64: [0.0; BLOCK],
        a32: [0.0; BLOCK],
        b32: [0.0; BLOCK],
    };
    let mut total = Sums::default();
    walk_unit(pair, u, |sa, sb, n| {
        let (d, r) = block_sums(pair, sa, sb, n, &mut scratch);
        total.diff_sq += d;
        total.ref_sq += r;
    });
    total
}

/// Elements of a unit whose two values differ: decoded exactly (to f64), `x != y` and not the
/// same bits (so `+0` equals `-0` and a NaN equals the same NaN).
fn unequal_unit(pair: &Pair<'_>, u: &Unit) -> u64 {
    let (mut a, mut b) = ([0f64; BLOCK], [0f64; BLOCK]);
    let mut count = 0u64;
    walk_unit(pair, u, |sa, sb, n| {
        decode(pair.a.bytes, pair.a.dtype, sa, &mut a[..n]);
        decode(pair.b.bytes, pair.b.dtype, sb, &mut b[..n]);
        count += a[..n]
            .iter()
            .zip(&b[..n])
            .filter(|(x, y)| x != y && x.to_bits() != y.to_bits())
            .count() as u64;
    });
    count
}

/// The number of elements over every pair whose values differ at all (see [`sums`] for the
/// pairs): the test of copies that must be bit-identical. A count, so it is the same at any
/// thread count.
pub fn unequal(pairs: &[Pair<'_>]) -> u64 {
    units(pairs)
        .par_iter()
        .map(|u| unequal_unit(&pairs[u.pair], u))
        .sum()
}

/// The bytes of `side` a unit reads: from its first element to its last (rows of a box lie in
/// increasing order in a row-major tensor).
fn span(side: &PieceData<'_>, pair: &Pair<'_>, u: &Unit) -> (usize, usize) {
    let region = &pair.region.0;
    let ext = pair.region.extents();
    let dims = region.len();
    let coords = |row: u64, col: u64| {
        let mut at = vec![0u64; dims];
        let mut r = row;
        for d in (0..dims.saturating_sub(1)).rev() {
            at[d] = region[d][0] + r % ext[d];
            r /= ext[d];
        }
        if dims > 0 {
            at[dims - 1] = region[dims - 1][0] + col;
        }
        at
    };
    let size = side.dtype.size();
    let first = side.element(&coords(u.row_lo, u.col_lo)) as usize;
    let last = side.element(&coords(u.row_hi - 1, u.col_hi - 1)) as usize;
    (side.offset + first * size, side.offset + (last + 1) * size)
}

/// The sums over every pair, computed in parallel and added in a fixed order.
pub fn sums(pairs: &[Pair<'_>]) -> Sums {
    let units = units(pairs);
    let parts: Vec<Sums> = units
        .par_iter()
        .map(|u| run_unit(&pairs[u.pair], u))
        .collect();
    parts.into_iter().fold(Sums::default(), Sums::add)
}

/// A piece over a tensor stored at `offset` of `bytes` with `shape`, in the mapped file of
/// `rank` when it is one.
pub fn piece_data<'t>(
    rank: Option<&'t Rank>,
    bytes: &'t [u8],
    dtype: StorageDtype,
    offset: usize,
    shape: &[u64],
    local: Region,
    full: Region,
) -> PieceData<'t> {
    PieceData {
        bytes,
        dtype,
        offset,
        strides: strides(shape),
        local,
        full,
        rank,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn sums_follow_the_boxes() {
        // a holds columns 2..4 of a [2, 4] tensor as a local [2, 2]; b holds the whole tensor.
        let a = f32_bytes(&[3.0, 4.0, 7.0, 9.0]);
        let b = f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        let pa = piece_data(
            None,
            &a,
            StorageDtype::F32,
            0,
            &[2, 2],
            Region::whole(&[2, 2]),
            Region(vec![[0, 2], [2, 4]]),
        );
        let pb = piece_data(
            None,
            &b,
            StorageDtype::F32,
            0,
            &[2, 4],
            Region::whole(&[2, 4]),
            Region::whole(&[2, 4]),
        );
        let s = sums(&[Pair {
            a: pa,
            b: pb,
            region: Region(vec![[0, 2], [2, 4]]),
        }]);
        assert_eq!(
            s,
            Sums {
                diff_sq: 1.0,
                ref_sq: 9.0 + 16.0 + 49.0 + 64.0
            }
        );
    }

    #[test]
    fn relative_errors_of_zero_and_non_finite_sums() {
        assert_eq!(
            Sums {
                diff_sq: 0.0,
                ref_sq: 0.0
            }
            .relative_error(),
            0.0
        );
        assert_eq!(
            Sums {
                diff_sq: 1.0,
                ref_sq: 0.0
            }
            .relative_error(),
            f64::INFINITY
        );
        assert_eq!(
            Sums {
                diff_sq: f64::NAN,
                ref_sq: 1.0
            }
            .relative_error(),
            f64::INFINITY
        );
        assert_eq!(
            Sums {
                diff_sq: 4.0,
                ref_sq: 16.0
            }
            .relative_error(),
            0.5
        );
    }

    #[test]
    fn blocks_out_of_f32_range_are_summed_in_f64() {
        let big = f32_bytes(&[3e30, 1.0]);
        let tiny = f32_bytes(&[1e-20, 2e-20]);
        let zero = f32_bytes(&[0.0, 0.0]);
        let whole = Region::whole(&[2]);
        let piece = |b: &'static [u8]| {
            piece_data(
                None,
                b,
                StorageDtype::F32,
                0,
                &[2],
                whole.clone(),
                whole.clone(),
            )
        };
        let leak = |v: Vec<u8>| -> &'static [u8] { Box::leak(v.into_boxed_slice()) };
        let (big, tiny, zero) = (leak(big), leak(tiny), leak(zero));
        let s = sums(&[Pair {
            a: piece(zero),
            b: piece(big),
            region: whole.clone(),
        }]);
        assert!(
            s.ref_sq.is_finite() && (s.ref_sq / 9e60 - 1.0).abs() < 1e-6,
            "{s:?}"
        );
        let s = sums(&[Pair {
            a: piece(zero),
            b: piece(tiny),
            region: whole.clone(),
        }]);
        assert!((s.relative_error() - 1.0).abs() < 1e-6, "{s:?}");
    }

    #[test]
    fn unequal_counts_differing_elements_exactly() {
        let whole = Region::whole(&[4]);
        let leak = |v: &[f32]| -> &'static [u8] { Box::leak(f32_bytes(v).into_boxed_slice()) };
        let piece = |b: &'static [u8]| {
            piece_data(
                None,
                b,
                StorageDtype::F32,
                0,
                &[4],
                whole.clone(),
                whole.clone(),
            )
        };
        let count = |x: &'static [u8], y: &'static [u8]| {
            unequal(&[Pair {
                a: piece(x),
                b: piece(y),
                region: whole.clone(),
            }])
        };
        let a = leak(&[1.0, 0.0, f32::NAN, 3.0]);
        // -0 equals +0 and the same NaN equals itself; one ulp of 1.0 does not.
        let b = leak(&[1.0, -0.0, f32::NAN, 3.0]);
        let c = leak(&[1.0 + f32::EPSILON, 0.0, f32::NAN, 3.0]);
        // Differences far below what the f32 sums can see still count.
        let tiny = leak(&[1e-30, 0.0, 0.0, 0.0]);
        let tinier = leak(&[1.0000001e-30, 0.0, 0.0, 0.0]);
        assert_eq!(count(a, b), 0);
        assert_eq!(count(a, c), 1);
        assert_eq!(count(tiny, tinier), 1);
        assert_eq!(count(a, leak(&[2.0, 1.0, 0.0, 4.0])), 4);
    }

    #[test]
    fn bf16_and_f16_decode_exactly() {
        let v = [1.5f64, -2.25, 0.0078125];
        let bf: Vec<u8> = v
            .iter()
            .flat_map(|x| half::bf16::from_f64(*x).to_le_bytes())
            .collect();
        let hf: Vec<u8> = v
            .iter()
            .flat_map(|x| half::f16::from_f64(*x).to_le_bytes())
            .collect();
        let mut out = [0f64; 3];
        decode(&bf, StorageDtype::Bf16, 0, &mut out);
        assert_eq!(out, v);
        decode(&hf, StorageDtype::F16, 0, &mut out);
        assert_eq!(out, v);
    }
}
