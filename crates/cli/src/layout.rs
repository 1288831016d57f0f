//! Text laid out in aligned, word-wrapped columns that fit a width (`zoo list`).

/// The width text goes to when stdout is not a terminal (a pipe, a file, a CI log): wide enough
/// for the tables, narrow enough for a diff or a review pane.
pub const PIPE_WIDTH: usize = 100;

/// Below this, columns cannot be aligned usefully; narrower terminals get this and wrap.
const MIN_WIDTH: usize = 40;

/// The narrowest a wrapped column becomes when the width is short.
const MIN_COLUMN: usize = 10;

/// The space between two columns.
const GAP: &str = "  ";

/// The width of stdout: the terminal's (`COLUMNS` when the terminal does not say), or
/// [`PIPE_WIDTH`] when stdout is not a terminal.
pub fn stdout_width() -> usize {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return PIPE_WIDTH;
    }
    console::Term::stdout()
        .size_checked()
        .map(|(_, cols)| usize::from(cols))
        .or_else(|| std::env::var("COLUMNS").ok()?.trim().parse().ok())
        .unwrap_or(PIPE_WIDTH)
        .max(MIN_WIDTH)
}

fn len(s: &str) -> usize {
    s.chars().count()
}

/// Splits `word` into pieces of at most `width` characters (a path or URL longer than a column).
fn split_long(word: &str, width: usize) -> Vec<String> {
    let chars: Vec<char> = word.chars().collect();
    chars
        .chunks(width.max(1))
        .map(|c| c.iter().collect())
        .collect()
}

/// `text` word-wrapped into lines of at most `width` characters (whitespace collapsed).
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    wrap_units(text.split_whitespace(), width, split_long)
}

/// `text` word-wrapped to `width` with every line indented by `indent` spaces.
pub fn paragraph(text: &str, indent: usize, width: usize) -> Vec<String> {
    let pad = " ".repeat(indent);
    wrap(text, width.saturating_sub(indent))
        .into_iter()
        .map(|l| format!("{pad}{l}"))
        .collect()
}

/// `units` joined by spaces into lines of at most `width` characters, broken only between
/// units; a unit longer than a line is broken by `too_long`.
fn wrap_units<'a>(
    units: impl Iterator<Item = &'a str>,
    width: usize,
    too_long: fn(&str, usize) -> Vec<String>,
) -> Vec<String> {
    let width = width.max(1);
    let mut lines = Vec::new();
    let mut line = String::new();
    for unit in units {
        if !line.is_empty() && len(&line) + 1 + len(unit) <= width {
            line.push(' ');
            line.push_str(unit);
            continue;
        }
        if !line.is_empty() {
            lines.push(std::mem::take(&mut line));
        }
        if len(unit) <= width {
            line = unit.to_string();
        } else {
            let mut pieces = too_long(unit, width);
            line = pieces.pop().unwrap_or_default();
            lines.extend(pieces);
        }
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

/// `text`, a list of `, `-separated items, wrapped between items where it can be, so an item
/// such as `256 experts top-8 moe_ffn 2048` stays on one line.
pub fn wrap_list(text: &str, width: usize) -> Vec<String> {
    // The separator's comma stays at the end of the line it ends.
    let items: Vec<String> = {
        let parts: Vec<&str> = text.split(", ").collect();
        let last = parts.len().saturating_sub(1);
        parts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                if i < last {
                    format!("{p},")
                } else {
                    p.to_string()
                }
            })
            .collect()
    };
    wrap_units(items.iter().map(String::as_str), width, wrap)
}

/// How a column's cells are laid out.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Cell {
    /// Never wrapped: names a user copies (ids, flags).
    Whole,
    /// Word-wrapped to the column's width.
    Words,
    /// Wrapped between `, `-separated items.
    List,
}

