//! HLO module text to a syntax tree: the module header, the source tables (`FileNames`,
//! `FunctionNames`, `FileLocations`, `StackFrames`), computations and their instructions.
//! Attributes are kept as tokens; [`super::lower`] reads the ones it needs.

use super::lex::{lex_line, Tok, Token};
use std::collections::HashMap;

/// A parse error: 1-based line and column, message, hint.
#[derive(Debug)]
pub(crate) struct PErr {
    pub line: usize,
    pub col: usize,
    pub message: String,
    pub hint: String,
}

pub(crate) fn perr(line: usize, col: usize, message: impl Into<String>, hint: &str) -> PErr {
    PErr {
        line,
        col,
        message: message.into(),
        hint: hint.to_string(),
    }
}

/// The shape of a value as HLO states it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Shape {
    /// `f32[8,16]{1,0}`: element type, dims, minor-to-major layout (when printed).
    Array {
        elem: String,
        dims: Vec<i64>,
        /// A dim printed as `<=N` or `?` (dynamic): such shapes are not modelled.
        dynamic: bool,
        layout: Option<Vec<i64>>,
    },
    /// `(f32[8], s32[])`.
    Tuple(Vec<Shape>),
}

/// `key=value` after an instruction's operands, the value as tokens.
#[derive(Clone, Debug)]
pub(crate) struct Attr {
    pub key: String,
    pub toks: Vec<Token>,
    pub col: usize,
}

/// One instruction: `[ROOT] name = shape opcode(operands), attrs`.
#[derive(Clone, Debug)]
pub(crate) struct Instr {
    pub name: String,
    pub shape: Shape,
    pub opcode: String,
    /// The tokens between the operand parentheses (a constant's literal, a parameter's number).
    pub inner: Vec<Token>,
    /// Operand names (for opcodes other than `constant` and `parameter`).
    pub operands: Vec<String>,
    pub attrs: Vec<Attr>,
    pub line: usize,
    pub col: usize,
}

impl Instr {
    pub(crate) fn attr(&self, key: &str) -> Option<&Attr> {
        self.attrs.iter().find(|a| a.key == key)
    }
}

/// A computation: a named list of instructions with a root.
#[derive(Clone, Debug)]
pub(crate) struct Computation {
    pub name: String,
    pub instrs: Vec<Instr>,
    pub root: usize,
    pub line: usize,
}

/// Where a stack frame points: file, line, function.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tables {
    pub files: HashMap<i64, String>,
    pub functions: HashMap<i64, String>,
    /// id -> (file id, function id, line)
    pub locations: HashMap<i64, (i64, i64, i64)>,
    /// id -> location id
    pub frames: HashMap<i64, i64>,
}

/// A parsed module.
#[derive(Clone, Debug)]
pub(crate) struct Module {
    pub name: String,
    pub computations: Vec<Computation>,
    pub entry: usize,
    pub tables: Tables,
    pub num_partitions: Option<i64>,
    pub replica_count: Option<i64>,
    /// Line accounting for `inspect`: lines turned into the module, lines with no content.
    pub lines_parsed: usize,
    pub lines_ignored: usize,
}

/// A cursor over one line's tokens.
pub(crate) struct Cur<'a> {
    pub toks: &'a [Token],
    pub pos: usize,
    pub line: usize,
    /// Column to report at the end of the line.
    pub end_col: usize,
}

