//! Importers (and the JSON exporter) that turn graph files into the shardproof IR.
//!
//! Two formats are read: torch.fx "readable" text ([`parse_fx`], what `print_readable()`,
//! torch.export and AOTAutograd print) and the JSON graph format ([`from_json`], documented in
//! `docs/formats/graph-json.md`), which [`to_json`] writes losslessly.

#![warn(missing_docs)]

mod fx;
mod json;

pub use fx::{parse_fx, parse_fx_lenient, FxParse, ParseStats};
pub use json::{from_json, json_schema, to_json};

use shardproof_ir::{Graph, SourceError};
use std::path::Path;

/// Reads a graph file, choosing the format by extension (`.json`: JSON graph; anything else:
/// torch.fx readable text).
///
/// A JSON graph without a `path` gets the JSON file's path, so that diagnostics can name it.
pub fn load_graph(path: &Path) -> Result<Graph, SourceError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        SourceError::new(path, None, format!("cannot read the graph file: {e}"))
            .with_hint("check that the path exists and is a readable UTF-8 text file")
    })?;
    let is_json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    if is_json {
        let mut g = from_json(&text, path)?;
        if g.path.is_none() {
            g.path = Some(path.to_path_buf());
        }
        Ok(g)
    } else {
        Ok(parse_fx(&text, path)?.graph)
    }
}
