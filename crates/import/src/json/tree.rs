//! A small positioned JSON tree over already-valid JSON text.
//!
//! serde_json gives neither key order (without the workspace-wide `preserve_order` feature) nor
//! positions of values, and we need both: the pretty printer keeps the DTO's field order while
//! choosing where to break lines, and semantic errors point at the node they concern.

use shardproof_ir::Span;

/// A JSON value with the byte offset where it starts.
#[derive(Debug)]
pub(crate) struct JNode<'a> {
    pub start: usize,
    pub kind: JKind<'a>,
}

/// What a JSON value is; scalars keep their raw text (strings with quotes and escapes).
#[derive(Debug)]
pub(crate) enum JKind<'a> {
    Scalar(&'a str),
    Arr(Vec<JNode<'a>>),
    Obj(Vec<(&'a str, usize, JNode<'a>)>),
}

impl<'a> JNode<'a> {
    /// The member `key` of an object (keys compared by their unescaped-free raw text).
    pub(crate) fn get(&self, key: &str) -> Option<&JNode<'a>> {
        self.get_entry(key).map(|(_, n)| n)
    }

    /// The member `key` of an object and the offset of the key itself.
    pub(crate) fn get_entry(&self, key: &str) -> Option<(usize, &JNode<'a>)> {
        match &self.kind {
            JKind::Obj(m) => m
                .iter()
                .find(|(k, _, _)| k.len() >= 2 && &k[1..k.len() - 1] == key)
                .map(|(_, off, n)| (*off, n)),
            _ => None,
        }
    }

    /// Element `i` of an array.
    pub(crate) fn at(&self, i: usize) -> Option<&JNode<'a>> {
        match &self.kind {
            JKind::Arr(v) => v.get(i),
            _ => None,
        }
    }
}

/// Parses valid JSON text; `None` if it is not (callers validate with serde_json first).
pub(crate) fn parse(text: &str) -> Option<JNode<'_>> {
    let mut p = P {
        s: text.as_bytes(),
        text,
        i: 0,
        depth: 0,
    };
    let v = p.value()?;
    p.ws();
    (p.i == p.s.len()).then_some(v)
}

struct P<'a> {
    s: &'a [u8],
    text: &'a str,
    i: usize,
    depth: usize,
}

