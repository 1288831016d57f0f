//! A small located YAML tree built from `saphyr-parser` events.
//!
//! We build our own tree instead of using `saphyr`'s loaded documents because a case file needs
//! three things those do not give together: the position of every key (not only of values),
//! mappings that keep duplicate keys so they can be reported instead of silently overwritten, and
//! the scalar style, so that `"12"` and `12` are both the group name `12` while the placement
//! parser can still point inside a quoted expression.

use saphyr_parser::{Event, Parser, ScalarStyle};
use shardproof_ir::{SourceError, Span};
use std::path::Path;

/// Anchors let a small file expand exponentially; past this many nodes we stop.
const MAX_NODES: usize = 200_000;

/// Case files are shallow; a limit keeps recursive consumers (and `Drop`) off the stack's edge.
const MAX_DEPTH: usize = 64;

/// A YAML node with the position where it starts.
#[derive(Clone, Debug)]
pub(crate) struct YNode {
    pub span: Span,
    pub kind: YKind,
}

/// What a YAML node is.
#[derive(Clone, Debug)]
pub(crate) enum YKind {
    Scalar {
        text: String,
        style: ScalarStyle,
        /// True when the scalar lies on one line, so that offsets into `text` map to columns.
        one_line: bool,
    },
    Seq(Vec<YNode>),
    Map(Vec<(YNode, YNode)>),
}

