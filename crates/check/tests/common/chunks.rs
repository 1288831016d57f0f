//! Chunk tables of context parallelism: which rows of the sequence each coordinate picks.

#![allow(dead_code)]

/// Per coordinate, the `[start, end)` segments of the sequence it picks, in order.
pub type Table = Vec<Vec<(usize, usize)>>;

/// Megatron's load-balanced layout over `n` coordinates of chunks of `c` rows: coordinate r
/// holds chunks r and 2n-1-r.
pub fn megatron(n: usize, c: usize) -> Table {
    (0..n)
        .map(|r| vec![(r * c, (r + 1) * c), ((2 * n - 1 - r) * c, (2 * n - r) * c)])
        .collect()
}

/// A chunk table from chunk indices per coordinate (chunks of `c` rows).
pub fn chunks(c: usize, idx: &[Vec<usize>]) -> Table {
    idx.iter()
        .map(|r| r.iter().map(|&k| (k * c, (k + 1) * c)).collect())
        .collect()
}

/// The rows the coordinates hold, in coordinate order.
pub fn order(table: &Table) -> Vec<usize> {
    table.iter().flatten().flat_map(|&(a, b)| a..b).collect()
}