/// A table: rows of cells under column kinds, indented, fitted to a width.
pub struct Table {
    indent: usize,
    kinds: Vec<Cell>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table whose columns have `kinds`, each line indented by `indent` spaces.
    pub fn new(indent: usize, kinds: &[Cell]) -> Table {
        Table {
            indent,
            kinds: kinds.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (missing cells are empty).
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) -> &mut Self {
        self.rows.push(cells.into_iter().map(Into::into).collect());
        self
    }

    /// The column widths for `width`: whole columns at their natural width; the others share
    /// what is left, the narrow ones first taking only what they need.
    fn widths(&self, width: usize) -> Vec<usize> {
        let n = self.kinds.len();
        let natural: Vec<usize> = (0..n)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|s| len(s))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut widths = natural.clone();
        let used: usize = (0..n)
            .filter(|&c| self.kinds[c] == Cell::Whole)
            .map(|c| natural[c])
            .sum();
        let mut left = width
            .saturating_sub(self.indent + GAP.len() * n.saturating_sub(1))
            .saturating_sub(used);
        let mut flexible: Vec<usize> = (0..n).filter(|&c| self.kinds[c] != Cell::Whole).collect();
        flexible.sort_by_key(|&c| natural[c]);
        let mut count = flexible.len();
        for c in flexible {
            let share = (left / count.max(1)).max(MIN_COLUMN);
            widths[c] = natural[c].min(share).max(1);
            left = left.saturating_sub(widths[c]);
            count -= 1;
        }
        widths
    }

    /// The table's lines for `width` (none longer, unless whole cells alone exceed it).
    pub fn render(&self, width: usize) -> Vec<String> {
        self.render_rows(width).concat()
    }

    /// The lines of each row for `width`, row by row.
    pub fn render_rows(&self, width: usize) -> Vec<Vec<String>> {
        let widths = self.widths(width);
        let pad = " ".repeat(self.indent);
        let mut rows = Vec::new();
        for row in &self.rows {
            let mut out = Vec::new();
            let cells: Vec<Vec<String>> = (0..self.kinds.len())
                .map(|c| {
                    let text = row.get(c).map_or("", String::as_str);
                    match self.kinds[c] {
                        Cell::Whole => vec![text.to_string()],
                        Cell::Words => wrap(text, widths[c]),
                        Cell::List => wrap_list(text, widths[c]),
                    }
                })
                .collect();
            let height = cells.iter().map(Vec::len).max().unwrap_or(1);
            for i in 0..height {
                let mut line = pad.clone();
                for (c, lines) in cells.iter().enumerate() {
                    if c > 0 {
                        line.push_str(GAP);
                    }
                    let text = lines.get(i).map_or("", String::as_str);
                    line.push_str(text);
                    line.extend(std::iter::repeat_n(
                        ' ',
                        widths[c].saturating_sub(len(text)),
                    ));
                }
                out.push(line.trim_end().to_string());
            }
            rows.push(out);
        }
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_words_within_the_width() {
        assert_eq!(wrap("a bb ccc dddd", 6), ["a bb", "ccc", "dddd"]);
        assert_eq!(wrap("abcdefgh", 3), ["abc", "def", "gh"]);
        assert_eq!(wrap("", 5), [""]);
    }

    #[test]
    fn lists_break_between_items() {
        assert_eq!(
            wrap_list("hidden 16, 4 experts top-2 moe_ffn 8, vocab 32", 24),
            ["hidden 16,", "4 experts top-2 moe_ffn", "8, vocab 32"]
        );
        assert_eq!(
            wrap_list("hidden 16, 4 experts top-2, vocab 32", 20),
            ["hidden 16,", "4 experts top-2,", "vocab 32"]
        );
    }

    #[test]
    fn tables_align_and_fit() {
        let mut t = Table::new(2, &[Cell::Whole, Cell::Words]);
        t.row([
            "id-one",
            "a description long enough to wrap onto a second line",
        ]);
        t.row(["id-two-longer", "short"]);
        let lines = t.render(40);
        assert!(lines.iter().all(|l| l.len() <= 40), "{lines:#?}");
        assert_eq!(lines[0], "  id-one         a description long");
        assert_eq!(lines[1], "                 enough to wrap onto a");
        assert_eq!(lines.last().unwrap(), "  id-two-longer  short");
    }
}