impl<'a> Cur<'a> {
    pub(crate) fn new(toks: &'a [Token], line: usize, end_col: usize) -> Self {
        Cur {
            toks,
            pos: 0,
            line,
            end_col,
        }
    }
    pub(crate) fn peek(&self) -> Option<&'a Token> {
        self.toks.get(self.pos)
    }
    pub(crate) fn peek_at(&self, k: usize) -> Option<&'a Token> {
        self.toks.get(self.pos + k)
    }
    pub(crate) fn next(&mut self) -> Option<&'a Token> {
        let t = self.toks.get(self.pos);
        if t.is_some() {
            self.pos += 1;
        }
        t
    }
    pub(crate) fn col(&self) -> usize {
        self.peek().map_or(self.end_col, |t| t.col)
    }
    pub(crate) fn at_end(&self) -> bool {
        self.pos >= self.toks.len()
    }
    pub(crate) fn err(&self, expected: &str, hint: &str) -> PErr {
        let found = self
            .peek()
            .map_or("the end of the line".to_string(), Token::describe);
        perr(
            self.line,
            self.col(),
            format!("expected {expected}, found {found}"),
            hint,
        )
    }
    pub(crate) fn eat(&mut self, p: &str) -> bool {
        if self.peek().is_some_and(|t| t.is_punct(p)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    pub(crate) fn expect(&mut self, p: &str, hint: &str) -> Result<(), PErr> {
        if self.eat(p) {
            Ok(())
        } else {
            Err(self.err(&format!("`{p}`"), hint))
        }
    }
    pub(crate) fn word(&mut self, expected: &str, hint: &str) -> Result<&'a str, PErr> {
        match self.peek().and_then(Token::word) {
            Some(w) => {
                self.pos += 1;
                Ok(w)
            }
            None => Err(self.err(expected, hint)),
        }
    }
    pub(crate) fn int(&mut self, expected: &str, hint: &str) -> Result<i64, PErr> {
        match self
            .peek()
            .and_then(Token::word)
            .and_then(|w| w.parse().ok())
        {
            Some(v) => {
                self.pos += 1;
                Ok(v)
            }
            None => Err(self.err(expected, hint)),
        }
    }
    /// The tokens up to (not including) the next `,` or closing bracket at depth 0, or the end.
    pub(crate) fn until_comma(&mut self) -> Result<&'a [Token], PErr> {
        let start = self.pos;
        let mut depth: Vec<(&str, usize)> = Vec::new();
        while let Some(t) = self.peek() {
            match &t.tok {
                Tok::Punct(p @ ("(" | "{" | "[")) => depth.push((p, t.col)),
                Tok::Punct(p @ (")" | "}" | "]")) => {
                    let open = match *p {
                        ")" => "(",
                        "}" => "{",
                        _ => "[",
                    };
                    match depth.pop() {
                        Some((o, _)) if o == open => {}
                        Some((o, c)) => {
                            return Err(perr(
                                self.line,
                                t.col,
                                format!("`{p}` does not close the `{o}` at column {c}"),
                                "brackets must balance within an instruction's line",
                            ))
                        }
                        None => break,
                    }
                }
                Tok::Punct(",") if depth.is_empty() => break,
                _ => {}
            }
            self.pos += 1;
        }
        if let Some((o, c)) = depth.pop() {
            return Err(perr(
                self.line,
                c,
                format!("`{o}` is not closed on its line"),
                "XLA prints every instruction on one line; the text may be cut",
            ));
        }
        Ok(&self.toks[start..self.pos])
    }
}

const SHAPE_HINT: &str =
    "an HLO shape is an element type and dims with an optional layout, e.g. `f32[8,16]{1,0}`, or a tuple `(f32[8], s32[])`";

/// `f32[8,16]{1,0}` or a tuple of shapes.
pub(crate) fn parse_shape(c: &mut Cur) -> Result<Shape, PErr> {
    if c.eat("(") {
        let mut parts = Vec::new();
        if c.eat(")") {
            return Ok(Shape::Tuple(parts));
        }
        loop {
            parts.push(parse_shape(c)?);
            if c.eat(")") {
                return Ok(Shape::Tuple(parts));
            }
            c.expect(",", SHAPE_HINT)?;
        }
    }
    let elem = c.word("a shape (an element type such as `f32`)", SHAPE_HINT)?;
    c.expect("[", SHAPE_HINT)?;
    let mut dims = Vec::new();
    let mut dynamic = false;
    if !c.eat("]") {
        loop {
            if c.eat("<=") {
                dynamic = true;
            }
            if c.eat("?") {
                dynamic = true;
                dims.push(-1);
            } else {
                let d = c.int("a dimension size", SHAPE_HINT)?;
                if d < 0 {
                    return Err(perr(
                        c.line,
                        c.col(),
                        "a dimension size is negative",
                        SHAPE_HINT,
                    ));
                }
                dims.push(d);
            }
            if c.eat("]") {
                break;
            }
            c.expect(",", SHAPE_HINT)?;
        }
    }
    let mut layout = None;
    if c.peek().is_some_and(|t| t.is_punct("{")) {
        c.next();
        let mut l = Vec::new();
        loop {
            if c.eat("}") {
                break;
            }
            if c.eat(":") {
                // Tiling, memory space and the like: not needed for the values.
                let mut depth = 0usize;
                loop {
                    match c.next() {
                        None => return Err(c.err("`}` closing the layout", SHAPE_HINT)),
                        Some(t) if t.is_punct("(") => depth += 1,
                        Some(t) if t.is_punct(")") => depth = depth.saturating_sub(1),
                        Some(t) if t.is_punct("}") && depth == 0 => break,
                        _ => {}
                    }
                }
                break;
            }
            l.push(c.int("a layout dimension", SHAPE_HINT)?);
            if !c.eat(",") && !c.peek().is_some_and(|t| t.is_punct("}") || t.is_punct(":")) {
                return Err(c.err("`,` or `}` in the layout", SHAPE_HINT));
            }
        }
        layout = Some(l);
    }
    Ok(Shape::Array {
        elem: elem.to_string(),
        dims,
        dynamic,
        layout,
    })
}

