//! The tokenizer shared by clean expressions (`expr:`) and operator decompositions (`ops:`).

/// A token kind.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    /// A name, possibly dotted (`concat`, `r0.odd`, `aten.gelu.default`).
    Ident(String),
    Int(i64),
    Float(f64),
    /// `$i`.
    Arg(usize),
    /// A quoted string, `'sum'` (decompositions only).
    Str(String),
    LParen,
    RParen,
    LBrack,
    RBrack,
    Comma,
    End,
}

impl Tok {
    pub fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("`{}`", shardproof_import::excerpt(s)),
            Tok::Int(i) => format!("`{i}`"),
            Tok::Float(f) => format!("`{f}`"),
            Tok::Arg(i) => format!("`${i}`"),
            Tok::Str(s) => format!("`'{}'`", shardproof_import::excerpt(s)),
            Tok::LParen => "`(`".into(),
            Tok::RParen => "`)`".into(),
            Tok::LBrack => "`[`".into(),
            Tok::RBrack => "`]`".into(),
            Tok::Comma => "`,`".into(),
            Tok::End => "the end of the text".into(),
        }
    }
}

/// A token and its offset in chars from the start of the text.
#[derive(Clone, Debug)]
pub(crate) struct Token {
    pub tok: Tok,
    pub offset: usize,
}

/// A syntax error at a char offset.
#[derive(Clone, Debug)]
pub(crate) struct SyntaxError {
    pub offset: usize,
    pub message: String,
    pub hint: String,
}

impl SyntaxError {
    pub fn new(offset: usize, message: impl Into<String>, hint: impl Into<String>) -> Self {
        SyntaxError {
            offset,
            message: message.into(),
            hint: hint.into(),
        }
    }
}

/// Splits `text` into tokens; the last one is always `End`.
pub(crate) fn lex(text: &str) -> Result<Vec<Token>, SyntaxError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let start = i;
        let single = match c {
            '(' => Some(Tok::LParen),
            ')' => Some(Tok::RParen),
            '[' => Some(Tok::LBrack),
            ']' => Some(Tok::RBrack),
            ',' => Some(Tok::Comma),
            _ => None,
        };
        if let Some(tok) = single {
            out.push(Token { tok, offset: i });
            i += 1;
            continue;
        }
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if c == '$' {
            i += 1;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            let digits: String = chars[start + 1..i].iter().collect();
            let n = digits.parse::<usize>().map_err(|_| {
                SyntaxError::new(
                    start,
                    "`$` must be followed by an argument index",
                    "write `$0` for the first argument, `$1` for the second, ...",
                )
            })?;
            out.push(Token {
                tok: Tok::Arg(n),
                offset: start,
            });
            continue;
        }
        if c == '\'' {
            let end = chars[i + 1..]
                .iter()
                .position(|&d| d == '\'')
                .ok_or_else(|| {
                    SyntaxError::new(
                        start,
                        "this string has no closing quote",
                        "write strings in single quotes, e.g. `'sum'`",
                    )
                })?;
            out.push(Token {
                tok: Tok::Str(chars[i + 1..i + 1 + end].iter().collect()),
                offset: start,
            });
            i += end + 2;
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' {
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == '.')
            {
                i += 1;
            }
            out.push(Token {
                tok: Tok::Ident(chars[start..i].iter().collect()),
                offset: start,
            });
            continue;
        }
        let negative = c == '-';
        if c.is_ascii_digit() || ((negative || c == '+') && i + 1 < chars.len()) {
            i += 1;
            if negative && chars[i..].starts_with(&['i', 'n', 'f']) {
                i += 3;
                out.push(Token {
                    tok: Tok::Float(f64::NEG_INFINITY),
                    offset: start,
                });
                continue;
            }
            let mut is_float = false;
            while i < chars.len() {
                let d = chars[i];
                if d.is_ascii_digit() || d == '_' {
                    i += 1;
                } else if d == '.' || d == 'e' || d == 'E' {
                    is_float = true;
                    i += 1;
                    if (d == 'e' || d == 'E') && i < chars.len() && matches!(chars[i], '-' | '+') {
                        i += 1;
                    }
                } else {
                    break;
                }
            }
            let s: String = chars[start..i].iter().filter(|c| **c != '_').collect();
            let bad = || {
                SyntaxError::new(
                    start,
                    format!("`{s}` is not a number"),
                    "write integers like `3` or `-1` and floats like `0.5` or `1e-5`",
                )
            };
            let tok = if is_float {
                Tok::Float(s.parse().map_err(|_| bad())?)
            } else {
                Tok::Int(s.parse().map_err(|_| bad())?)
            };
            out.push(Token { tok, offset: start });
            continue;
        }
        return Err(SyntaxError::new(
            start,
            format!("unexpected character `{c}`"),
            "expressions are calls like `concat([r0.x, r1.x], 0)` over names, numbers and lists",
        ));
    }
    out.push(Token {
        tok: Tok::End,
        offset: chars.len(),
    });
    Ok(out)
}

/// A cursor over tokens with a nesting limit, so hostile input cannot exhaust the stack.
pub(crate) struct Cursor {
    toks: Vec<Token>,
    pos: usize,
    pub depth: usize,
}

/// Deeper nesting than any real expression; the parsers are recursive.
pub(crate) const MAX_NESTING: usize = 100;

impl Cursor {
    pub fn new(toks: Vec<Token>) -> Self {
        Cursor {
            toks,
            pos: 0,
            depth: 0,
        }
    }

    pub fn peek(&self) -> &Token {
        // `lex` always ends with `End`, and `next` never moves past it.
        &self.toks[self.pos.min(self.toks.len() - 1)]
    }

    pub fn next(&mut self) -> Token {
        let t = self.peek().clone();
        if t.tok != Tok::End {
            self.pos += 1;
        }
        t
    }

    /// Consumes `want` or fails with "expected {what}".
    pub fn expect(&mut self, want: &Tok, what: &str, hint: &str) -> Result<Token, SyntaxError> {
        let t = self.peek().clone();
        if &t.tok == want {
            self.pos += 1;
            Ok(t)
        } else {
            Err(SyntaxError::new(
                t.offset,
                format!("expected {what}, found {}", t.tok.describe()),
                hint,
            ))
        }
    }

    pub fn enter(&mut self, hint: &str) -> Result<(), SyntaxError> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return Err(SyntaxError::new(
                self.peek().offset,
                format!("the expression nests more than {MAX_NESTING} levels deep"),
                hint,
            ));
        }
        Ok(())
    }

    pub fn leave(&mut self) {
        self.depth -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_offsets() {
        let t = lex("concat([r0.x, $1], -1) 1.5e-3 -inf").unwrap();
        let kinds: Vec<Tok> = t.iter().map(|t| t.tok.clone()).collect();
        assert_eq!(
            kinds,
            vec![
                Tok::Ident("concat".into()),
                Tok::LParen,
                Tok::LBrack,
                Tok::Ident("r0.x".into()),
                Tok::Comma,
                Tok::Arg(1),
                Tok::RBrack,
                Tok::Comma,
                Tok::Int(-1),
                Tok::RParen,
                Tok::Float(1.5e-3),
                Tok::Float(f64::NEG_INFINITY),
                Tok::End,
            ]
        );
        assert_eq!(t[3].offset, 8);
        assert!(lex("a ; b").is_err());
        assert!(lex("$").is_err());
        assert!(lex("-").is_err());
    }
}