impl YNode {
    /// The scalar text, for scalars.
    pub fn scalar(&self) -> Option<&str> {
        match &self.kind {
            YKind::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }

    /// True for an unquoted scalar (numbers and keywords must be unquoted).
    pub fn is_plain(&self) -> bool {
        matches!(
            self.kind,
            YKind::Scalar {
                style: ScalarStyle::Plain,
                ..
            }
        )
    }

    /// True for YAML null: an empty plain value (`key:` with nothing after it), `~` or `null`.
    pub fn is_null(&self) -> bool {
        match &self.kind {
            YKind::Scalar {
                text,
                style: ScalarStyle::Plain,
                ..
            } => matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"),
            _ => false,
        }
    }

    /// A short description for "expected X, found Y" messages.
    pub fn describe(&self) -> String {
        match &self.kind {
            YKind::Scalar { .. } if self.is_null() => "nothing".to_string(),
            YKind::Scalar { text, .. } => format!("`{}`", clip(text)),
            YKind::Seq(_) => "a list".to_string(),
            YKind::Map(_) => "a mapping".to_string(),
        }
    }

    /// The position of the character at `offset` (in chars) inside a scalar's text, when it can
    /// be told; otherwise the start of the scalar.
    pub fn span_at(&self, offset: usize) -> Span {
        match &self.kind {
            YKind::Scalar {
                style, one_line, ..
            } if *one_line => {
                // Quoted scalars start at the quote; escapes would shift columns, but case files
                // have no reason to use them in expressions.
                let quote = match style {
                    ScalarStyle::SingleQuoted | ScalarStyle::DoubleQuoted => 1,
                    _ => 0,
                };
                Span::new(self.span.line, self.span.col + quote + offset)
            }
            _ => self.span,
        }
    }
}

fn clip(s: &str) -> String {
    if s.chars().count() > 60 {
        let head: String = s.chars().take(57).collect();
        format!("{head}...")
    } else {
        s.to_string()
    }
}

fn to_span(m: saphyr_parser::Marker) -> Span {
    Span::new(m.line().max(1), m.col() + 1)
}

enum Frame {
    Seq {
        span: Span,
        anchor: usize,
        items: Vec<YNode>,
    },
    Map {
        span: Span,
        anchor: usize,
        entries: Vec<(YNode, YNode)>,
        key: Option<YNode>,
    },
}

fn count_nodes(n: &YNode) -> usize {
    match &n.kind {
        YKind::Scalar { .. } => 1,
        YKind::Seq(items) => 1 + items.iter().map(count_nodes).sum::<usize>(),
        YKind::Map(entries) => {
            1 + entries
                .iter()
                .map(|(k, v)| count_nodes(k) + count_nodes(v))
                .sum::<usize>()
        }
    }
}

/// Parses `text` into one located YAML document; `Ok(None)` when the file has no document.
pub(crate) fn parse_yaml(text: &str, file: &Path) -> Result<Option<YNode>, SourceError> {
    let mut parser = Parser::new_from_str(text);
    let mut stack: Vec<Frame> = Vec::new();
    let mut root: Option<YNode> = None;
    let mut anchors: std::collections::HashMap<usize, YNode> = Default::default();
    let mut nodes = 0usize;
    let mut documents = 0usize;
    // Iterative on purpose: deeply nested flow collections must not overflow the stack.
    while let Some(ev) = parser.next_event() {
        let (event, span) = ev.map_err(|e| {
            SourceError::new(
                file,
                Some(to_span(*e.marker())),
                format!("this is not valid YAML: {}", e.info()),
            )
            .with_hint("check the indentation and quoting around this position")
        })?;
        let start = to_span(span.start);
        let done = match event {
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => None,
            Event::DocumentStart(_) => {
                documents += 1;
                if documents > 1 {
                    return Err(SourceError::new(
                        file,
                        Some(start),
                        "a case file holds one YAML document, this is a second one",
                    )
                    .with_hint("remove the `---` separator and everything after it"));
                }
                None
            }
            Event::Alias(id) => match anchors.get(&id) {
                Some(n) => {
                    nodes += count_nodes(n);
                    if nodes > MAX_NODES {
                        return Err(SourceError::new(
                            file,
                            Some(start),
                            format!("the document expands to more than {MAX_NODES} nodes"),
                        )
                        .with_hint("case files do not need anchors to be reused this much"));
                    }
                    let mut n = n.clone();
                    n.span = start;
                    Some((n, 0))
                }
                None => {
                    return Err(SourceError::new(
                        file,
                        Some(start),
                        "this alias refers to an unknown anchor",
                    )
                    .with_hint("define the anchor (`&name`) before using it (`*name`)"))
                }
            },
            Event::Scalar(text, style, anchor, _tag) => {
                nodes += 1;
                let one_line = span.start.line() == span.end.line();
                Some((
                    YNode {
                        span: start,
                        kind: YKind::Scalar {
                            text: text.into_owned(),
                            style,
                            one_line,
                        },
                    },
                    anchor,
                ))
            }
            Event::SequenceStart(anchor, _) => {
                nodes += 1;
                stack.push(Frame::Seq {
                    span: start,
                    anchor,
                    items: Vec::new(),
                });
                None
            }
            Event::MappingStart(anchor, _) => {
                nodes += 1;
                stack.push(Frame::Map {
                    span: start,
                    anchor,
                    entries: Vec::new(),
                    key: None,
                });
                None
            }
            Event::SequenceEnd | Event::MappingEnd => match stack.pop() {
                Some(Frame::Seq {
                    span,
                    anchor,
                    items,
                }) => Some((
                    YNode {
                        span,
                        kind: YKind::Seq(items),
                    },
                    anchor,
                )),
                Some(Frame::Map {
                    span,
                    anchor,
                    entries,
                    ..
                }) => Some((
                    YNode {
                        span,
                        kind: YKind::Map(entries),
                    },
                    anchor,
                )),
                None => None,
            },
        };
        if stack.len() > MAX_DEPTH {
            return Err(SourceError::new(
                file,
                Some(start),
                format!("the document nests more than {MAX_DEPTH} levels deep"),
            )
            .with_hint("a case file needs only a few levels of nesting"));
        }
        if nodes > MAX_NODES {
            return Err(SourceError::new(
                file,
                Some(start),
                format!("the document has more than {MAX_NODES} nodes"),
            )
            .with_hint("a case file is a short description; is this the right file?"));
        }
        let Some((node, anchor)) = done else { continue };
        if anchor != 0 {
            anchors.insert(anchor, node.clone());
        }
        match stack.last_mut() {
            None => root = Some(node),
            Some(Frame::Seq { items, .. }) => items.push(node),
            Some(Frame::Map { entries, key, .. }) => match key.take() {
                None => *key = Some(node),
                Some(k) => entries.push((k, node)),
            },
        }
    }
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> YNode {
        parse_yaml(s, Path::new("t.yaml")).unwrap().unwrap()
    }

    #[test]
    fn spans_of_keys_and_values() {
        let n = parse("a: 1\nb:\n  c: [x, 'y']\n");
        let YKind::Map(m) = &n.kind else { panic!() };
        assert_eq!(m[0].0.span, Span::new(1, 1));
        assert_eq!(m[0].1.span, Span::new(1, 4));
        assert_eq!(m[1].0.span, Span::new(2, 1));
        let YKind::Map(inner) = &m[1].1.kind else {
            panic!()
        };
        assert_eq!(inner[0].0.span, Span::new(3, 3));
        let YKind::Seq(items) = &inner[0].1.kind else {
            panic!()
        };
        assert_eq!(items[0].span, Span::new(3, 7));
        assert_eq!(items[1].span, Span::new(3, 10));
        assert_eq!(items[1].span_at(0), Span::new(3, 11));
    }

    #[test]
    fn keeps_duplicate_keys_and_quoted_numbers() {
        let n = parse("\"12\": tp\n12: dp\n");
        let YKind::Map(m) = &n.kind else { panic!() };
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].0.scalar(), Some("12"));
        assert!(!m[0].0.is_plain());
        assert!(m[1].0.is_plain());
    }

    #[test]
    fn errors_are_located() {
        let e = parse_yaml("a: [1, 2\nb: 3\n", Path::new("t.yaml")).unwrap_err();
        assert!(e.span.is_some(), "{e}");
        assert!(parse_yaml("# nothing\n", Path::new("t.yaml"))
            .unwrap()
            .is_none());
    }

    #[test]
    fn aliases_expand_and_deep_nesting_is_fine() {
        let n = parse("a: &x [1, 2]\nb: *x\n");
        let YKind::Map(m) = &n.kind else { panic!() };
        assert!(matches!(&m[1].1.kind, YKind::Seq(v) if v.len() == 2));
        let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
        let _ = parse_yaml(&deep, Path::new("t.yaml"));
    }
}