const INSTR_HINT: &str =
    "an HLO instruction reads `[ROOT] name = shape opcode(operands), attribute=value, ...`";

fn parse_instr(toks: &[Token], line: usize, end_col: usize) -> Result<(Instr, bool), PErr> {
    let mut c = Cur::new(toks, line, end_col);
    let root = c.peek().and_then(Token::word) == Some("ROOT")
        && c.peek_at(1).is_some_and(|t| t.word().is_some());
    if root {
        c.next();
    }
    let col = c.col();
    let name = c.word("an instruction name", INSTR_HINT)?.to_string();
    c.expect("=", INSTR_HINT)?;
    let shape = parse_shape(&mut c)?;
    let opcode = c
        .word("an opcode (such as `add` or `dot`)", INSTR_HINT)?
        .to_string();
    c.expect("(", INSTR_HINT)?;
    let start = c.pos;
    let mut depth = 0usize;
    loop {
        match c.peek() {
            None => return Err(c.err("`)` closing the operands", INSTR_HINT)),
            Some(t) if t.is_punct("(") || t.is_punct("{") || t.is_punct("[") => depth += 1,
            Some(t) if t.is_punct(")") && depth == 0 => break,
            Some(t) if t.is_punct(")") || t.is_punct("}") || t.is_punct("]") => {
                depth = depth.saturating_sub(1)
            }
            _ => {}
        }
        c.next();
    }
    let inner = toks[start..c.pos].to_vec();
    c.next();
    let mut operands = Vec::new();
    if opcode != "constant" && opcode != "parameter" && !inner.is_empty() {
        let mut oc = Cur::new(&inner, line, c.col());
        loop {
            let piece = oc.until_comma()?;
            match piece.last() {
                Some(Token {
                    tok: Tok::Word(w), ..
                }) => operands.push(w.clone()),
                _ => {
                    return Err(perr(
                        line,
                        piece.first().map_or(oc.col(), |t| t.col),
                        "expected an operand name",
                        "operands are instruction names, optionally preceded by their shape: `%x` or `f32[8]{0} %x`",
                    ))
                }
            }
            if oc.at_end() {
                break;
            }
            oc.expect(",", INSTR_HINT)?;
        }
    }
    let mut attrs = Vec::new();
    while !c.at_end() {
        c.expect(",", INSTR_HINT)?;
        let acol = c.col();
        let key = c.word("an attribute name", INSTR_HINT)?.to_string();
        c.expect("=", "an attribute reads `name=value`")?;
        let value = c.until_comma()?;
        if value.is_empty() {
            return Err(c.err("an attribute value", "an attribute reads `name=value`"));
        }
        attrs.push(Attr {
            key,
            toks: value.to_vec(),
            col: acol,
        });
        if !c.at_end() && !c.peek().is_some_and(|t| t.is_punct(",")) {
            return Err(c.err("`,` before the next attribute", INSTR_HINT));
        }
    }
    Ok((
        Instr {
            name,
            shape,
            opcode,
            inner,
            operands,
            attrs,
            line,
            col,
        },
        root,
    ))
}

const TABLES: [&str; 4] = ["FileNames", "FunctionNames", "FileLocations", "StackFrames"];

