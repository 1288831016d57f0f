//! Importers (and the JSON exporter) that turn graph files into the shardproof IR.
//!
//! Three formats are read: torch.fx "readable" text ([`parse_fx`], what `print_readable()`,
//! torch.export and AOTAutograd print), XLA HLO module text ([`parse_hlo`], what JAX's
//! `lower(...).as_text(dialect="hlo")` and `compile().as_text()` print; `docs/formats/hlo.md`)
//! and the JSON graph format ([`from_json`], documented in `docs/formats/graph-json.md`), which
//! [`to_json`] writes losslessly.

#![warn(missing_docs)]

mod functionalize;
mod fx;
mod hlo;
mod json;

pub use functionalize::{functional_form, functionalize, Functionalized};
pub use fx::{parse_fx, FxParse, ParseStats};
pub use hlo::{
    hlo_device_from_path, hlo_groups, hlo_groups_yaml, is_hlo_path, looks_like_hlo,
    parse_group_name, parse_hlo, HloParse,
};
pub use json::{from_json, json_schema, to_json};

use shardproof_ir::{Graph, SourceError};
use std::path::Path;

/// Reads a graph file, choosing the format by extension (`.json`: JSON graph; `.hlo` or
/// `.hlo.txt`, or text whose first line starts with `HloModule`: HLO text, imported for the
/// device a `NAME.devK.hlo` file name gives; anything else: torch.fx readable text).
///
/// A JSON graph without a `path` gets the JSON file's path, so that diagnostics can name it.
pub fn load_graph(path: &Path) -> Result<Graph, SourceError> {
    let bytes = std::fs::read(path).map_err(|e| {
        SourceError::new(path, None, format!("cannot read the graph file: {e}"))
            .with_hint("check that the path exists and is a readable UTF-8 text file")
    })?;
    let text = decode_utf8(&bytes, path)?;
    let is_json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    if !is_json && (is_hlo_path(path) || looks_like_hlo(text)) {
        return Ok(parse_hlo(text, path, hlo_device_from_path(path))?.graph);
    }
    // In-place operators become out-of-place ones wherever that is sound (see
    // [`functionalize`]); the rest stay, unsupported, for the engines to report.
    let mut g = if is_json {
        let mut g = from_json(text, path)?;
        if g.path.is_none() {
            g.path = Some(path.to_path_buf());
        }
        g
    } else {
        parse_fx(text, path)?.graph
    };
    functionalize(&mut g);
    Ok(g)
}

/// Parses torch.fx readable text, leaving the lines it does not understand in
/// [`ParseStats::unparsed`] instead of failing on them. HLO module text (a first line starting
/// with `HloModule`, or a `.hlo` / `.hlo.txt` path) is read by the HLO importer instead, so that
/// a parse-coverage report over any graph file counts its lines.
pub fn parse_fx_lenient(text: &str, file: &Path) -> Result<FxParse, SourceError> {
    if is_hlo_path(file) || looks_like_hlo(text) {
        let h = parse_hlo(text, file, hlo_device_from_path(file))?;
        return Ok(FxParse {
            graph: h.graph,
            subgraphs: Vec::new(),
            stats: h.stats,
        });
    }
    fx::parse_fx_lenient(text, file)
}

/// The longest excerpt of the input a diagnostic quotes, in characters ([`excerpt`]).
pub const EXCERPT_CHARS: usize = 80;

/// `text` as a diagnostic quotes it: whole when short, else its first [`EXCERPT_CHARS`]
/// characters and an ellipsis, so that an error about a very long line (a minified file, a
/// 10,000-character name) stays readable.
///
/// ```
/// assert_eq!(shardproof_import::excerpt("mm_3"), "mm_3");
/// let long = "x".repeat(500);
/// assert_eq!(shardproof_import::excerpt(&long).chars().count(), 81);
/// assert!(shardproof_import::excerpt(&long).ends_with('…'));
/// ```
pub fn excerpt(text: &str) -> String {
    match text.char_indices().nth(EXCERPT_CHARS) {
        None => text.to_string(),
        Some((cut, _)) => format!("{}…", &text[..cut]),
    }
}

/// `e` with every backtick-quoted excerpt of its message and hint longer than
/// [`EXCERPT_CHARS`] cut to an [`excerpt`]: the last step of every public parser, so that no
/// diagnostic repeats a whole long line or name of the input.
pub fn shorten_quotes(mut e: SourceError) -> SourceError {
    fn shorten(text: &str) -> String {
        if !text.contains('`') {
            return text.to_string();
        }
        let parts: Vec<String> = text
            .split('`')
            .enumerate()
            .map(|(i, p)| {
                if i % 2 == 1 {
                    excerpt(p)
                } else {
                    p.to_string()
                }
            })
            .collect();
        parts.join("`")
    }
    e.message = cap(shorten(&e.message));
    e.hint = e.hint.as_deref().map(shorten).map(cap);
    e
}

/// The longest diagnostic message, in characters: a message quoting input whose quotes cannot
/// be told apart (input holding backticks) is cut here.
pub const MAX_MESSAGE_CHARS: usize = 500;

fn cap(text: String) -> String {
    match text.char_indices().nth(MAX_MESSAGE_CHARS) {
        None => text,
        Some((cut, _)) => format!("{}…", &text[..cut]),
    }
}

/// The text of a file's bytes, or an error at the line and column of the first byte that is
/// not UTF-8 (columns count characters, as every other diagnostic does).
///
/// ```
/// use std::path::Path;
/// let e = shardproof_import::decode_utf8(b"ab\ncd\xffe", Path::new("g.py")).unwrap_err();
/// assert!(e.to_string().starts_with("g.py:2:3: the file is not valid UTF-8: byte 0xff"));
/// assert_eq!(shardproof_import::decode_utf8(b"ok", Path::new("g.py")).unwrap(), "ok");
/// ```
pub fn decode_utf8<'a>(bytes: &'a [u8], path: &Path) -> Result<&'a str, SourceError> {
    match std::str::from_utf8(bytes) {
        Ok(t) => Ok(t),
        Err(e) => {
            let good = &bytes[..e.valid_up_to()];
            let line_start = good.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            let line = good.iter().filter(|&&b| b == b'\n').count() + 1;
            // The prefix is valid UTF-8, so counting non-continuation bytes counts characters.
            let col = good[line_start..]
                .iter()
                .filter(|&&b| (b & 0xC0) != 0x80)
                .count()
                + 1;
            let byte = bytes[e.valid_up_to()];
            Err(SourceError::new(
                path,
                Some(shardproof_ir::Span::new(line, col)),
                format!("the file is not valid UTF-8: byte 0x{byte:02x} cannot appear here"),
            )
            .with_hint(
                "graph and case files are UTF-8 text: re-export the file, or convert it (e.g. `iconv -f latin1 -t utf-8`)",
            ))
        }
    }
}