impl<'a> P<'a> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn value(&mut self) -> Option<JNode<'a>> {
        self.ws();
        let start = self.i;
        // serde_json also stops at 128 levels; the limit keeps recursion bounded.
        if self.depth > 256 {
            return None;
        }
        let kind = match *self.s.get(self.i)? {
            b'{' => {
                self.i += 1;
                self.depth += 1;
                let mut m = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b'}') {
                    self.i += 1;
                } else {
                    loop {
                        self.ws();
                        let koff = self.i;
                        let k = self.string()?;
                        self.ws();
                        (self.s.get(self.i) == Some(&b':')).then_some(())?;
                        self.i += 1;
                        let v = self.value()?;
                        m.push((k, koff, v));
                        self.ws();
                        match self.s.get(self.i)? {
                            b',' => self.i += 1,
                            b'}' => {
                                self.i += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
                self.depth -= 1;
                JKind::Obj(m)
            }
            b'[' => {
                self.i += 1;
                self.depth += 1;
                let mut v = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b']') {
                    self.i += 1;
                } else {
                    loop {
                        v.push(self.value()?);
                        self.ws();
                        match self.s.get(self.i)? {
                            b',' => self.i += 1,
                            b']' => {
                                self.i += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
                self.depth -= 1;
                JKind::Arr(v)
            }
            b'"' => JKind::Scalar(self.string()?),
            _ => {
                while self.i < self.s.len()
                    && !matches!(
                        self.s[self.i],
                        b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r'
                    )
                {
                    self.i += 1;
                }
                if self.i == start {
                    return None;
                }
                JKind::Scalar(self.text.get(start..self.i)?)
            }
        };
        Some(JNode { start, kind })
    }

    fn string(&mut self) -> Option<&'a str> {
        let start = self.i;
        (self.s.get(self.i) == Some(&b'"')).then_some(())?;
        self.i += 1;
        loop {
            match *self.s.get(self.i)? {
                b'\\' => self.i += 2,
                b'"' => {
                    self.i += 1;
                    return self.text.get(start..self.i);
                }
                _ => self.i += 1,
            }
        }
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub(crate) fn span_at(text: &str, offset: usize) -> Span {
    let offset = offset.min(text.len());
    let before = &text.as_bytes()[..offset];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |p| p + 1);
    let col = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    Span::new(line, col)
}

const WIDTH: usize = 100;

/// Pretty-prints a tree: containers that fit on the rest of the line stay on one line, others
/// get one member per line; `expand` forces the top-level object and every node object to break,
/// so that a graph reads as one node per block.
pub(crate) fn pretty(root: &JNode<'_>) -> String {
    let mut out = String::new();
    write(root, 0, 0, true, &mut out);
    out.push('\n');
    out
}

fn compact(n: &JNode<'_>, out: &mut String) {
    match &n.kind {
        JKind::Scalar(s) => out.push_str(s),
        JKind::Arr(v) => {
            out.push('[');
            for (i, e) in v.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                compact(e, out);
            }
            out.push(']');
        }
        JKind::Obj(m) => {
            out.push('{');
            for (i, (k, _, e)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(k);
                out.push_str(": ");
                compact(e, out);
            }
            out.push('}');
        }
    }
}

fn write(n: &JNode<'_>, indent: usize, used: usize, expand: bool, out: &mut String) {
    if !expand {
        let mut c = String::new();
        compact(n, &mut c);
        if used + c.chars().count() <= WIDTH || matches!(n.kind, JKind::Scalar(_)) {
            out.push_str(&c);
            return;
        }
    }
    let pad = |k: usize| " ".repeat(k);
    match &n.kind {
        JKind::Scalar(s) => out.push_str(s),
        JKind::Arr(v) if v.is_empty() => out.push_str("[]"),
        JKind::Obj(m) if m.is_empty() => out.push_str("{}"),
        JKind::Arr(v) if v.iter().all(|e| matches!(e.kind, JKind::Scalar(_))) => {
            // Long lists of names or numbers fill lines rather than taking one line each.
            out.push_str("[\n");
            out.push_str(&pad(indent + 2));
            let mut col = indent + 2;
            for (i, e) in v.iter().enumerate() {
                let JKind::Scalar(s) = e.kind else { continue };
                let w = s.chars().count() + 1;
                if col > indent + 2 && col + 1 + w > WIDTH {
                    out.push('\n');
                    out.push_str(&pad(indent + 2));
                    col = indent + 2;
                } else if col > indent + 2 {
                    out.push(' ');
                    col += 1;
                }
                out.push_str(s);
                col += w - 1;
                if i + 1 < v.len() {
                    out.push(',');
                    col += 1;
                }
            }
            out.push('\n');
            out.push_str(&pad(indent));
            out.push(']');
        }
        JKind::Arr(v) => {
            out.push_str("[\n");
            for (i, e) in v.iter().enumerate() {
                out.push_str(&pad(indent + 2));
                write(e, indent + 2, indent + 3, false, out);
                out.push_str(if i + 1 < v.len() { ",\n" } else { "\n" });
            }
            out.push_str(&pad(indent));
            out.push(']');
        }
        JKind::Obj(m) => {
            out.push_str("{\n");
            let top = indent == 0 && expand;
            for (i, (k, _, e)) in m.iter().enumerate() {
                out.push_str(&pad(indent + 2));
                out.push_str(k);
                out.push_str(": ");
                let used = indent + 2 + k.chars().count() + 3;
                if top && *k == "\"nodes\"" {
                    write_nodes(e, indent + 2, out);
                } else {
                    write(e, indent + 2, used, false, out);
                }
                out.push_str(if i + 1 < m.len() { ",\n" } else { "\n" });
            }
            out.push_str(&pad(indent));
            out.push('}');
        }
    }
}

fn write_nodes(n: &JNode<'_>, indent: usize, out: &mut String) {
    let JKind::Arr(v) = &n.kind else {
        return write(n, indent, indent, false, out);
    };
    if v.is_empty() {
        out.push_str("[]");
        return;
    }
    out.push_str("[\n");
    for (i, e) in v.iter().enumerate() {
        out.push_str(&" ".repeat(indent + 2));
        write(e, indent + 2, indent + 2, true, out);
        out.push_str(if i + 1 < v.len() { ",\n" } else { "\n" });
    }
    out.push_str(&" ".repeat(indent));
    out.push(']');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_and_breaks_long_containers() {
        let text = r#"{"z":1,"a":[1,2,3],"nodes":[{"name":"x","v":"a\"b"}]}"#;
        let t = parse(text).unwrap();
        let p = pretty(&t);
        assert_eq!(
            p,
            "{\n  \"z\": 1,\n  \"a\": [1, 2, 3],\n  \"nodes\": [\n    {\n      \"name\": \"x\",\n      \"v\": \"a\\\"b\"\n    }\n  ]\n}\n"
        );
        let again = parse(&p).unwrap();
        assert_eq!(
            span_at(&p, again.get("nodes").unwrap().at(0).unwrap().start),
            Span::new(5, 5)
        );
    }
}