fn parse_table_row(
    table: &str,
    toks: &[Token],
    line: usize,
    end_col: usize,
    t: &mut Tables,
) -> Result<(), PErr> {
    let hint = "a source table row reads `ID \"text\"` or `ID {key=value ...}`";
    let mut c = Cur::new(toks, line, end_col);
    let id = c.int("a row id", hint)?;
    if table == "FileNames" || table == "FunctionNames" {
        let s = match c.next() {
            Some(Token {
                tok: Tok::Str(s), ..
            }) => s.clone(),
            _ => return Err(perr(line, c.col(), "expected a quoted name", hint)),
        };
        if table == "FileNames" {
            t.files.insert(id, s);
        } else {
            t.functions.insert(id, s);
        }
        return Ok(());
    }
    c.expect("{", hint)?;
    let mut kv = HashMap::new();
    while !c.eat("}") {
        let k = c.word("a key", hint)?;
        c.expect("=", hint)?;
        let v = c.int("an integer", hint)?;
        kv.insert(k.to_string(), v);
    }
    let get = |k: &str| kv.get(k).copied().unwrap_or(0);
    if table == "FileLocations" {
        t.locations.insert(
            id,
            (get("file_name_id"), get("function_name_id"), get("line")),
        );
    } else {
        t.frames.insert(id, get("file_location_id"));
    }
    Ok(())
}

/// Parses a whole module.
pub(crate) fn parse_module(text: &str) -> Result<Module, PErr> {
    let mut m = Module {
        name: String::new(),
        computations: Vec::new(),
        entry: usize::MAX,
        tables: Tables::default(),
        num_partitions: None,
        replica_count: None,
        lines_parsed: 0,
        lines_ignored: 0,
    };
    let mut seen_header = false;
    let mut table: Option<&str> = None;
    let mut current: Option<(Computation, bool, Option<usize>)> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let toks = lex_line(raw)
            .map_err(|(col, msg)| perr(line, col, msg, "HLO text as XLA prints it is expected"))?;
        let end_col = raw.chars().count() + 1;
        if toks.is_empty() {
            m.lines_ignored += 1;
            table = None;
            continue;
        }
        if !seen_header {
            let mut c = Cur::new(&toks, line, end_col);
            if c.word("`HloModule`", "").ok() != Some("HloModule") {
                return Err(perr(
                    line,
                    toks[0].col,
                    format!("expected `HloModule`, found {}", toks[0].describe()),
                    "HLO module text starts with `HloModule NAME, ...` (as `as_text()` prints it)",
                ));
            }
            m.name = c
                .word("the module name", "the header reads `HloModule NAME, ...`")?
                .to_string();
            while !c.at_end() {
                c.expect(",", "header attributes are `, key=value`")?;
                let key = c.word("a header attribute", "header attributes are `, key=value`")?;
                c.expect("=", "header attributes are `, key=value`")?;
                let value = c.until_comma()?;
                let int = value
                    .first()
                    .and_then(Token::word)
                    .and_then(|w| w.parse().ok());
                match key {
                    "num_partitions" => m.num_partitions = int,
                    "replica_count" => m.replica_count = int,
                    _ => {}
                }
            }
            seen_header = true;
            m.lines_parsed += 1;
            continue;
        }
        let first = toks[0].word();
        if current.is_none() && toks.len() == 1 {
            if let Some(t) = first.and_then(|w| TABLES.iter().find(|t| **t == w)) {
                table = Some(t);
                m.lines_parsed += 1;
                continue;
            }
        }
        if let Some(t) = table {
            parse_table_row(t, &toks, line, end_col, &mut m.tables)?;
            m.lines_parsed += 1;
            continue;
        }
        match current.as_mut() {
            None => {
                // A computation header: `[ENTRY] name [(params)] [-> shape] {`.
                let hint = "a computation starts with `[ENTRY] name (params) -> shape {` and ends with `}`";
                let mut c = Cur::new(&toks, line, end_col);
                let entry = first == Some("ENTRY");
                if entry {
                    c.next();
                }
                let name = c.word("a computation name", hint)?.to_string();
                // Skip `-> shape` and anything else up to the final `{`.
                if !toks.last().is_some_and(|t| t.is_punct("{")) {
                    return Err(perr(
                        line,
                        end_col,
                        "expected `{` at the end of the computation header",
                        hint,
                    ));
                }
                current = Some((
                    Computation {
                        name,
                        instrs: Vec::new(),
                        root: usize::MAX,
                        line,
                    },
                    entry,
                    None,
                ));
                m.lines_parsed += 1;
            }
            Some((comp, entry, _)) if toks[0].is_punct("}") => {
                if comp.instrs.is_empty() {
                    return Err(perr(
                        line,
                        toks[0].col,
                        format!(
                            "computation `{}` has no instructions",
                            crate::excerpt(&comp.name)
                        ),
                        "every computation has at least its ROOT instruction",
                    ));
                }
                if comp.root == usize::MAX {
                    comp.root = comp.instrs.len() - 1;
                }
                if *entry {
                    if m.entry != usize::MAX {
                        return Err(perr(
                            line,
                            toks[0].col,
                            "a second ENTRY computation",
                            "a module has one ENTRY computation",
                        ));
                    }
                    m.entry = m.computations.len();
                }
                let (comp, _, _) = current.take().expect("matched Some");
                m.computations.push(comp);
                m.lines_parsed += 1;
            }
            Some((comp, _, _)) => {
                let (ins, root) = parse_instr(&toks, line, end_col)?;
                if root {
                    if comp.root != usize::MAX {
                        return Err(perr(
                            line,
                            toks[0].col,
                            "a second ROOT instruction in one computation",
                            "a computation has one ROOT",
                        ));
                    }
                    comp.root = comp.instrs.len();
                }
                comp.instrs.push(ins);
                m.lines_parsed += 1;
            }
        }
    }
    let last = text.lines().count().max(1);
    if !seen_header {
        return Err(perr(
            1,
            1,
            "expected `HloModule`, found an empty file",
            "HLO module text starts with `HloModule NAME, ...`",
        ));
    }
    if let Some((comp, _, _)) = current {
        return Err(perr(
            last,
            1,
            format!(
                "computation `{}` (line {}) is not closed",
                crate::excerpt(&comp.name),
                comp.line
            ),
            "a computation ends with a line holding `}`",
        ));
    }
    if m.entry == usize::MAX {
        return Err(perr(
            last,
            1,
            "the module has no ENTRY computation",
            "the computation the module runs is marked `ENTRY`",
        ));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_parse() {
        let text = "HloModule m, num_partitions=2\n\nFileNames\n1 \"/a.py\"\n\nr {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT c = f32[] add(a, b)\n}\n\nENTRY %main (p: f32[2]) -> f32[] {\n  %p = f32[2]{0} parameter(0), metadata={op_name=\"x\"}\n  %z = f32[] constant(0)\n  ROOT %s = f32[] reduce(f32[2]{0} %p, %z), dimensions={0}, to_apply=%r\n}\n";
        let m = parse_module(text).unwrap();
        assert_eq!(m.num_partitions, Some(2));
        assert_eq!(m.computations.len(), 2);
        assert_eq!(m.entry, 1);
        let e = &m.computations[1];
        assert_eq!(e.root, 2);
        assert_eq!(e.instrs[2].operands, ["p", "z"]);
        assert_eq!(
            e.instrs[2].attr("to_apply").unwrap().toks[0].word(),
            Some("r")
        );
        assert_eq!(m.tables.files[&1], "/a.py");
    }

    #[test]
    fn errors_are_located() {
        let e = parse_module("HloModule m\nENTRY e {\n  a = f32[2 parameter(0)\n}\n").unwrap_err();
        assert_eq!((e.line, e.col), (3, 13));
        assert!(e.message.contains("expected `,`"), "{}", e.message);
        let e = parse_module("Hlo m\n").unwrap_err();
        assert!(e.message.contains("HloModule"));
        let e =
            parse_module("HloModule m\nENTRY e {\n  ROOT a = f32[] parameter(0)\n").unwrap_err();
        assert!(e.message.contains("not closed"));
        let e = parse_module("HloModule m\nENTRY e {\n  a = f32[] add(x, y), k\n}\n").unwrap_err();
        assert!(e.message.contains("expected `=`"), "{}", e.message);
    }

    #[test]
    fn shapes_parse() {
        let toks = lex_line("(f32[8,16]{1,0:T(8,128)}, s32[], pred[<=4])").unwrap();
        let mut c = Cur::new(&toks, 1, 99);
        let s = parse_shape(&mut c).unwrap();
        let Shape::Tuple(parts) = s else { panic!() };
        assert!(matches!(&parts[0], Shape::Array { dims, .. } if dims == &[8, 16]));
        assert!(matches!(&parts[0], Shape::Array { layout: Some(l), .. } if l == &[1, 0]));
        assert!(matches!(&parts[2], Shape::Array { dynamic: true, .. }));
        assert!(c.at_end());
    }
}
